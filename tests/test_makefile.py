"""The Makefile's targets a person runs by hand, run as they would be, in a
git working copy of the plugin: make plugin-install, with a Claude Code that
records what it was asked."""
import os
import shutil
import subprocess

import pytest

from lich_dev.procs import ROOT

pytestmark = pytest.mark.skipif(os.name == "nt", reason="make plugin-install is POSIX's (make, sh, a #! stand-in for claude)")

FAKE_CLAUDE = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/asked"
"""


@pytest.fixture
def clone(tmp_path):
    """A git working copy of the plugin's files (the checkout itself may be
    none: CI's unprivileged run has a copy), all committed, nothing changed since."""
    folder = tmp_path / "clone"
    folder.mkdir()
    for name in ("Makefile", "README.md", ".claude-plugin", "hooks"):
        source = os.path.join(ROOT, name)
        (shutil.copytree if os.path.isdir(source) else shutil.copy)(source, str(folder / name))
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "the plugin"]):
        subprocess.run(git + args, cwd=str(folder), check=True, timeout=60)
    return str(folder)


def make(clone, tmp_path, *args, path=None):
    env = dict(os.environ, HOME=str(tmp_path / "home"), MAKEFLAGS="")
    if path is not None:
        env["PATH"] = path
    return subprocess.run([shutil.which("make"), "-s", "plugin-install", *args], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=120)


def test_plugin_install_copies_a_clone_git_sees_as_changed_by_its_timestamps_alone(clone, tmp_path):
    os.utime(os.path.join(clone, "README.md"), (1_000_000_000, 1_000_000_000))
    claude = tmp_path / "bin" / "claude"
    claude.parent.mkdir()
    claude.write_text(FAKE_CLAUDE)
    claude.chmod(0o755)
    home = tmp_path / "home" / ".local" / "share" / "lich-control" / "plugin"
    done = make(clone, tmp_path, f"CLAUDE={claude}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (home / "hooks" / "mod-control.js").is_file() and (home / ".claude-plugin" / "plugin.json").is_file()
    assert (tmp_path / "bin" / "asked").read_text().splitlines() == [
        f"plugin marketplace add {home}", "plugin install lich-control@lich-control"]


def test_plugin_install_without_claude_on_the_path_says_so_and_copies_nothing(clone, tmp_path):
    # A PATH with nothing on it: make runs its recipes with /bin/sh, and the first stops.
    (tmp_path / "nothing").mkdir()
    done = make(clone, tmp_path, path=str(tmp_path / "nothing"))
    assert done.returncode != 0
    assert "make plugin-install: no claude on PATH; install Claude Code, or name it" in done.stderr
    assert not (tmp_path / "home").exists()
