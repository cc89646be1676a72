"""The development lich and the status tool, run as a user runs them: the
console scripts `lich-stub serve|control|ask --json` and `lich-mod-status
--json`, from the interpreter that has the project installed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Dict, List, Mapping, Optional

from processes import Closing, ProcessWatch, wait_until
from workspace import Workspace

STUB_RUNTIME = "lich-stub.json"  # what `lich-stub serve` writes in its run folder


class Unavailable(Exception):
    """Something the live test needs cannot be had: the test fails on it, it never skips."""


def python() -> str:
    """The interpreter that has the project installed: make plugin-check's, else this one."""
    named = os.environ.get("PYTHON")
    if not named:
        return sys.executable
    # As a path, so its console scripts are found beside it; not resolved,
    # since a virtual environment's interpreter is a link out of it.
    return os.path.abspath(named) if os.sep in named else (shutil.which(named) or named)


def stub() -> List[str]:
    """lich-stub, the checkout's development tool, in the interpreter under test."""
    return [python(), os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lich-stub")]


def tool(name: str) -> str:
    """A console script of the project (lich-mod-status), beside the interpreter."""
    beside = os.path.join(os.path.dirname(python()), name)
    found = beside if os.access(beside, os.X_OK) else shutil.which(name)
    if not found:
        raise Unavailable(f"{name} is not installed beside {python()} nor on PATH: run 'make install'")
    return found


def tool_env(run_dir: str) -> Dict[str, str]:
    """This process's environment for a tool, without any LICH_* of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LICH_")}
    env["LICH_CONTROL_RUN_DIR"] = run_dir
    return env


class Pending:
    """A `lich-stub control` or `ask` on its way: `result()` waits for what it printed."""

    def __init__(self, argv: List[str], env: Mapping[str, str], watch: Optional[ProcessWatch], timeout: float):
        self.argv = argv
        self._timeout = timeout
        self._proc = subprocess.Popen(argv, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True, start_new_session=True)
        if watch is not None:
            watch.track(self._proc.pid)

    def done(self) -> bool:
        return self._proc.poll() is not None

    def result(self, timeout: Optional[float] = None) -> dict:
        """The outcome as `--json` printed it: the Outcome's fields, `ok`, `error`."""
        try:
            out, err = self._proc.communicate(timeout=timeout if timeout is not None else self._timeout + 15)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.communicate()
            raise AssertionError(f"{' '.join(self.argv[1:4])} did not finish") from None
        lines = [line for line in out.splitlines() if line.strip()]
        try:
            return json.loads(lines[-1])
        except (IndexError, ValueError):
            raise AssertionError(f"{' '.join(self.argv[1:4])} printed no JSON: {out!r} {err.strip()!r}") from None


class Lich(Closing):
    """The development lich, `lich-stub serve`, in its own run folder: it
    writes the token there, so no argv ever carries it."""

    def __init__(self, ws: Workspace, watch: Optional[ProcessWatch] = None, timeout: float = 20.0,
                 command: Optional[List[str]] = None):
        """`command` runs lich-stub (default: stub(); the confined test runs it as its user)."""
        self.ws = ws
        self.watch = watch
        self.command = command or stub()
        self._env = tool_env(ws.lich_run_dir)
        self._log = open(ws.path("logs", "lich-stub.log"), "w")
        self._proc = subprocess.Popen([*self.command, "serve", "--verbose"], env=self._env, stdin=subprocess.DEVNULL,
                                      stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        if watch is not None:
            watch.track(self._proc.pid)
        runtime = os.path.join(ws.lich_run_dir, STUB_RUNTIME)

        def ready():
            if self._proc.poll() is not None:
                raise AssertionError(f"lich-stub serve exited with {self._proc.returncode}: {self.log_text()[-500:]}")
            try:
                with open(runtime) as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                return None
            return doc if doc.get("pid") == self._proc.pid else None

        doc = wait_until(ready, timeout, "lich-stub serve to write its runtime file")
        self.port = int(doc["port"])
        self.token = str(doc["token"])

    @property
    def pid(self) -> int:
        return self._proc.pid

    def log_text(self) -> str:
        with open(self.ws.path("logs", "lich-stub.log"), errors="replace") as f:
            return f.read()

    def begin(self, session_id: str, kind: str, *args: str, timeout: float = 20.0) -> Pending:
        """`lich-stub control SESSION KIND ARGS --json`, left running."""
        argv = [*self.command, "control", session_id, kind, *args, "--json", "--timeout", f"{timeout:g}"]
        return Pending(argv, self._env, self.watch, timeout)

    def control(self, session_id: str, kind: str, *args: str, timeout: float = 20.0) -> dict:
        return self.begin(session_id, kind, *args, timeout=timeout).result()

    def begin_ask(self, session_id: str, question: str, timeout: float = 30.0) -> Pending:
        argv = [*self.command, "ask", session_id, question, "--json", "--timeout", f"{timeout:g}"]
        return Pending(argv, self._env, self.watch, timeout)

    def ask(self, session_id: str, question: str, timeout: float = 30.0) -> dict:
        return self.begin_ask(session_id, question, timeout).result()

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()


def mod_status(run_dir: str) -> dict:
    """`lich-mod-status --json` for a run folder: {"run_dir", "daemons": [...]}."""
    done = subprocess.run([tool("lich-mod-status"), "--json"], env=tool_env(run_dir), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=30)
    try:
        return json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"lich-mod-status --json printed no JSON (exit {done.returncode}): {done.stderr.strip()!r}") from None


def daemon_status(run_dir: str, session_id: str) -> Optional[dict]:
    """The status document of the session's daemon, or None when none answers."""
    for entry in mod_status(run_dir).get("daemons", []):
        if entry.get("session_id") == session_id:
            return entry.get("status")
    return None
