"""The opencode live test's world: a throwaway home, the development lich, a
fake OpenAI-compatible model API, and a real, interactive opencode under a
pseudo-terminal, with this project's relay installed as docs/opencode.md says.

The Claude Code live test's pieces are reused from tests/live (the
workspace's folders, the pseudo-terminal, the process watch, the
development lich run through `lich-stub serve|control|ask --json` and
`lich-mod-status --json`); what is opencode's is here. Nothing imports
`lich_control`.

    with World(opencode_binary()) as world:
        session = world.session("oc-1")              # opencode in the work folder, inside lich
        session.wait_polling()
        world.lich.control("oc-1", "prompt", "hi")   # the outcome as JSON, "ok" and "error" added
        session.exit()
"""
from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
from typing import Callable, List, Optional

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.append(os.path.join(CHECKOUT, "tests", "live"))

from devlich import Lich, Unavailable, daemon_status, python  # noqa: E402
from fakemodel import FakeModel  # noqa: E402
from processes import ProcessWatch, wait_until  # noqa: E402
from terminal import Terminal  # noqa: E402
from workspace import Workspace  # noqa: E402

RELAY = os.path.join(CHECKOUT, "hooks", "opencode", "lich-control.js")
OPENCODE_ENV = "LICH_LIVE_OPENCODE"  # the binary .ci/opencode-checks found; unset, ask .ci/opencode
PINNED = "1.18.33"
PROVIDER = "fake"
MODELS = ("m1", "m2")


def opencode_binary() -> str:
    """The pinned opencode, as .ci/opencode gets it (installing it when missing)."""
    named = os.environ.get(OPENCODE_ENV)
    if named:
        if not os.access(named, os.X_OK):
            raise Unavailable(f"{OPENCODE_ENV} names {named}, which is not an executable")
        return named
    done = subprocess.run([os.path.join(CHECKOUT, ".ci", "opencode")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not done.stdout.strip():
        raise Unavailable(f"no opencode to run: {done.stderr.strip() or '.ci/opencode found none'}")
    return done.stdout.strip().splitlines()[-1]


def argv_of(pid: int) -> List[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [arg.decode() for arg in f.read().split(b"\0") if arg]


class Opencode:
    """opencode's side of the workspace: its home, configuration and database."""

    def __init__(self, ws: Workspace):
        self.ws = ws

    @property
    def config_dir(self) -> str:
        return os.path.join(self.ws.home, ".config", "opencode")

    @property
    def data_dir(self) -> str:
        return os.path.join(self.ws.home, ".local", "share", "opencode")

    @property
    def runtime_dir(self) -> str:
        """Where the relay keeps the daemon's private environment."""
        return os.path.join(self.data_dir, "lich-control")

    def env(self, lich: Optional[Lich], session_id: Optional[str]) -> dict:
        """What lich gives the program it starts: the throwaway home, and the
        three variables when `session_id` is given."""
        home = self.ws.home
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "TERM": "xterm-256color",
            "LANG": "C.UTF-8",
            "TMPDIR": self.ws.tmp,
            "HOME": home,
            "XDG_CONFIG_HOME": os.path.join(home, ".config"),
            "XDG_DATA_HOME": os.path.join(home, ".local", "share"),
            "XDG_CACHE_HOME": os.path.join(home, ".cache"),
            "XDG_STATE_HOME": os.path.join(home, ".local", "state"),
            "LICH_CONTROL_RUN_DIR": self.ws.run_dir,
            # Offline: no model catalogue from models.dev, no update check.
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
        }
        if lich is not None and session_id is not None:
            env.update({"LICH_PORT": str(lich.port), "LICH_TOKEN": lich.token, "LICH_SESSION_ID": session_id})
        return env

    def install(self, api: FakeModel, python_option: bool = True) -> None:
        """The user's configuration: the fake model as an OpenAI-compatible
        provider, and the relay as a plugin, as docs/opencode.md installs it:
        with its python option naming the interpreter that has the project
        installed, or, without, left to set its own environment up."""
        plugin = [RELAY, {"python": python()}] if python_option else RELAY
        config = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "model": f"{PROVIDER}/{MODELS[0]}",
            "small_model": f"{PROVIDER}/{MODELS[0]}",
            "plugin": [plugin],
            "provider": {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Fake",
                    "options": {"baseURL": api.base_url, "apiKey": "not-a-key"},
                    # reasoning: opencode gives such a model the variants low, medium, high.
                    "models": {name: {"name": name.upper(), "reasoning": True} for name in MODELS},
                }
            },
        }
        self.ws.write_file(os.path.relpath(os.path.join(self.config_dir, "opencode.json"), self.ws.root),
                           json.dumps(config, indent=2))
        for folder in (self.config_dir, os.path.join(self.ws.work, ".opencode")):
            provide_plugin_dependency(folder)

    def sessions(self) -> List[tuple]:
        """(id, title, parent) of every session opencode keeps, from its database."""
        path = os.path.join(self.data_dir, "opencode.db")
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            return db.execute("SELECT id, title, parent_id FROM session ORDER BY time_created").fetchall()

    def log(self) -> str:
        folder = os.path.join(self.data_dir, "log")
        texts = []
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            with open(os.path.join(folder, name), errors="replace") as f:
                texts.append(f.read())
        return "\n".join(texts)


