"""tests/live/canary.py (make canary): what it says when npm cannot name a
newest Claude Code or names the pinned one, and how it reads pytest's
report of the live checks. Its live run itself is make canary's."""
import os
import subprocess
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "live"))

import canary  # noqa: E402
from releases import PINNED  # noqa: E402

posix_only = pytest.mark.skipif(os.name == "nt", reason="the stand-in npm is a #! script")


def fake_npm(tmp_path, monkeypatch, script):
    folder = tmp_path / "bin"
    folder.mkdir()
    npm = folder / "npm"
    npm.write_text("#!/bin/sh\n" + script)
    npm.chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))


@posix_only
def test_npms_newest_being_the_pinned_release_is_said_in_one_line_and_is_no_failure(tmp_path, monkeypatch, capsys):
    fake_npm(tmp_path, monkeypatch, f"echo {PINNED}\n")
    assert canary.main([]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"canary: Claude Code {PINNED}, npm's newest, is already the pinned one (make plugin-check checks it): nothing new to check"]


@posix_only
def test_npm_failing_to_name_the_newest_release_fails_with_npms_own_words(tmp_path, monkeypatch, capsys):
    fake_npm(tmp_path, monkeypatch, "echo 'npm error code E404' >&2\nexit 1\n")
    assert canary.main([]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"canary: no newest Claude Code to check: npm view {canary.PACKAGE} version: npm error code E404"]


def test_no_npm_at_all_fails_saying_npm_is_needed(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert canary.main([]) == 1
    assert "npm is needed" in capsys.readouterr().out


def test_the_report_names_each_failed_or_erring_check_once_without_its_release_and_counts_those_run(tmp_path):
    (tmp_path / "test_live.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.fixture(params=["9.9.9"])
        def release(request):
            return request.param

        @pytest.fixture
        def broken():
            raise RuntimeError("no session")

        def test_passes(release):
            pass

        def test_fails(release):
            assert False

        def test_errs(release, broken):
            pass
    """))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(tmp_path / "pytest.ini"),
                    str(tmp_path / "test_live.py"), f"--junitxml={report}"],
                   cwd=str(tmp_path), capture_output=True, timeout=120)
    assert canary.failures(str(report)) == (["test_fails", "test_errs"], 3)
