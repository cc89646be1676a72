"""Plays the Claude Code relay over the real bridge: the daemon as a subprocess,
its stdout read line by line, results and events posted over its socket (its
Unix socket, or on Windows its loopback port with the secret)."""
from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time

from lich_dev.procs import ROOT, daemon_env, stop
from lich_control.bridge_server import Address, DaemonConnection


def daemon_request(address, method, url, body=None, headers=None, timeout=10.0):
    """One request on a connection of its own to `address` (an Address): (status, body)."""
    conn = DaemonConnection(address, timeout)
    try:
        return conn.exchange(method, url, body, headers)
    finally:
        conn.close()


class Relay:
    """The daemon started the way the relay starts it, and the relay's half of the bridge."""

    def __init__(self, env, args=(), stdin=subprocess.PIPE, module="lich_control", stderr=subprocess.PIPE, preexec_fn=None):
        # module: lich_dev.sim for the daemon on the simulated session; stderr:
        # a descriptor of the test's own, which then reads it itself
        self.env = env
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=ROOT,
            env=daemon_env(**env),
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=stderr,
            preexec_fn=preexec_fn,
        )
        self.argv = _cmdline(self.proc.pid)
        self.stdout_raw = []
        self.lines = queue.Queue()
        self.stderr_lines = []
        self.hello = None
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True)]
        if self.proc.stderr is not None:
            self._readers.append(threading.Thread(target=self._read_stderr, daemon=True))
        for reader in self._readers:
            reader.start()

    def _read_stdout(self):
        for raw in self.proc.stdout:
            self.stdout_raw.append(raw)
            self.lines.put(json.loads(raw))
        self.lines.put(None)

    def _read_stderr(self):
        for raw in self.proc.stderr:
            self.stderr_lines.append(raw.decode("utf-8", "replace"))

    def next_line(self, timeout=10.0):
        line = self.lines.get(timeout=timeout)
        if line is None:
            raise AssertionError("the daemon closed its stdout")
        return line

    def wait_hello(self, timeout=10.0):
        self.hello = self.next_line(timeout)
        assert self.hello["op"] == "hello", self.hello
        return self.hello

    def next_call(self, timeout=10.0):
        line = self.next_line(timeout)
        assert line["op"] == "call", line
        return line

    @property
    def run_dir(self):
        return os.path.dirname(self.hello["socket"]) if "socket" in self.hello else self.env["LICH_CONTROL_RUN_DIR"]

    @property
    def address(self):
        return Address.of(self.hello)

    def post(self, url, body):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return daemon_request(self.address, "POST", url, data, {"Content-Type": "application/json"})

    def result(self, call_id, value=None, error=None):
        body = {"id": call_id, "ok": False, "error": error} if error is not None else {"id": call_id, "ok": True, "value": value}
        status, _ = self.post("/v1/result", body)
        assert status == 204, status

    def event(self, name, turn_id):
        status, _ = self.post("/v1/event", {"event": name, "turnId": turn_id})
        assert status == 204, status

    def status(self):
        status, body = daemon_request(self.address, "GET", "/v1/status")
        assert status == 200, status
        return json.loads(body)

    def wait_status(self, predicate, timeout=10.0):
        """The status, once `predicate` holds for it. Nothing outside the daemon
        marks the moment it records a change, so this re-asks, each read a
        blocking round trip on the socket (no sleep), until a deadline."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status()
            if predicate(status):
                return status
            assert time.monotonic() < deadline, f"the status never matched: {status}"

    def autoanswer(self, fork_text="an answer"):
        """Answer every call at once, as a healthy session would; returns the calls seen."""
        seen = _Seen()

        def run():
            turn = 0
            while True:
                line = self.lines.get()
                if line is None:
                    return
                if line.get("op") != "call":
                    continue
                seen.add(line)
                method, value = line["method"], None
                if method == "prompt.submit":
                    turn += 1
                    self.event("turn.start", f"t{turn}")
                    value = {"text": line["args"]["text"]}
                elif method == "model.fork":
                    value = {"isAnswered": True, "text": fork_text, "usage": {}}
                elif method == "command.run":
                    value = {"text": "ran"}
                try:
                    self.result(line["id"], value)
                except (OSError, AssertionError):
                    return  # the daemon is gone

        threading.Thread(target=run, daemon=True).start()
        return seen

    def wait_exit(self, timeout=10.0):
        return self.proc.wait(timeout)

    def stop(self):
        """Stop the daemon, and leave what it printed for the token scan."""
        stop(self.proc)
        for reader in self._readers:
            reader.join(5)  # its last lines: they end at the daemon's exit
        self._keep_for_scan()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream:
                try:
                    stream.close()
                except OSError:
                    pass

    def _keep_for_scan(self):
        folder = os.environ.get("LICH_TEST_SCAN_DIR")
        if not folder:
            return
        name = os.path.join(folder, f"daemon-{self.proc.pid}")
        with open(name + ".stdout", "wb") as f:
            f.write(b"".join(self.stdout_raw))
        with open(name + ".stderr", "w") as f:
            f.write("".join(self.stderr_lines))
        with open(name + ".argv", "wb") as f:
            f.write(self.argv)


def started(relay, lich, **kw):
    """A daemon from the `relay` fixture, past its hello and holding a poll at lich."""
    r = relay(**kw)
    r.wait_hello()
    assert lich.wait_polled("s1", 10.0, parked=True)
    return r


def full_pipe():
    """A pipe whose buffer is full, for a stream nobody reads: the next
    blocking write to it would wait."""
    read_fd, write_fd = os.pipe()
    if os.name == "nt":
        from lich_control import windows

        windows.nonblocking(write_fd)
        try:
            while os.write(write_fd, b"x" * 4096) == 4096:
                pass
        except OSError:
            pass
        windows.nonblocking(write_fd, wait=True)
        return read_fd, write_fd
    os.set_blocking(write_fd, False)
    try:
        while True:
            os.write(write_fd, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(write_fd, True)  # the writer under test is given a plain, blocking pipe
    return read_fd, write_fd


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


class _Seen:
    def __init__(self):
        self.calls = []
        self.cond = threading.Condition()

    def add(self, call):
        with self.cond:
            self.calls.append(call)
            self.cond.notify_all()

    def wait(self, n, timeout=10.0):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.calls) >= n, timeout), f"only {len(self.calls)} calls"
            return list(self.calls)
