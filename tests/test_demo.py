"""The demo, run as `make demo` runs it: it must pass, show every kind's
outcome, and leave no process or file behind."""
import importlib.util
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


@pytest.mark.skipif(importlib.util.find_spec("venv") is None, reason="this Python has no venv module (Windows's embeddable package)")
def test_the_lines_make_run_prints_work_as_printed_where_python3_has_no_attrs(tmp_path):
    # The other terminal's python3: the standard library alone.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True, timeout=120)
    proc = subprocess.Popen([sys.executable, "-m", "lich_dev.demo", "--run"], cwd=ROOT, env=daemon_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        lines = []
        for line in proc.stdout:
            if line.startswith("In another terminal"):
                lines = [next(proc.stdout).strip() for _ in range(6)]
                break
        assert lines[0].startswith("cd "), lines
        env = {name: value for name, value in daemon_env().items() if name != "PYTHONPATH"}
        env["PATH"] = os.pathsep.join([str(tmp_path / "bare" / "bin"), env.get("PATH", "")])
        for line in lines[2:]:
            done = subprocess.run(["bash", "-c", "\n".join(lines[:2] + [line])], cwd=str(tmp_path), env=env,
                                  capture_output=True, text=True, timeout=60)
            assert "Traceback" not in done.stderr and "No module named" not in done.stderr, (line, done.stderr)
            # The abort finds the prompt's turn running, or already over: an ack either way.
            assert done.returncode == 0 or (" abort" in line and "no turn is running" in done.stdout + done.stderr), (
                line, done.stdout, done.stderr)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)
        proc.stdout.close()
