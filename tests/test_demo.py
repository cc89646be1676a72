"""The demo, run as `make demo` runs it: it must pass, show every kind's
outcome, and leave no process or file behind."""
import os
import re
import subprocess
import sys

import pytest

from lich_dev.procs import ROOT, daemon_env


def test_the_demo_passes_shows_every_kind_and_leaves_nothing_behind():
    env = daemon_env(PYTHONIOENCODING="utf-8")  # its arrows, on Windows too
    # Its own session: the demo and its daemon share this process group.
    proc = subprocess.Popen([sys.executable, "-m", "lich_dev.demo"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, encoding="utf-8", start_new_session=True)
    group = proc.pid
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(group, 9) if os.name != "nt" else proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "demo passed" in out
    for outcome in (
        r"← k\d+ model ok",
        r"← k\d+ effort ok",
        r"← k\d+ prompt ok",
        r"as the user, a task notification",
        r"← k\d+ command ok",
        r"← k\d+ ask ok: .\(simulated\)",
        r"← k\d+ ask failed: api-error 529 overloaded",
        r"← k\d+ abort ok",
        r"← k\d+ effort failed: unknown effort",
        r"← k\d+ abort failed: no turn is running",
        r"← k\d+ prompt failed: a plugin dropped it",
        r"← k\d+ rewind failed: unknown kind",
        r"session: turn t\d+ aborted",
        r"SESSION +PID +STATE",
    ):
        assert re.search(outcome, out), f"no line matching {outcome!r} in:\n{out}"
    daemon = int(re.search(r"daemon pid (\d+)", out).group(1))
    run_dir = re.search(r"socket +(\S+)[/\\]demo\.(sock|address)", out).group(1)
    # Nothing is left in the group, the daemon is gone, its folder removed.
    if os.name == "nt":  # no process groups; os.kill would end the process it asks about
        from lich_control import windows

        assert windows.Process(daemon).ended(0)
    else:
        with pytest.raises(ProcessLookupError):
            os.killpg(group, 0)
        with pytest.raises(ProcessLookupError):
            os.kill(daemon, 0)
    assert not os.path.exists(run_dir)
