"""lich drives a live, interactive Windows Claude Code session under Wine:
every command kind, acked, and the python option stored as /config stores
it running the daemon of the reload it causes; and, before it, a first
session whose relay finds Python and builds the daemon's environment itself.

The Claude Code live test's world (claude_world.py), with Windows programs
in it: the Windows claude.exe under Wine in the pseudo-terminal, the plugin
loaded with --plugin-dir, the daemon run by Windows Python (the plugin's
python option; in the first session, from the environment the setup
built), and lich-mod-status run by Windows Python too. The
development lich and the fake model API are the Linux ones on loopback, as
lich on the same machine would be: the session reaches them over 127.0.0.1.

Run by .ci/windows-checks, which sets Wine up (.ci/wine-setup) and starts
the wineserver first (a wineserver started from here would join the test's
processes and outlive them):

    python -m pytest -c tests/live/pytest.ini tests/live/windows_session.py

Not named test_*.py: `make plugin-check`'s run of tests/live, which has no
Wine, does not collect it. The tests are the steps of one session, in file
order: run the module whole.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from typing import List, Optional

import pytest

from claude_world import ClaudeSession, World
from devlich import Unavailable
from test_session import (CUSTOM_COMMAND, assert_acked_ok, assert_answered, check_abort, check_effort_override, check_model_override,
                          furnish, main_request, send)
from workspace import CHECKOUT, PLUGIN_NAME, python_option

SESSION = "win-1"
FIRST_SESSION = "win-setup"
# The first session's setup: a virtual environment, and pip under Wine
# installing requests and attrs from PyPI.
SETUP_WAIT = 300.0
# Wine's claude.exe takes 7 to 13 s to start on this machine class, and each
# step a few seconds more than on Linux: the waits are wider.
WAIT = 45.0
WINE_VARIABLES = ("WINEPREFIX", "WINEDEBUG", "WINEDLLOVERRIDES", "WINEARCH")


def windows_path(path: str) -> str:
    """A Linux path as a Windows program under Wine names it (Wine's Z: drive is /)."""
    return "Z:" + os.path.abspath(path).replace("/", "\\")


def wine_program(variable: str) -> str:
    """A Windows program .ci/wine-setup installed (its Linux path)."""
    path = os.environ.get(variable)
    if not path or not os.path.isfile(path):
        raise Unavailable(f"{variable} names no Windows program ({path!r}): run under .ci/windows-checks, "
                          "or source the file .ci/wine-setup prints")
    return path


def windows_mod_status(windows_python: str, run_dir: str) -> dict:
    """The Windows `lich-mod-status --json` (bin/lich-mod-status under Windows Python) on the run folder."""
    env = {name: os.environ[name] for name in (*WINE_VARIABLES, "PATH", "HOME") if name in os.environ}
    env["LICH_CONTROL_RUN_DIR"] = windows_path(run_dir)
    done = subprocess.run(["wine", windows_python, windows_path(os.path.join(CHECKOUT, "bin", "lich-mod-status")), "--json"],
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"the Windows lich-mod-status --json printed no JSON (exit {done.returncode}): "
                             f"{done.stderr.strip()[-1500:]!r}") from None


class WindowsSession(ClaudeSession):
    """The Windows Claude Code in the pseudo-terminal, under Wine; its
    daemon's status from the Windows lich-mod-status."""

    POLL_WAIT = 120.0
    IDLE_WAIT = WAIT
    EXIT_WAIT = WAIT

    def __init__(self, world: "WindowsWorld", session_id: str, plugin_dir: str, env=None):
        self.world = world
        super().__init__(world, session_id, plugin_dir, env=env)

    def status(self) -> Optional[dict]:
        for entry in self.world.mod_status().get("daemons", []):
            if entry.get("session_id") == self.session_id:
                return entry.get("status")
        return None


class WindowsWorld(World):
    """Claude Code's live world with claude.exe and python.exe under Wine."""

    def __init__(self):
        self.windows_python = wine_program("WIN_PYTHON")
        super().__init__(wine_program("WIN_CLAUDE"), settings=python_option(windows_path(self.windows_python)))

    def prepare(self) -> None:
        super().prepare()
        # Under CLAUDE_CONFIG_DIR, with the work folder trusted by the names
        # claude.exe gives it (its key is the folder with forward slashes).
        work = windows_path(self.ws.work)
        trusted = {"hasTrustDialogAccepted": True}
        self.ws.write_claude_json(self.api_key, {"projects": {work: trusted, work.replace("\\", "/"): trusted}})
        os.replace(self.ws.path("home", ".claude.json"), self.ws.path("home", ".claude", ".claude.json"))

    def env(self, session_id, changes=None):
        wine = {name: os.environ[name] for name in WINE_VARIABLES if name in os.environ}
        return super().env(session_id, {
            **wine,
            "CLAUDE_CONFIG_DIR": windows_path(self.ws.path("home", ".claude")),
            "LICH_CONTROL_RUN_DIR": windows_path(self.ws.run_dir),
            **(changes or {}),
        })

    def session_argv(self, argv: List[str]) -> List[str]:
        """`wine claude.exe ...`, every path in the workspace as Windows names it."""
        inside = self.ws.root + os.sep
        return [shutil.which("wine") or "wine", *(windows_path(arg) if arg.startswith(inside) else arg for arg in argv)]

    def session(self, session_id, plugin_dir=None, args=(), env=None, name=None) -> WindowsSession:
        return self.adopt(WindowsSession(self, session_id, plugin_dir, env))

    def mod_status(self) -> dict:
        return windows_mod_status(self.windows_python, self.ws.run_dir)


@pytest.fixture(scope="module")
def world():
    try:
        world = WindowsWorld()
    except Unavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    with world:
        furnish(world)
        yield world


def test_a_first_session_with_no_python_option_runs_the_setup_with_python_after_py_and_polls(world):
    # What a Windows user's first session runs: no python option, so the
    # relay tries `py -3`, then `python`. Wine's PATH has the Windows
    # Python's folder and no py.exe (python.org's installer, which carries
    # it, cannot be had here). The embeddable package lacks venv and pip:
    # the stand-in venv and the pip wheel beside the interpreter come first on
    # PYTHONPATH, as in tests/test_runtime.py's build; pip installs from PyPI.
    home = os.path.dirname(world.windows_python)
    world.ws.write_settings({"pluginConfigs": {PLUGIN_NAME: {}}})
    stand_ins = [os.path.join(CHECKOUT, "tests", "windows"), *glob.glob(os.path.join(home, "pip-*.whl"))[:1]]
    env = {"WINEPATH": windows_path(home), "PYTHONPATH": ";".join(windows_path(path) for path in stand_ins)}
    try:
        first = world.session(FIRST_SESSION, plugin_dir=world.plugin, env=env)
        status = first.wait_polling(timeout=SETUP_WAIT)
    finally:
        world.ws.write_settings(python_option(windows_path(world.windows_python)))
    spawns = [line.split("$.process.spawn (lich-control): ", 1)[1] for line in first.debug_text().splitlines()
              if "$.process.spawn (lich-control): " in line]
    assert spawns[0].startswith("py failed to start: ENOENT"), spawns
    assert spawns[1].startswith("python with 1 args"), spawns
    assert spawns[2].startswith("python ended (0)"), spawns
    env_python = first.wait_debug("lich-control setup: the environment is ready: ").split("is ready: ", 1)[1].strip()
    assert env_python.endswith("\\Scripts\\python.exe"), env_python
    assert spawns[3].startswith(f"{env_python} with 2 args") and f"(pid {status['daemon']['pid']})" in spawns[3], spawns
    world.env_python = env_python
    # Ended as lich ends a card's session, so that the module's session is
    # the only one left (its /exit is checked at its end): a /exit typed here,
    # just after the setup's line went, once never showed within 10 s under
    # Wine, and the first session's daemon then outlived the module.
    first.close()
    first.wait_for(first.status, lambda status: status is None, WAIT, "the first session's daemon gone with it")


@pytest.fixture(scope="module")
def session(world):
    session = world.session(SESSION, plugin_dir=world.plugin)
    session.wait_polling()
    return session


def test_the_daemon_runs_under_windows_python_and_polls(world, session):
    status = session.wait_polling()
    assert status["daemon"]["engine"] == "relay"
    assert status["daemon"]["session_id"] == SESSION
    assert status["poll"]["failures"] == 0
    spawned = session.wait_debug("$.process.spawn (lich-control)", WAIT)
    assert f"(pid {status['daemon']['pid']})" in spawned, spawned
    # On loopback TCP behind its secret: the relay's log names the port, never the secret.
    listens = session.wait_debug("listens on 127.0.0.1:", WAIT)
    assert "secret" not in listens, listens


def test_a_prompt_is_acked_and_reaches_the_model(world, session):
    assert_acked_ok(send(world, session, "prompt", "a prompt from lich [win-prompt]", timeout=WAIT))
    main_request(world, "[win-prompt]")
    session.wait_idle()


def test_a_notification_prompt_is_acked_and_arrives_as_the_user(world, session):
    text = "tests: 3 passed [win-notify]"
    assert_acked_ok(send(world, session, "prompt", text, "--notify", "completed", "ci done", timeout=WAIT))
    request = main_request(world, "[win-notify]")
    session.wait_idle()
    assert request.body["messages"][-1]["role"] == "user"
    assert f"<result>{text}</result>" in request.last_user_blocks[-1], request.last_user_blocks


def test_a_model_override_is_acked_and_on_the_next_request(world, session):
    check_model_override(world, session, "[win-model]")


def test_an_effort_override_is_acked_and_on_the_next_request(world, session):
    check_effort_override(world, session, "[win-effort]", WAIT)


def test_an_abort_ends_a_streaming_turn_and_is_acked(world, session):
    check_abort(world, session, "[win-abort]", WAIT)


def test_an_ask_is_acked_with_the_models_answer(world, session):
    question = "what are you working on? [win-ask]"
    assert_answered(world.lich.ask(SESSION, question, timeout=WAIT), question)


def test_a_command_is_acked_and_runs(world, session):
    assert_acked_ok(send(world, session, "command", CUSTOM_COMMAND, "[win-command]", timeout=WAIT))
    ran = main_request(world, "[win-command]")
    assert "The custom command ran with [win-command]" in ran.last_user_text
    session.wait_idle()


def test_the_python_option_stored_as_config_stores_it_runs_the_daemon_the_reload_starts(world, session):
    # Stored where /config stores it for a --plugin-dir plugin, beside the
    # settings' own under the bare name: Claude Code sees the options change,
    # reloads the module and hands it the new value, and the relay runs that.
    # The interpreter is the environment's the first session built, a Windows
    # Python other than the settings' own, so the name tells which ran.
    # (/config itself is driven on Linux, test_session.py: under Wine the
    # screen the test draws from claude.exe's output is garbled while the
    # menu is open. The new daemon's spawn is what is checked: under Wine the
    # reload leaves the old daemon running, so the new one waits for it.)
    assert world.env_python not in session.debug_text()
    world.ws.write_settings({"pluginConfigs": {f"{PLUGIN_NAME}@inline": {"options": {"python": world.env_python}}}})
    session.wait_debug(f"[{PLUGIN_NAME}] $.ui.log: options changed — reloaded", WAIT)
    session.wait_debug(f"$.process.spawn ({PLUGIN_NAME}): {world.env_python} with 2 args", WAIT)


def test_after_exit_no_daemon_answers_and_lich_reaches_none(world, session):
    session.slash("/exit")
    assert session.wait_exit() == 0
    # claude.exe's job object ends the daemon outright with it, so its
    # address file stays behind: lich-mod-status tells it as stale, and the
    # session's next daemon replaces it.
    session.wait_for(world.mod_status, lambda doc: all(d["status"] is None and d["stale"] for d in doc.get("daemons", [])),
                     WAIT, "no daemon answering in the run folder")
    outcome = world.lich.control(SESSION, "prompt", "is anyone there?", timeout=5)
    assert outcome["ok"] is False and not outcome.get("delivered"), outcome
