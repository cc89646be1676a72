"""What a live test's world is made of, whichever host it drives (Claude
Code: claude_world.py; opencode: tests/opencode/opencode_world.py): the
pinned host's binary, the environment lich starts a session with, an
interactive session under a pseudo-terminal and what the test waits for in
it, and the world that starts and ends it all together.

    class MyWorld(LiveWorld):                       # a host's world
        API = MyModelAPI                            # its fake model API (fakeapi.py)
        def prepare(self): ...                      # its configuration in the workspace
    with MyWorld() as world:                        # workspace, process watch, API, lich
        session = world.adopt(MySession(...))       # a HostSession, closed with the world
        session.wait_polling()                      # lich-mod-status --json: the daemon polls
        world.lich.control(session_id, "prompt", "hi")

Everything is driven through the project's entry points as a user runs them
(`lich-stub serve|control|ask --json`, `lich-mod-status --json`, the daemon
as the relay starts it), never by importing `lich_control`: the test holds
whatever the package looks like inside.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import pyte

from devlich import Lich, Unavailable, daemon_status
from fakeapi import FakeAPI
from processes import Closing, ProcessWatch, wait_until
from terminal import COLUMNS, ROWS, Terminal
from workspace import CHECKOUT, Workspace


def pinned_binary(variable: str, script: str, program: str) -> str:
    """The pinned host's binary: the one the variable names (the checks
    script says which it checked), else what `.ci/<script>` prints, which
    installs it when missing."""
    named = os.environ.get(variable)
    if named:
        if not os.access(named, os.X_OK):
            raise Unavailable(f"{variable} names {named}, which is not an executable")
        return named
    done = subprocess.run([os.path.join(CHECKOUT, ".ci", script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not done.stdout.strip():
        raise Unavailable(f"no {program} to run: {done.stderr.strip() or f'.ci/{script} found none'}")
    return done.stdout.strip().splitlines()[-1]


def lich_env(ws: Workspace, lich: Optional[Lich], session_id: Optional[str], host: Mapping[str, str],
             changes: Optional[Mapping[str, Optional[str]]] = None) -> Dict[str, str]:
    """What a program lich starts gets: a home of its own, the daemons' run
    folder, the host's own variables, and the three LICH_* variables (none
    without a lich and a session id); `changes` last (None removes one)."""
    env = {
        "HOME": ws.home,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "TERM": "xterm-256color",
        "TMPDIR": ws.tmp,
        "LICH_CONTROL_RUN_DIR": ws.run_dir,
        **host,
    }
    if lich is not None and session_id is not None:
        env.update({"LICH_PORT": str(lich.port), "LICH_TOKEN": lich.token, "LICH_SESSION_ID": session_id})
    for key, value in (changes or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


class HostSession(Closing):
    """An interactive host under a pseudo-terminal in the work folder, as
    lich starts one, and the daemon that serves it. A host's session says
    how long its waits may take and what its log holds for a diagnosis."""

    POLL_WAIT = 30.0  # for the daemon to poll
    IDLE_WAIT = 20.0  # for a turn and the commands in flight to end
    EXIT_WAIT = 15.0  # for the host to exit

    def __init__(self, ws: Workspace, argv: Sequence[str], env: Mapping[str, str], session_id: Optional[str],
                 watch: Optional[ProcessWatch] = None):
        self.ws = ws
        self.session_id = session_id
        self.argv = list(argv)
        self.env = dict(env)
        self.terminal = Terminal(self.argv, self.env, ws.work)
        if watch is not None:
            watch.track(self.terminal.pid)
        # What the person sees: the terminal's output drawn on a screen of its size.
        self._screen = pyte.Screen(COLUMNS, ROWS)
        self._stream = pyte.Stream(self._screen)
        self._drawn = 0

    @property
    def pid(self) -> int:
        return self.terminal.pid

    def status(self) -> Optional[dict]:
        return daemon_status(self.ws.run_dir, self.session_id)

    def wait_status(self, check: Callable[[dict], object], timeout: float, what: str = "the daemon's status") -> dict:
        """The daemon's status document once `check(status)` holds."""
        return self.wait_for(self.status, lambda status: status is not None and check(status), timeout, what,
                             lambda status: f"the last status: {json.dumps(status)[:1500]}")

    def wait_polling(self, timeout: Optional[float] = None) -> dict:
        return self.wait_status(lambda s: s["poll"]["state"] == "polling" and s["poll"]["last_poll_age_s"] is not None,
                                timeout or self.POLL_WAIT, f"a daemon polling for {self.session_id}")

    def wait_idle(self, timeout: Optional[float] = None) -> dict:
        """No turn running and no command in flight, as the daemon sees it."""
        return self.wait_status(lambda s: s["turn"] is None and not s["in_flight"], timeout or self.IDLE_WAIT,
                                "the session to be idle")

    def wait_for(self, look: Callable[[], object], holds: Callable[[object], object], timeout: float, what: str,
                 explain: Optional[Callable[[object], str]] = None):
        """What `look()` sees once `holds` of it; a failure says what it saw last, and the diagnosis."""
        try:
            return wait_until(look, timeout, what, holds=holds, explain=explain)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnosis()}") from None

    def diagnosis(self) -> str:
        """What to read when the session did not do what it should: the
        relay's and the errors' lines of the host's log, and the screen."""
        where, lines = self.log_lines()
        screen = " ".join(self.terminal.text.split())[-600:]
        return "\n".join([f"{where}, the relay's and the errors' lines:", *lines[-20:], f"screen: {screen}"])

    def screen(self) -> str:
        """The text on the screen now, one line per row."""
        output = self.terminal.output
        self._stream.feed(output[self._drawn:])
        self._drawn = len(output)
        return "\n".join(line.rstrip() for line in self._screen.display)

    def wait_for_screen(self, words: str, timeout: float) -> str:
        """The screen once `words` are on it (runs of blanks squeezed)."""
        wanted = " ".join(words.split())
        return self.wait_for(self.screen, lambda text: wanted in " ".join(text.split()), timeout,
                             f"{words!r} on the screen", lambda text: f"the screen: {text}")

    def log_lines(self) -> Tuple[str, List[str]]:
        """Which log, and its lines about the relay or an error."""
        return "no log", []

    def slash(self, command: str, timeout: float = 10.0) -> None:
        """Type a slash command at the prompt and press Enter, as a person does:
        the Enter waits until the command shows, so the menu has caught up."""
        self.enter(command, timeout)

    def enter(self, line: str, timeout: float = 10.0) -> None:
        """Type a line at the prompt (a prompt, a slash command) and press
        Enter once it shows."""
        mark = self.terminal.mark()
        self.terminal.type(line)
        self.terminal.wait_for_text(line, timeout, since=mark)
        self.terminal.type("\r")

    def wait_exit(self, timeout: Optional[float] = None) -> int:
        return self.terminal.wait_exit(timeout or self.EXIT_WAIT)

    def exit(self, timeout: Optional[float] = None) -> int:
        """/exit, as a person types it; the exit status."""
        self.slash("/exit")
        return self.wait_exit(timeout)

    def close(self) -> None:
        self.terminal.close()


