"""The development lich's command line (lich_dev/cli.py): `lich-stub control`
and `ask` run as subprocesses through a real daemon on the simulated session,
and `serve`.

The lich is in-process with its runtime file in the test's run folder, as
`lich-stub serve` would write it; the daemon's turns last 60 s so a turn
stays open until the test aborts it.
"""
import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from lich_dev import procs
from lich_dev.cli import RUNTIME_NAME, describe_failure, write_runtime
from lich_dev.lich import StubLich
from lich_dev.state import DELIVERED, ENDED, WITHDRAWN, Outcome
from lich_dev.procs import ROOT
from relay import Relay

WAIT = 10.0


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("cli"))
    with StubLich() as lich:
        write_runtime(os.path.join(run_dir, RUNTIME_NAME), lich.port, lich.token)
        env = {
            "LICH_PORT": str(lich.port),
            "LICH_TOKEN": lich.token,
            "LICH_SESSION_ID": "s1",
            "LICH_CONTROL_RUN_DIR": run_dir,
            "LICH_SIM_TURN_SECONDS": "60",
            "LICH_SIM_FORK_SECONDS": "0.05",
        }
        daemon = Relay(env, module="lich_dev.sim")
        try:
            assert lich.wait_polled("s1", WAIT), daemon.stderr_lines
            yield lich, run_dir
        finally:
            daemon.stop()


def cli(run_dir, *args):
    env = procs.daemon_env(LICH_CONTROL_RUN_DIR=run_dir)
    return subprocess.run([sys.executable, "-m", "lich_dev.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)


def no_token(lich, *done):
    for result in done:
        assert lich.token not in result.stdout + result.stderr + " ".join(result.args)


def test_control_prompt_prints_the_ok_outcome_and_exits_0(world):
    lich, run_dir = world
    done = cli(run_dir, "control", "s1", "prompt", "run", "the", "tests")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok: prompt k") and "acked in" in done.stdout
    assert cli(run_dir, "control", "s1", "abort").returncode == 0
    no_token(lich, done)


def test_ask_prints_the_answer_alone(world):
    lich, run_dir = world
    done = cli(run_dir, "ask", "s1", "what", "are", "you", "doing?")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "(simulated) Right now I am working on nothing: the session is idle.\n"
    assert done.stderr == ""


def test_a_failed_ack_exits_1_with_one_line_and_json_gives_one_json_line(world):
    lich, run_dir = world
    done = cli(run_dir, "control", "s1", "effort", "turbo", "--json")
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert doc["ok"] is False and doc["ack"]["error"] == "unknown effort" and doc["kind"] == "effort"
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("lich-stub: effort k") and done.stderr.rstrip().endswith("failed: unknown effort")
    no_token(lich, done)


def test_a_command_behind_a_running_turn_is_reported_delivered_but_not_acked(world):
    lich, run_dir = world
    assert cli(run_dir, "control", "s1", "prompt", "busy").returncode == 0
    try:
        done = cli(run_dir, "control", "s1", "command", "compact", "keep", "it", "--timeout", "0.5")
        assert done.returncode == 1
        assert "was delivered but not acked within 0.5 s" in done.stderr
    finally:
        assert cli(run_dir, "control", "s1", "abort").returncode == 0


def test_a_refusal_is_one_line_in_lichs_words_naming_what_to_check(world):
    lich, run_dir = world
    done = cli(run_dir, "control", "nobody", "abort")
    assert done.returncode == 1
    assert done.stderr.startswith("lich-stub: session nobody cannot take commands: no mod has ever polled for it.")
    assert "LICH_SESSION_ID=nobody" in done.stderr
    no_token(lich, done)
    done = cli(run_dir, "control", "s1", "command", "//Model", "opus")
    assert done.returncode == 1
    assert done.stderr.startswith("lich-stub: /model is refused as a command: Claude Code saves what it sets as the default")


def test_the_options_name_the_stub_when_no_runtime_file_does(world, tmp_path):
    lich, _ = world
    done = cli(str(tmp_path), "control", "--port", str(lich.port), "--token", lich.token, "s1", "model", "sim-opus")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "state, said",
    [
        (WITHDRAWN, "no poll took abort k9 within 2 s, so it was withdrawn and will not run: is the mod for s1 still polling?"),
        (DELIVERED, "abort k9 was delivered but not acked within 2 s"),
        (ENDED, "abort k9 was not acked: the stub stopped first"),
    ],
)
def test_an_unacked_outcome_is_one_line_that_says_what_became_of_it(state, said):
    outcome = Outcome(id="k9", kind="abort", session_id="s1", state=state, delivered=state != WITHDRAWN)
    assert describe_failure(outcome, 2.0) == said


def test_without_a_running_serve_control_says_how_to_start_one(tmp_path):
    done = cli(str(tmp_path), "control", "s1", "abort")
    assert done.returncode == 1
    assert "no lich-stub serve is running" in done.stderr


def test_serve_writes_a_private_runtime_file_warns_once_per_release_and_cleans_up_when_stopped(tmp_path):
    env = procs.daemon_env(LICH_CONTROL_RUN_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "lich_dev.cli", "serve", "--hold", "0"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with ThreadPoolExecutor(1) as reader:
        try:
            banner = reader.submit(proc.stdout.readline).result(WAIT)  # once it listens, its file is written
            path = tmp_path / RUNTIME_NAME
            doc = json.loads(path.read_text())
            assert f"listening on 127.0.0.1:{doc['port']} " in banner and doc["token"] not in banner
            assert oct(path.stat().st_mode & 0o777) == "0o600" or os.name == "nt"  # no mode bits there
            with requests.Session() as http:
                for plugin in ("0.1.0", "0.1.0", "0.16.0"):
                    url = f"http://127.0.0.1:{doc['port']}/mod/commands"
                    assert http.get(url, params={"token": doc["token"], "session_id": "s1"}, headers={"X-Lich-Plugin": plugin}, timeout=WAIT).json() == []
            warning = reader.submit(proc.stderr.readline).result(WAIT)
            assert warning.startswith("lich-stub: session s1: its mod names plugin release 0.1.0 in X-Lich-Plugin, outside the range")
            if os.name == "nt":
                return  # no signal it could catch there (Wine has no console for CTRL_BREAK): the stop is a kill
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(WAIT) == 0 and not path.exists()
            assert proc.stderr.read() == ""  # once: the repeat and the release in range said nothing
        finally:
            procs.stop(proc)  # a read still waiting ends with the process's streams
            proc.stdout.close()
            proc.stderr.close()