def provide_plugin_dependency(folder: str) -> None:
    """At start, opencode makes sure each of its configuration folders has
    @opencode-ai/plugin installed for the plugins there, and fetches it from
    the npm registry unless the folder's package-lock.json already lists it
    (with a node_modules beside); offline, that fetch holds the start for
    over a minute. The relay imports nothing from it, so the lock is all
    opencode looks at."""
    os.makedirs(os.path.join(folder, "node_modules"), exist_ok=True)
    wanted = {"@opencode-ai/plugin": PINNED}
    with open(os.path.join(folder, "package.json"), "w") as f:
        json.dump({"dependencies": wanted}, f)
    with open(os.path.join(folder, "package-lock.json"), "w") as f:
        json.dump({"lockfileVersion": 3, "packages": {"": {"dependencies": wanted}}}, f)


class OpencodeSession:
    """An interactive opencode in the work folder, under a pseudo-terminal, as lich starts one."""

    def __init__(self, oc: Opencode, binary: str, lich: Lich, session_id: str, watch: ProcessWatch):
        self.oc = oc
        self.lich = lich
        self.session_id = session_id
        self.terminal = Terminal([binary], oc.env(lich, session_id), oc.ws.work)
        watch.track(self.terminal.pid)

    def status(self) -> Optional[dict]:
        return daemon_status(self.oc.ws.run_dir, self.session_id)

    def wait_status(self, check: Callable[[dict], object], timeout: float, what: str) -> dict:
        last = {}

        def look():
            last["status"] = self.status()
            return last["status"] if last["status"] is not None and check(last["status"]) else None

        try:
            return wait_until(look, timeout, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the last status: {json.dumps(last.get('status'))[:1200]}\n{self.diagnosis()}") from None

    def wait_polling(self, timeout: float = 60.0) -> dict:
        return self.wait_status(lambda s: s["poll"]["state"] == "polling" and s["poll"]["last_poll_age_s"] is not None,
                                timeout, f"a daemon polling for {self.session_id}")

    def wait_idle(self, timeout: float = 30.0) -> dict:
        """No turn running and nothing in flight, as the daemon sees it."""
        return self.wait_status(lambda s: s["turn"] is None and not s["in_flight"], timeout, "the session to be idle")

    def diagnosis(self) -> str:
        lines = [line for line in self.oc.log().splitlines() if "lich" in line or "level=ERROR" in line]
        screen = " ".join(self.terminal.text.split())[-600:]
        return "\n".join(["opencode's log, the relay's and the errors' lines:", *lines[-20:], f"screen: {screen}"])

    def exit(self, timeout: float = 20.0) -> int:
        """Type /exit and Enter, as a person does; the exit status."""
        mark = self.terminal.mark()
        self.terminal.type("/exit")
        self.terminal.wait_for_text("/exit", 10, since=mark)
        self.terminal.type("\r")
        return self.terminal.wait_exit(timeout)

    def close(self) -> None:
        self.terminal.close()


class World:
    """Everything a live session needs, started together and ended together
    (also when a test fails): the workspace, a process watch, the fake model
    API, the development lich, and the sessions."""

    def __init__(self, binary: str):
        self.binary = binary
        self._stack = contextlib.ExitStack()
        try:
            self.ws = Workspace(prefix="lich-oc-")
            self._stack.callback(self.ws.remove)
            self.oc = Opencode(self.ws)
            self.watch = self._stack.enter_context(ProcessWatch())
            self.api = self._stack.enter_context(FakeModel())
            self.oc.install(self.api)
            self.lich = self._stack.enter_context(Lich(self.ws, self.watch))
        except BaseException:
            self._stack.close()
            raise

    def __enter__(self) -> "World":
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def session(self, session_id: str) -> OpencodeSession:
        session = OpencodeSession(self.oc, self.binary, self.lich, session_id, self.watch)
        self._stack.callback(session.close)
        return session

    def run(self, prompt: str, session_id: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
        """`opencode run PROMPT` to its end, no terminal, inside lich."""
        proc = subprocess.Popen([self.binary, "run", prompt], env=self.oc.env(self.lich, session_id), cwd=self.ws.work,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        self.watch.track(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise AssertionError(f"opencode run still ran after {timeout:g} s") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
