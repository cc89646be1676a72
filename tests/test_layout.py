"""The layout the architecture page describes: the daemon imports none of the
tools, carries no HTTP parser of its own, and keeps its files short."""
import glob
import os
import re
import subprocess
import sys

from lich_control.dev.procs import ROOT

PACKAGE = os.path.join(ROOT, "lich_control")


def modules_loaded_by(statement):
    code = f"import sys; {statement}; print('\\n'.join(sorted(m for m in sys.modules if m.startswith(('lich_control', 'requests')))))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_daemon_and_the_status_command_import_none_of_the_tools():
    for entry in ("import lich_control.daemon", "import lich_control.status_cli"):
        loaded = modules_loaded_by(entry)
        assert "lich_control.lich" in loaded or entry.endswith("status_cli")
        assert [m for m in loaded if m.startswith(("lich_control.dev", "lich_control.bench"))] == [], entry


def test_lich_mod_status_does_without_requests():
    # Only the daemon talks to lich: the status command pays no ~70 ms import for it.
    assert "requests" not in modules_loaded_by("import lich_control.status_cli")


def test_no_module_of_the_daemon_or_the_benchmark_parses_http_by_hand():
    # A chunk size read in hex, or a status line taken apart: a library's job.
    hand_parsing = re.compile(r"\bint\(.*,\s*16\)|startswith\(b[\"']HTTP/1\.")
    files = glob.glob(os.path.join(PACKAGE, "*.py")) + glob.glob(os.path.join(PACKAGE, "bench", "*.py"))
    found = [path for path in files if hand_parsing.search(open(path, encoding="utf-8").read())]
    assert found == []


def test_no_module_of_the_daemon_or_the_benchmark_is_over_400_lines():
    files = glob.glob(os.path.join(PACKAGE, "*.py")) + glob.glob(os.path.join(PACKAGE, "bench", "*.py"))
    long = {os.path.relpath(path, ROOT): n for path in files if (n := sum(1 for _ in open(path, encoding="utf-8"))) > 400}
    assert long == {}
