"""The relay stand-in: one daemon started as the relay starts it, and the
relay's half of the bridge.

A reader thread timestamps each stdout line, shows it to `on_call`, and
answers it at once over the daemon's socket on one kept-alive
`DaemonConnection` (the same client every tool uses); forks are answered by a
second thread, on its own connection, `fork_delay` seconds after they came.
"""
from __future__ import annotations

import http.client
import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Callable, List, Optional

from lich_dev.lich import StubLich
from lich_dev.procs import ROOT, daemon_env, stop
from lich_control.bridge_server import Address, DaemonConnection
from .common import CLOCK, WAIT, BenchError

JSON = {"Content-Type": "application/json"}


def post_result(conn: DaemonConnection, doc: dict) -> int:
    status, _ = conn.exchange("POST", "/v1/result", json.dumps(doc).encode(), JSON)
    return status


class Relay:
    def __init__(self, lich: StubLich, session_id: str, run_dir: str, fork_delay: float):
        self.session_id = session_id
        self.fork_delay = fork_delay
        self.on_call: Optional[Callable[[float, dict], None]] = None
        self.errors: List[str] = []
        self.socket: Optional[Address] = None
        self._hello = threading.Event()
        self._forks: "queue.Queue" = queue.Queue()
        env = daemon_env(LICH_PORT=str(lich.port), LICH_TOKEN=lich.token, LICH_SESSION_ID=session_id, LICH_CONTROL_RUN_DIR=run_dir)
        # Set in some shells (this machine's among them): every start would
        # compile the package from source, ~20 ms a start no user's daemon
        # pays where its folder can be written.
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        self._stderr = open(os.path.join(run_dir, f"{session_id}.stderr"), "wb")
        self.started_at = CLOCK()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lich_control"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self._reader = threading.Thread(target=self._read, name=f"relay-{session_id}", daemon=True)
        self._forker = threading.Thread(target=self._answer_forks, name=f"relay-forks-{session_id}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_hello(self, timeout: float = WAIT) -> None:
        if not self._hello.wait(timeout):
            raise BenchError(f"daemon {self.session_id} said no hello within {timeout:g} s")

    def _read(self) -> None:
        conn: Optional[DaemonConnection] = None
        try:
            for raw in self.proc.stdout:
                now = CLOCK()
                doc = json.loads(raw)
                if doc.get("op") == "hello":
                    # http.client connects at the first result, as the real
                    # relay does: an idle relay holds no connection.
                    self.socket = Address.of(doc)
                    conn = DaemonConnection(self.socket)
                    self._forker.start()
                    self._hello.set()
                    continue
                hook = self.on_call
                if hook is not None:
                    hook(now, doc)
                if doc["method"] == "model.fork":
                    self._forks.put((now + self.fork_delay, doc["id"]))
                    continue
                value = {"text": doc["args"]["text"]} if doc["method"] == "prompt.submit" else None
                self._answer(conn, doc["id"], value)
        except (OSError, http.client.HTTPException) as exc:
            if self.proc.poll() is None:
                self.errors.append(f"the relay stand-in lost the daemon: {exc!r}")
        finally:
            if conn is not None:
                conn.close()
            self._forks.put(None)

    def _answer(self, conn: DaemonConnection, call_id: str, value) -> None:
        status = post_result(conn, {"id": call_id, "ok": True, "value": value})
        if status != 204:
            self.errors.append(f"{call_id}: /v1/result answered {status}")

    def _answer_forks(self) -> None:
        conn = DaemonConnection(self.socket)
        try:
            while True:
                item = self._forks.get()
                if item is None:
                    return
                due, call_id = item
                left = due - CLOCK()
                if left > 0:
                    time.sleep(left)  # the scenario is about time: a fork takes this long
                self._answer(conn, call_id, {"isAnswered": True, "text": f"answer to {call_id}"})
        except (OSError, http.client.HTTPException) as exc:
            if self.proc.poll() is None:
                self.errors.append(f"the fork answerer lost the daemon: {exc!r}")
        finally:
            conn.close()

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()

    def stop(self, timeout: float = 10.0) -> None:
        stop(self.proc, timeout)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._stderr.close()

    def stderr_text(self) -> str:
        """What the daemon wrote on its stderr, before or after stop() (the
        daemon writes the file; this process never does, so there is nothing
        of ours to flush, and a closed handle must not hide the daemon's words)."""
        with open(self._stderr.name, "rb") as f:
            return f.read().decode("utf-8", "replace")