class LiveWorld(Closing):
    """Everything a live session needs, started together and ended together
    (also when a test fails): a workspace, a process watch, the host's fake
    model API, the development lich, the host's configuration (`prepare`),
    and the sessions adopted."""

    API: Callable[[], FakeAPI]  # the host's fake model API
    WORKSPACE_PREFIX = "lich-live-"

    def __init__(self):
        self._stack = contextlib.ExitStack()
        try:
            self.ws = Workspace(prefix=self.WORKSPACE_PREFIX)
            self._stack.callback(self.ws.remove)
            self.watch = self._stack.enter_context(ProcessWatch())
            self.api = self._stack.enter_context(self.API())
            self.lich = self._stack.enter_context(self.start_lich())
            self.prepare()
        except BaseException:
            self._stack.close()
            raise

    def start_lich(self) -> Lich:
        """The development lich, started."""
        return Lich(self.ws, self.watch)

    def prepare(self) -> None:
        """Write the host's configuration into the workspace."""

    def adopt(self, session: HostSession) -> HostSession:
        """Close the session with the world at the latest."""
        self._stack.callback(session.close)
        return session

    def run_to_end(self, argv: Sequence[str], env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess:
        """A host's command to its end, with no terminal, in the work folder."""
        proc = subprocess.Popen(list(argv), env=dict(env), cwd=self.ws.work, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.watch.track(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            what = f"{os.path.basename(argv[0])} {' '.join(argv[1:])}"
            raise AssertionError(f"{what[:100]} still ran after {timeout:g} s") from None
        return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)

    def close(self) -> None:
        # In reverse: sessions, the lich, the API, the watch (which ends
        # whatever is left of every process), and last the folder.
        self._stack.close()
