"""In-process stand-ins for the tests of one object at a time."""
from __future__ import annotations

import json
import socket
import struct
import threading

from lich_control.bridge import CallResult, PendingCalls
from lich_control.lich import AckFailed


class Timeline:
    """One ordered record of what the stand-ins were asked, each entry with
    the name of the thread that asked: what happened on one thread, and in
    which order, is read from it after the fact, with no window to time."""

    def __init__(self):
        self._lock = threading.Lock()
        self._entries = []

    def note(self, what):
        with self._lock:
            self._entries.append((threading.current_thread().name, what))

    @property
    def entries(self):
        with self._lock:
            return list(self._entries)


class Clock:
    """A clock that stands still until the test moves `now`."""

    def __init__(self, now=1000.0):
        self.now = now

    def __call__(self):
        return self.now


class ScriptedClient:
    """A LichClient whose polls follow a script and whose acks are recorded.

    Each script entry is a list (the poll's answer) or an exception to raise.
    Once the script runs out, a poll blocks until `abandon` (as a parked poll would).
    An ack is noted on `timeline` as it returns: answered, as far as its sender knows.
    """

    def __init__(self, script=(), ack_errors=(), timeline=None):
        self.script = list(script)
        self.ack_errors = list(ack_errors)
        self.timeline = timeline or Timeline()
        self.acks = []
        self.polls = 0
        self.abandoned = threading.Event()
        self.cond = threading.Condition()

    def poll(self):
        self.polls += 1
        if self.script:
            step = self.script.pop(0)
            if isinstance(step, BaseException):
                raise step
            return json.dumps(step).encode()  # a 200's body, which the poller reads
        self.abandoned.wait(10)
        from lich_control.lich import PollFailed

        raise PollFailed("abandoned")

    def ack(self, ack):
        with self.cond:
            error = self.ack_errors.pop(0) if self.ack_errors else None
            if error is None:
                self.acks.append(ack)
            self.timeline.note(f"acked {ack.id}" if error is None else f"ack failed {ack.id}")
            self.cond.notify_all()
        if error is not None:
            raise error

    def wait_acks(self, n, timeout=5.0):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.acks) >= n, timeout), f"only {len(self.acks)} acks: {self.acks}"
            return list(self.acks)

    def abandon(self):
        self.abandoned.set()

    def close(self):
        pass


class FakeEngine:
    """Records every call (and on `timeline`, the thread that made it) as
    (method, args, timeout). Its Futures are `PendingCalls`', as the
    bridge's are: the test settles them, or their deadlines do."""

    def __init__(self, timeline=None):
        self.calls = []
        self.ids = []
        self.pending = PendingCalls()
        self.cond = threading.Condition()
        self.timeline = timeline or Timeline()

    def call(self, method, args, timeout):
        call_id, future = self.pending.add(method, timeout)
        with self.cond:
            self.calls.append((method, args, timeout))
            self.ids.append(call_id)
            self.timeline.note(f"call {method}")
            self.cond.notify_all()
        return future

    def close(self, reason):
        self.pending.close(reason)

    def wait_calls(self, n, timeout=5.0):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.calls) >= n, timeout), f"only {len(self.calls)} calls: {self.calls}"
            return list(self.calls)

    def settle(self, index, value=None, error=None):
        return self.pending.settle(self.ids[index], CallResult.failed(error) if error is not None else CallResult.answered(value))


def refused(reason="400 nope"):
    return AckFailed(f"lich refused it: {reason}", refused=True)


class RawAnswer:
    """A loopback port that answers every connection with the same bytes,
    whatever they are, then closes: what no HTTP server library would send.
    With `answer=None` it resets each connection at once, unread: a dead
    lich's port, but one that counts the retries. `wait(n)` returns once n
    connections have been answered."""

    def __init__(self, answer, port=0):
        self.sock = socket.create_server(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        self.answer = answer
        self.answered = 0
        self.cond = threading.Condition()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            with conn:
                try:
                    if self.answer is None:
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    else:
                        conn.recv(65536)
                        conn.sendall(self.answer)
                        conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass  # the client gave up first (a parser refused the head)
            with self.cond:
                self.answered += 1
                self.cond.notify_all()

    def wait(self, n, timeout=10.0):
        with self.cond:
            assert self.cond.wait_for(lambda: self.answered >= n, timeout), f"{self.answered} answered"

    def close(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self.sock.close()
