"""The bound on the relay's connections to the daemon's socket.

Each connection costs a thread and a descriptor, so only so many stay open
at once, and one idle too long is closed by its own thread. At the bound a
new connection takes the place of the one idle the longest: one waiting for
its next request that has not begun it, so no request under way is cut, and
the relay, which posts on a connection it has just opened or just used, gets
in however many idle ones others hold. A request stalled in its head or body
past `stall_seconds` may give way too (the relay writes each request at
once). With no place within a moment the new connection is refused: closed
unanswered.
"""
from __future__ import annotations

import select
import socket
import threading
import time
from typing import Callable, Dict, List, Optional

import attrs

IDLE, READING, ANSWERING = "idle", "reading", "answering"
# How long a new connection at the bound may wait for a place: a closed
# connection's thread ends at once, and a request just answered makes its
# connection idle in a moment.
PLACE_WAIT = 1.0


@attrs.frozen
class SocketLimits:
    connections: int = 64
    idle_seconds: float = 60.0
    stall_seconds: float = 10.0


class _Entry:
    __slots__ = ("sock", "state", "since", "closing")

    def __init__(self, sock: socket.socket, since: float):
        self.sock, self.state, self.since, self.closing = sock, IDLE, since, False


class Connections:
    """The open connections and what each is doing.

    Shared by the accepting thread (admit) and each connection's thread (its
    own entry's state, and close); one condition guards the table, and a
    socket is shut down or closed only under it, so the accepting thread never
    acts on a descriptor another thread has closed and the system reused.
    """

    def __init__(self, limits: SocketLimits, clock: Callable[[], float] = time.monotonic):
        self.limits = limits
        self._clock = clock
        self._cond = threading.Condition()
        self._open: Dict[socket.socket, _Entry] = {}

    def __len__(self) -> int:
        with self._cond:
            return len(self._open)

    def wait_until(self, predicate: Callable[[List[str]], bool], timeout: float) -> bool:
        """Until `predicate` holds for the open connections' states, in the
        order they were admitted; False if `timeout` runs out first."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate([e.state for e in self._open.values() if not e.closing]), timeout)

    def admit(self, sock: socket.socket) -> bool:
        """The accepting thread: True once `sock` has a place, False to refuse
        it. At the bound it closes one connection that may give way, and
        waits a moment for its place, or for one to become idle (a request
        answered an instant ago); failing both, the newcomer is refused."""
        with self._cond:
            deadline = time.monotonic() + PLACE_WAIT
            while len(self._open) >= self.limits.connections:
                if not any(e.closing for e in self._open.values()):
                    victim = self._victim()
                    if victim is not None:
                        victim.closing = True
                        _hang_up(victim.sock)  # its thread wakes, ends, and calls close
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            self._open[sock] = _Entry(sock, self._clock())
            return True

    def idle(self, sock: socket.socket) -> None:
        """The connection's thread: waiting for the first byte of its next request."""
        self._mark(sock, IDLE)

    def reading(self, sock: socket.socket) -> bool:
        """The connection's thread: a request has begun. False if the
        connection was given up first; its thread then ends it unanswered."""
        return self._mark(sock, READING)

    def answering(self, sock: socket.socket) -> None:
        """The connection's thread: the request is read, its answer under way."""
        self._mark(sock, ANSWERING)

    def close(self, sock: socket.socket) -> None:
        """Any thread: close `sock` and free its place."""
        with self._cond:
            self._open.pop(sock, None)
            _hang_up(sock, socket.SHUT_WR)  # as socketserver does: the answer is not cut
            sock.close()
            self._cond.notify_all()

    def _mark(self, sock: socket.socket, state: str) -> bool:
        with self._cond:
            entry = self._open.get(sock)
            if entry is None or entry.closing:
                return False
            entry.state, entry.since = state, self._clock()
            self._cond.notify_all()
            return True

    def _victim(self) -> Optional[_Entry]:
        now = self._clock()
        live = [e for e in self._open.values() if not e.closing]
        # Readable: its next request is arriving; it counts as begun.
        idle = [e for e in live if e.state == IDLE and not _readable(e.sock)]
        stalled = [e for e in live if e.state == READING and now - e.since >= self.limits.stall_seconds]
        return min(idle or stalled, key=lambda e: e.since, default=None)


def _readable(sock: socket.socket) -> bool:
    probe = select.poll()
    probe.register(sock, select.POLLIN)
    return bool(probe.poll(0))


def _hang_up(sock: socket.socket, how: int = socket.SHUT_RDWR) -> None:
    # SHUT_RDWR wakes a thread blocked reading the socket.
    try:
        sock.shutdown(how)
    except OSError:
        pass  # already hung up, or closed
