"""The documentation's links between its own pages: each names a file that
is there and, after a `#`, a heading of that file, as GitHub makes anchors
of headings (lower case, punctuation gone, spaces as hyphens). And the
package's pointers into the docs, `docs/<page>.md, "<heading>"`, each name a
heading as it is written."""
import glob
import os
import re

import pytest

from lich_dev.procs import ROOT

PAGES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page):
    with open(page, encoding="utf-8") as f:
        headings = [line.lstrip("#").strip() for line in f if re.match(r"#{1,6} ", line)]
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def links():
    for page in PAGES:
        with open(page, encoding="utf-8") as f:
            for target in LINK.findall(f.read()):
                if not re.match(r"[a-z]+:", target):
                    yield os.path.relpath(page, ROOT), target


@pytest.mark.parametrize("page, target", list(links()))
def test_a_link_to_a_page_of_ours_finds_the_page_and_its_heading(page, target):
    path, _, anchor = target.partition("#")
    linked = os.path.normpath(os.path.join(ROOT, os.path.dirname(page), path)) if path else os.path.join(ROOT, page)
    assert os.path.exists(linked), f"{page}: {target} names no file"
    if anchor:
        assert anchor in anchors(linked), f"{page}: {target} names no heading of {os.path.relpath(linked, ROOT)}"


def headings(page):
    with open(page, encoding="utf-8") as f:
        return {line.lstrip("#").strip() for line in f if re.match(r"#{1,6} ", line)}


def code_pointers():
    """Each `docs/<page>.md, "<heading>"` a module of the package points to."""
    pointer = re.compile(r'(docs/[\w-]+\.md),\s+"([^"]+)"')
    for module in sorted(glob.glob(os.path.join(ROOT, "lich_control", "*.py"))):
        with open(module, encoding="utf-8") as f:
            for page, heading in pointer.findall(f.read()):
                yield os.path.basename(module), page, " ".join(heading.split())


@pytest.mark.parametrize("module, page, heading", list(code_pointers()))
def test_a_module_pointing_to_a_section_of_the_docs_names_a_heading_that_is_there(module, page, heading):
    assert heading in headings(os.path.join(ROOT, page)), f"{module}: {page} has no heading {heading!r}"
