"""lich drives a live, interactive Windows opencode under Wine: the relay
starts the daemon under Windows Python, the daemon polls, a prompt from lich
reaches the model and is acked, and the session's end stops the daemon.

The opencode live test's world (opencode_world.py) with Windows programs in
it: opencode.exe under Wine in the pseudo-terminal, the relay loaded from
this checkout with its python option naming the Windows Python, and
lich-mod-status run by Windows Python too (windows_session.py's way). The
development lich and the fake model API are the Linux ones on loopback.

The opencode is opencode-windows-x64 1.18.32, not the pinned 1.18.33: npm
has no Windows package of 1.18.33. .ci/wine-setup installs it with the
stand-in bcryptprimitives.dll beside it, without which it does not start
under Wine 8 (and its TUI aborts a few seconds in).

Run by .ci/windows-checks, which sets Wine up and starts the wineserver:

    python -m pytest -c tests/opencode/pytest.ini tests/opencode/windows_opencode.py

Not named live_*.py: .ci/opencode-checks, which has no Wine, does not
collect it. The tests are the steps of one session, in file order.
"""
from __future__ import annotations

import os
import shutil
from typing import List, Optional

import pytest

from opencode_world import RELAY, Opencode, OpencodeSession, World  # first: it puts tests/live on the path
from devlich import Unavailable  # noqa: E402
from windows_session import WINE_VARIABLES, windows_mod_status, windows_path, wine_program  # noqa: E402

SESSION = "win-oc"
# opencode.exe takes some seconds to start under Wine, each step more than on Linux.
WAIT = 60.0


class WindowsOpencode(Opencode):
    """opencode's side of the workspace, its folders named as Windows names them."""

    def __init__(self, ws, windows_python: str):
        self.windows_python = windows_python
        super().__init__(ws)

    def plugin(self, python_option: bool):
        return [windows_path(RELAY), {"python": windows_path(self.windows_python)}]

    def env(self, lich, session_id) -> dict:
        env = super().env(lich, session_id)
        for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "LICH_CONTROL_RUN_DIR"):
            env[name] = windows_path(env[name])
        # Bun unpacks opencode's embedded DLLs into TMPDIR when it is set,
        # where a Linux path fails the TUI's to load ("error code 126"); Wine
        # wants a Linux one there for its own folder. Without it, Bun takes
        # the prefix's Temp folder.
        del env["TMPDIR"]
        env.update({name: os.environ[name] for name in WINE_VARIABLES if name in os.environ})
        return env


class WindowsOpencodeSession(OpencodeSession):
    """opencode.exe in the pseudo-terminal; its daemon's status from the Windows lich-mod-status."""

    POLL_WAIT = 120.0
    IDLE_WAIT = WAIT
    EXIT_WAIT = WAIT

    def __init__(self, world: "WindowsWorld", session_id: str):
        self.world = world
        super().__init__(world, session_id)

    def status(self) -> Optional[dict]:
        for entry in self.world.mod_status().get("daemons", []):
            if entry.get("session_id") == self.session_id:
                return entry.get("status")
        return None


class WindowsWorld(World):
    WORKSPACE_PREFIX = "lich-winoc-"

    def __init__(self):
        self.windows_python = wine_program("WIN_PYTHON")
        super().__init__(wine_program("WIN_OPENCODE"))

    def prepare(self) -> None:
        self.oc = WindowsOpencode(self.ws, self.windows_python)
        self.oc.install(self.api)

    def argv(self) -> List[str]:
        return [shutil.which("wine") or "wine", self.binary]

    def session(self, session_id: str) -> WindowsOpencodeSession:
        return self.adopt(WindowsOpencodeSession(self, session_id))

    def mod_status(self) -> dict:
        return windows_mod_status(self.windows_python, self.ws.run_dir)


@pytest.fixture(scope="module")
def world():
    try:
        world = WindowsWorld()
    except Unavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    with world:
        yield world


@pytest.fixture(scope="module")
def session(world):
    session = world.session(SESSION)
    session.wait_polling()
    return session


def relay_line(world, session, words: str) -> str:
    """The first line of opencode's log from the relay holding `words`."""
    def lines():
        return [line for line in world.oc.log().splitlines() if "lich-control: " in line and words in line]
    return session.wait_for(lines, bool, WAIT, f"the relay's {words!r} in opencode's log")[0]


def test_the_relay_starts_the_daemon_under_windows_python_and_it_polls_over_loopback(world, session):
    status = session.wait_polling()
    assert status["daemon"]["host"] == "opencode"
    assert status["daemon"]["engine"] == "relay"
    assert status["daemon"]["session_id"] == SESSION
    assert status["poll"]["failures"] == 0
    # The daemon's hello: its pid, on loopback TCP behind a secret the log never shows.
    hello = relay_line(world, session, "listens on 127.0.0.1:")
    assert f"the daemon {status['daemon']['pid']} " in hello, hello
    assert "secret" not in hello, hello
    # Started from the python option: the Windows Python, as Wine shows the
    # daemon among the processes now that it polls. Not every argv the watch
    # ever recorded: for its first moments a process of Wine's shows Wine's
    # loader (/usr/lib/wine/wine64) as its argv[0].
    daemons = [p.argv for p in world.watch.alive() if "lich_control" in p.argv]
    assert daemons and all(daemon[0].lower().endswith("python.exe") for daemon in daemons), daemons


def test_a_prompt_from_lich_is_acked_and_reaches_the_model(world, session):
    outcome = world.lich.control(SESSION, "prompt", "a prompt from lich [win-oc-1]", timeout=WAIT)
    assert outcome.get("ok") is True, f"lich got no ok ack: {outcome}"
    request = world.api.wait_for(lambda r: not r.is_title and "[win-oc-1]" in r.last_user, WAIT, "the prompt's model request")
    assert request.model == "m1", request
    session.wait_idle()


def test_the_sessions_end_stops_the_daemon(world, session):
    assert session.exit() == 0
    session.wait_for(world.mod_status, lambda doc: all(d["status"] is None for d in doc.get("daemons", [])),
                     WAIT, "no daemon answering in the run folder")
    outcome = world.lich.control(SESSION, "prompt", "is anyone there?", timeout=5)
    assert outcome["ok"] is False and not outcome.get("delivered"), outcome
