"""hooks/lich_launch.py and bin/: the tools start in the daemon's
interpreter, or say in one line what to do, or what the setup is doing."""
import json
import os
import subprocess
import sys

import pytest

import lich_control
from setup_plugin import ROOT, SCRIPT, WINDOWS, write

import lich_children  # noqa: I100 (from the hooks folder setup_plugin puts on the path)
import lich_launch as launch
import lich_runtime as runtime


def test_a_tool_finds_the_private_environment_in_claude_codes_data_folders(tmp_path, monkeypatch):
    config = tmp_path / "claude"
    mine = config / "plugins" / "data" / "lich-control-lich-control"
    other = config / "plugins" / "data" / "lich-control-inline"
    for folder, python, root in [(mine, tmp_path / "a" / "python", launch.PLUGIN_ROOT),
                                 (other, tmp_path / "b" / "python", "/elsewhere")]:
        write(str(python), "")
        write(str(folder / runtime.CURRENT), json.dumps({"python": str(python), "root": root}))
    os.utime(str(other / runtime.CURRENT), (2_000_000_000, 2_000_000_000))  # newer, but another folder's
    environ = {"CLAUDE_CONFIG_DIR": str(config)}
    assert launch.private_python(environ) == str(tmp_path / "a" / "python")
    (tmp_path / "a" / "python").unlink()
    assert launch.private_python(environ) == str(tmp_path / "b" / "python")
    assert launch.private_python({"CLAUDE_CONFIG_DIR": str(tmp_path / "none")}) is None


def run_tool(tmp_path, tool, *args, **lich):
    """bin/`tool` in a shell with no environment built anywhere (no interpreter named, no data
    folder), started by a Python that cannot import attrs (-S), as the system's python3 is."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("LICH_", "CLAUDE_")) and name != launch.REEXEC_GUARD}
    env.update(CLAUDE_CONFIG_DIR=str(tmp_path / "claude"), LICH_CONTROL_RUN_DIR=str(tmp_path / "run"), **lich)
    return subprocess.run([sys.executable, "-S", os.path.join(ROOT, "bin", tool), *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, env=env, timeout=60)


@pytest.fixture
def named(tmp_path):
    """An interpreter that has lich-control, as the relay names one."""
    if WINDOWS:  # a batch file, which Windows runs by its name as it runs a program
        named = tmp_path / "python.bat"
        named.write_text('@"{}" %*\n'.format(sys.executable))
        return str(named)
    named = tmp_path / "python"
    named.write_text('#!/bin/sh\nexec "{}" "$@"\n'.format(sys.executable))
    named.chmod(0o755)
    return str(named)


def test_a_tool_runs_in_the_interpreter_the_relay_named(tmp_path, named):
    result = run_tool(tmp_path, "lich-mod-status", "--json", LICH_CONTROL_PYTHON=named)
    assert json.loads(result.stdout) == {"run_dir": str(tmp_path / "run"), "daemons": [], "setups": []}, result.stderr


@pytest.mark.parametrize("option, said", [("--version", lich_control.__version__ + "\n"), ("--help", "usage: lich-mod-daemon")])
def test_the_daemon_outside_lich_answers_what_it_is_asked_about_itself(tmp_path, named, option, said):
    result = run_tool(tmp_path, "lich-mod-daemon", option, LICH_CONTROL_PYTHON=named)
    assert result.returncode == 0 and result.stdout.startswith(said), result.stderr


LICH = {"LICH_PORT": "4100", "LICH_TOKEN": "secret-token", "LICH_SESSION_ID": "card-1"}


@pytest.mark.parametrize("unset", sorted(LICH))
def test_the_daemon_outside_lich_with_no_environment_exits_0_and_says_nothing(tmp_path, unset):
    result = run_tool(tmp_path, "lich-mod-daemon", **dict(LICH, **{unset: ""}))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@pytest.mark.parametrize("tool", ["lich-mod-daemon", "lich-mod-status"])
def test_a_tool_with_no_environment_says_in_one_line_what_to_do(tmp_path, tool):
    result = run_tool(tmp_path, tool, **LICH)
    assert (result.returncode, result.stdout) == (1, "")
    [line] = result.stderr.splitlines()
    assert line.startswith(tool + ": lich-control's Python environment is not built yet (no attrs here)")
    assert "{} --data".format(SCRIPT) in line
    assert "secret-token" not in result.stderr


@pytest.fixture
def kept(tmp_path):
    """A data folder where Claude Code keeps one, as the bin/ tools look for it."""
    folder = tmp_path / "claude" / "plugins" / "data" / "lich-control-lich-control"
    folder.mkdir(parents=True)
    return str(folder)


def test_a_setup_is_told_as_running_while_its_lock_is_held_and_as_failed_with_the_command_after(kept, tmp_path):
    environ = {"CLAUDE_CONFIG_DIR": str(tmp_path / "claude")}
    write(os.path.join(kept, runtime.RUNNING), json.dumps({"pid": 4242, "started": 0, "key": "0.1.0-x"}))
    assert launch.setup_states(environ) == []  # its build is gone: no lock held
    with lich_children.Lock(os.path.join(kept, runtime.LOCK), print):
        [state] = launch.setup_states(environ)
    assert (state["data"], state["state"]) == (kept, "running")
    line = state["text"]
    assert line.startswith("a setup of lich-control's Python environment is running in {} (since ".format(kept))
    assert line.endswith(", pid 4242); the daemon starts when it is done")
    write(os.path.join(kept, runtime.FAILURE), json.dumps({"key": "0.1.0-x", "at": 0, "error": "python3 has no venv module"}))
    [state] = launch.setup_states(environ)
    assert state["state"] == "failed"
    line = state["text"]
    assert " failed at " in line
    assert line.endswith(": python3 has no venv module. To try again: " + runtime.retry_command(kept))


def test_the_status_tool_with_no_environment_says_a_setup_is_running(kept, tmp_path):
    write(os.path.join(kept, runtime.RUNNING), json.dumps({"pid": 4242, "started": 0, "key": "0.1.0-x"}))
    with lich_children.Lock(os.path.join(kept, runtime.LOCK), print):
        result = run_tool(tmp_path, "lich-mod-status")
    assert result.returncode == 0
    assert result.stdout.startswith("a setup of lich-control's Python environment is running in ")


def test_the_status_tool_with_no_environment_names_the_failure_and_the_command(kept, tmp_path):
    write(os.path.join(kept, runtime.FAILURE), json.dumps({"key": "0.1.0-x", "at": 0, "error": "python3 has no venv module"}))
    result = run_tool(tmp_path, "lich-mod-status")
    assert result.returncode == 1
    [line] = result.stdout.splitlines()
    assert "failed at" in line and "python3 has no venv module" in line
    assert line.endswith("To try again: {} {} --data {}".format(sys.executable, SCRIPT, kept))

