"""The opencode live test's world: a throwaway home, the development lich, a
fake model API, and a real, interactive opencode under a pseudo-terminal
with this project's relay installed as docs/opencode.md says.

Everything is driven through the project's entry points as a person runs
them (`lich-stub serve|control|ask --json`, `lich-mod-status --json`, the
daemon as the relay starts it), never by importing `lich_control`.

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
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from typing import Callable, List, Mapping, Optional, Sequence

from fakemodel import FakeModel
from terminal import Terminal

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RELAY = os.path.join(CHECKOUT, "hooks", "opencode", "lich-control.js")
OPENCODE_ENV = "LICH_LIVE_OPENCODE"  # the binary .ci/opencode-checks found; unset, ask .ci/opencode
KEEP_ENV = "LICH_LIVE_KEEP"  # set: keep the throwaway folder (its path is printed)
PINNED = "1.18.33"
PROVIDER = "fake"
MODELS = ("m1", "m2")
LOOK_EVERY = 0.1  # between two looks at state another process owns


class Unavailable(Exception):
    """Something the live test needs cannot be had: the test fails on it, it never skips."""


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


def python() -> str:
    """The interpreter that has the project installed: make plugin-check's, else this one."""
    return os.environ.get("PYTHON") or sys.executable


def tool(name: str) -> str:
    """A console script of the project, installed beside that interpreter."""
    path = os.path.join(os.path.dirname(python()), name)
    if not os.access(path, os.X_OK):
        raise Unavailable(f"{name} is not installed beside {python()}: run make install (pip install -e '.[test]')")
    return path


def wait_until(look: Callable[[], object], timeout: float, what: str):
    """`look()`'s first true value, looked for until `timeout` s have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = look()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        time.sleep(LOOK_EVERY)


def argv_of(pid: int) -> List[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [arg.decode() for arg in f.read().split(b"\0") if arg]


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie nobody reaped yet."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


class Workspace:
    """/tmp/lich-oc-XXXX: home/ (HOME and XDG_*), work/ (the project), run/ (sockets).

    Short, so the daemon's socket path fits a Unix socket's limit."""

    def __init__(self):
        self.root = tempfile.mkdtemp(prefix="lich-oc-", dir="/tmp")
        self.home = self._folder("home")
        self.work = self._folder("work")
        self.run_dir = self._folder("run")
        os.chmod(self.run_dir, 0o700)

    def _folder(self, name: str) -> str:
        path = os.path.join(self.root, name)
        os.makedirs(path)
        return path

    @property
    def config_dir(self) -> str:
        return os.path.join(self.home, ".config", "opencode")

    @property
    def data_dir(self) -> str:
        return os.path.join(self.home, ".local", "share", "opencode")

    def xdg(self) -> dict:
        return {
            "HOME": self.home,
            "XDG_CONFIG_HOME": os.path.join(self.home, ".config"),
            "XDG_DATA_HOME": os.path.join(self.home, ".local", "share"),
            "XDG_CACHE_HOME": os.path.join(self.home, ".cache"),
            "XDG_STATE_HOME": os.path.join(self.home, ".local", "state"),
        }

    def write(self, relative: str, text: str) -> str:
        path = os.path.join(self.root, relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def install(self, api: FakeModel, python_option: bool = True) -> None:
        """opencode's user configuration: the fake model as an OpenAI-compatible
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
        self.write(os.path.join(self.config_dir, "opencode.json"), json.dumps(config, indent=2))
        for folder in (self.config_dir, os.path.join(self.work, ".opencode")):
            provide_plugin_dependency(folder)

    def sessions(self) -> List[tuple]:
        """(id, title, parent) of every session opencode keeps, read from its database."""
        path = os.path.join(self.data_dir, "opencode.db")
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            return db.execute("SELECT id, title, parent_id FROM session ORDER BY time_created").fetchall()

    @property
    def runtime_dir(self) -> str:
        """Where the relay keeps the daemon's private environment."""
        return os.path.join(self.data_dir, "lich-control")

    def opencode_log(self) -> str:
        folder = os.path.join(self.data_dir, "log")
        try:
            names = sorted(os.listdir(folder))
        except FileNotFoundError:
            return ""
        texts = []
        for name in names:
            with open(os.path.join(folder, name), errors="replace") as f:
                texts.append(f.read())
        return "\n".join(texts)

    def remove(self) -> None:
        if os.environ.get(KEEP_ENV):
            print(f"live test folder kept: {self.root}", file=sys.stderr)
            return
        shutil.rmtree(self.root, ignore_errors=True)


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


