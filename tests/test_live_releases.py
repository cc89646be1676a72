"""tests/live/releases.py: the table docs/install.md shows ("Which Claude
Code") is the one written from its TABLE, and TABLE agrees with the
releases the live test runs on and what it expects of each."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "live"))

import releases  # noqa: E402
from releases import TABLE, Release  # noqa: E402


def test_the_table_in_the_docs_is_the_one_written_from_the_measured_list():
    with open(releases.DOC, encoding="utf-8") as f:
        doc = f.read()
    assert releases.with_table(doc) == doc, "docs/install.md's release table is not tests/live/releases.py's TABLE: run make release-table"


def test_a_document_without_the_markers_is_refused_by_name():
    with pytest.raises(ValueError, match="for the table to go between"):
        releases.with_table("# Which Claude Code\n\n| a | b |\n")


def test_each_measured_release_is_in_its_rows_range_and_runs_the_mod_as_the_live_test_expects():
    for row in TABLE:
        for version in row.measured:
            assert row.covers(version), f"{version} is measured in the row of {row.releases}"
            assert Release(version, "").runs_mods == row.runs_mod, f"{version}: the row and Release.runs_mods disagree"


def test_the_rows_are_newest_first_and_do_not_overlap():
    for newer, older in zip(TABLE, TABLE[1:]):
        assert older.last is not None and releases.key(older.last) < releases.key(newer.first), (newer.releases, older.releases)


def test_every_release_the_live_test_runs_on_by_default_is_a_measured_one():
    measured = {version for row in TABLE for version in row.measured}
    ran = {releases.PINNED, *releases.SESSION_RELEASES, *releases.DEGRADE_RELEASES,
           *releases.INSTALL_RELEASES, *releases.REFUSING_RELEASES}
    assert ran <= measured, sorted(ran - measured)


def test_a_rows_releases_read_as_a_range_a_pair_one_release_or_an_open_end():
    assert [row.releases for row in TABLE][:3] == ["2.1.326 and later", "2.1.288 to 2.1.325", "2.1.286 and 2.1.287"]
    assert TABLE[-1].releases == "2.1.200"


def test_the_pinned_release_is_named_so_in_its_row():
    pinned_row = next(row for row in TABLE if row.covers(releases.PINNED))
    assert f"{releases.PINNED} (the pinned one)" in pinned_row.measured_on()
