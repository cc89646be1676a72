"""The loopback connection under LichClient: urllib3's, with three duties added.

- `abandon`: the sockets of a client's connections are watched, so another
  thread can cut a request parked in a blocking read (SocketWatch).
- A deadline per exchange: every read and write of a connection ends by the
  time the client set for the exchange in flight (Deadline, DeadlineSocket).
- A new connection carries nothing to a program of another user: the owner
  of the socket that accepted it is checked before the request is written.
"""
from __future__ import annotations

import functools
import socket
import threading
import time
from typing import Any, List, Optional

from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool

from .peer import peer_uid


class ForeignListener(Exception):
    """The program on the other end belongs to another user; the text is a safe phrase."""


class SocketWatch:
    """The sockets of one client's open connections, so another thread can
    cut a request that is parked in a blocking read."""

    def __init__(self):
        self._lock = threading.Lock()
        self._socks: List[socket.socket] = []
        self._abandoned = False

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks = [s for s in self._socks if s.fileno() != -1] + [sock]
            abandoned = self._abandoned
        if abandoned:
            # Opened after the cut, by a poll already past its stop check:
            # cut too, or it would park for 25 s and take commands nobody applies.
            sock.shutdown(socket.SHUT_RDWR)

    def shut_all(self) -> None:
        with self._lock:
            self._abandoned = True
            socks, self._socks = self._socks, []
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Deadline:
    """When the exchange in flight must be over, on the monotonic clock; None
    between exchanges. Set and read only by the thread using the client."""

    def __init__(self) -> None:
        self.at: Optional[float] = None

    def start(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def clear(self) -> None:
        self.at = None


class DeadlineSocket(socket.socket):
    """A connection's socket whose reads and writes end by the exchange's
    deadline: urllib3's timeout is per read, and a lich that sends a byte
    now and then would keep an exchange open for ever. http.client reads the
    status line, headers, interim answers and body through `recv_into`."""

    _timeout: Optional[float] = None  # the timeout urllib3 set, for one read

    @classmethod
    def taking_over(cls, sock: socket.socket, deadline: Deadline) -> "DeadlineSocket":
        timeout = sock.gettimeout()
        new = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        new._deadline = deadline
        new.settimeout(timeout)
        return new

    def settimeout(self, value: Optional[float]) -> None:
        self._timeout = value
        super().settimeout(value)

    def recv_into(self, *args: Any) -> int:
        self._cap()
        return super().recv_into(*args)

    def recv(self, *args: Any) -> bytes:
        self._cap()
        return super().recv(*args)

    def sendall(self, *args: Any) -> None:
        self._cap()
        super().sendall(*args)

    def _cap(self) -> None:
        at = self._deadline.at
        if at is None:
            return
        left = at - time.monotonic()
        if left <= 0:
            raise socket.timeout("the exchange's deadline passed")
        if self._timeout is None or left < self._timeout:
            super().settimeout(left)


class _WatchedConnection(HTTPConnection):
    """urllib3's connection: it sends nothing to a program of another user,
    keeps each exchange to its deadline, and reports each socket it opens
    to the watch."""

    def __init__(self, *args: Any, sockets: SocketWatch, deadline: Deadline, uid: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._watch = sockets
        self._deadline = deadline
        self._uid = uid

    def connect(self) -> None:
        super().connect()
        # Before the request, and so the token, is written to it.
        owner = peer_uid(self.sock)
        if owner is not None and owner != self._uid:
            self.sock.close()
            raise ForeignListener(f"the program listening on port {self.port} belongs to another user (uid {owner}); the token is not sent")
        self.sock = DeadlineSocket.taking_over(self.sock, self._deadline)
        self._watch.add(self.sock)


class _WatchedPool(HTTPConnectionPool):
    ConnectionCls = _WatchedConnection  # the pool hands its extra keywords (`sockets`, ...) to it


class CuttableAdapter(HTTPAdapter):
    """One kept-alive connection, no retries (the default, kept), and the
    sockets of its connections remembered for `abandon`. `deadline` is the
    client's, `uid` the user a listener must belong to."""

    def __init__(self, deadline: Deadline, uid: int):
        self.sockets = SocketWatch()
        self._connection_kwargs = {"sockets": self.sockets, "deadline": deadline, "uid": uid}
        super().__init__(pool_connections=1, pool_maxsize=1)

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": functools.partial(_WatchedPool, **self._connection_kwargs)}