class Lich:
    """The development lich, `lich-stub serve`, in the workspace's run folder;
    driven with `lich-stub control|ask --json` as a person would."""

    def __init__(self, ws: Workspace):
        self.ws = ws
        self.env = dict(os.environ, LICH_CONTROL_RUN_DIR=ws.run_dir)
        for name in ("LICH_PORT", "LICH_TOKEN", "LICH_SESSION_ID"):
            self.env.pop(name, None)
        self.proc = subprocess.Popen([tool("lich-stub"), "serve"], env=self.env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first = self.proc.stdout.readline()
        if "listening on" not in first:
            self.close()
            raise Unavailable(f"lich-stub serve did not start: {first.strip() or 'no output'}")
        with open(os.path.join(ws.run_dir, "lich-stub.json")) as f:
            runtime = json.load(f)
        self.port, self.token = runtime["port"], runtime["token"]

    def variables(self, session_id: str) -> dict:
        return {"LICH_PORT": str(self.port), "LICH_TOKEN": self.token, "LICH_SESSION_ID": session_id}

    def control(self, session_id: str, kind: str, *args: str, timeout: float = 20.0) -> dict:
        return self._drive(["control", session_id, kind, *args], timeout)

    def ask(self, session_id: str, question: str, timeout: float = 30.0) -> dict:
        return self._drive(["ask", session_id, question], timeout)

    def start(self, argv: Sequence[str], timeout: float) -> subprocess.Popen:
        """`lich-stub control|ask ...` running, for a command whose ack comes later."""
        return subprocess.Popen([tool("lich-stub"), *argv, "--json", "--timeout", f"{timeout:g}"], env=self.env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def outcome(self, proc: subprocess.Popen, timeout: float) -> dict:
        out, err = proc.communicate(timeout=timeout + 15)
        lines = out.strip().splitlines()
        if not lines:
            raise AssertionError(f"lich-stub {' '.join(proc.args[1:4])} printed nothing; stderr: {err.strip()}")
        return json.loads(lines[-1])

    def _drive(self, argv: List[str], timeout: float) -> dict:
        return self.outcome(self.start(argv, timeout), timeout)

    def status(self, session_id: str) -> Optional[dict]:
        """The daemon's status document, as `lich-mod-status SESSION --json` reads it; None without one."""
        done = subprocess.run([tool("lich-mod-status"), session_id, "--json"], env=self.env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=30)
        try:
            return json.loads(done.stdout).get("status")
        except ValueError:
            return None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()


def opencode_env(ws: Workspace, lich: Optional[Lich], session_id: Optional[str]) -> dict:
    """What lich gives the program it starts: the throwaway home, and the
    three variables when `session_id` is given."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
        "LICH_CONTROL_RUN_DIR": ws.run_dir,
        # Offline: no model catalogue from models.dev, no update check.
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        **ws.xdg(),
    }
    if lich is not None and session_id is not None:
        env.update(lich.variables(session_id))
    return env


class OpencodeSession:
    """An interactive opencode in the work folder, under a pseudo-terminal, as lich starts one."""

    def __init__(self, ws: Workspace, opencode: str, lich: Lich, session_id: str):
        self.ws = ws
        self.lich = lich
        self.session_id = session_id
        self.terminal = Terminal([opencode], opencode_env(ws, lich, session_id), ws.work)

    def status(self) -> Optional[dict]:
        return self.lich.status(self.session_id)

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
        lines = [line for line in self.ws.opencode_log().splitlines() if "lich" in line or "level=ERROR" in line]
        return "\n".join(["opencode's log, the relay's and the errors' lines:", *lines[-20:],
                          f"screen: {self.terminal.text[-600:]}"])

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
    (also when a test fails): the workspace, the fake model API, the
    development lich and the sessions."""

    def __init__(self, opencode: str):
        self.opencode = opencode
        self._stack = contextlib.ExitStack()
        try:
            self.ws = Workspace()
            self._stack.callback(self.ws.remove)
            self.api = FakeModel()
            self._stack.callback(self.api.close)
            self.ws.install(self.api)
            self.lich = Lich(self.ws)
            self._stack.callback(self.lich.close)
        except BaseException:
            self._stack.close()
            raise

    def __enter__(self) -> "World":
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def session(self, session_id: str) -> OpencodeSession:
        session = OpencodeSession(self.ws, self.opencode, self.lich, session_id)
        self._stack.callback(session.close)
        return session

    def run(self, prompt: str, session_id: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
        """`opencode run PROMPT` to its end, no terminal, inside lich."""
        return subprocess.run([self.opencode, "run", prompt], env=opencode_env(self.ws, self.lich, session_id),
                              cwd=self.ws.work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout, start_new_session=True)
