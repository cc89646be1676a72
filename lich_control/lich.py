"""LichClient: the two HTTP exchanges with lich, and nothing else.

HTTP/1.1 on one keep-alive connection to loopback, with the standard
library's `http.client`. (It was `requests` until the benchmark measured it:
`import requests` alone cost ~110 ms and ~14 MB of the daemon's 150 ms and
30 MB budgets, and each ack ~1 ms of CPU against 0.25 ms here; see
docs/performance.md.) A client is used by one thread only; `abandon` is the
one call another thread may make.

Every error leaves here as a short phrase: no exception text of the network
stack is ever passed on, so no URL, and so no token, reaches a log.
"""
from __future__ import annotations

import errno
import http.client
import json
import select
import socket
import threading
from typing import Any, List, Optional, Tuple
from urllib.parse import quote

from . import __version__
from .acks import Ack
from .config import Config

# (connect, read) in seconds. lich holds a poll up to 25 s and Claude Code's
# own fetch gave up at 30 s: the read timeout sits between the two.
POLL_TIMEOUT = (3.0, 28.0)
ACK_TIMEOUT = (3.0, 10.0)
MAX_POLL_BODY = 16 * 1024 * 1024
MAX_ACK_ANSWER = 64 * 1024  # what is read of lich's answer to an ack (a reason)
HEADERS = {"X-Lich-Plugin": __version__, "Accept": "application/json"}
ACK_HEADERS = {"X-Lich-Plugin": __version__, "Content-Type": "application/json"}


class LichGone(Exception):
    """lich answered 404: it predates the contract; stop polling for good."""


class PollFailed(Exception):
    """The poll got no usable answer; back off and try again."""


class AckFailed(Exception):
    """The ack did not reach lich, or lich refused it."""

    def __init__(self, reason: str, refused: bool = False):
        super().__init__(reason)
        self.refused = refused  # lich answered 4xx: retrying would not help


class _Failed(Exception):
    """The exchange failed; the text is already a safe phrase."""


class LichClient:
    def __init__(self, config: Config):
        token, sid = quote(config.token, safe=""), quote(config.session_id, safe="")
        self._poll_path = f"/mod/commands?token={token}&session_id={sid}"
        self._ack_path = f"/mod/acks?token={token}"
        self._port = config.port
        self._conn: Optional[http.client.HTTPConnection] = None
        self._sockets = _SocketWatch()

    def poll(self) -> List[Any]:
        """One long poll: the commands lich answered with, oldest first."""
        try:
            status, _, body = self._exchange("GET", self._poll_path, None, HEADERS, POLL_TIMEOUT, MAX_POLL_BODY)
        except _Failed as exc:
            raise PollFailed(str(exc)) from None
        if status == 404:
            raise LichGone("lich answered 404")
        if status != 200:
            raise PollFailed(f"lich answered {status}")
        try:
            items = json.loads(body)
        except ValueError:
            raise PollFailed("lich answered 200 with a body that is not JSON") from None
        if not isinstance(items, list):
            raise PollFailed("lich answered 200 with JSON that is not an array")
        return items

    def ack(self, ack: Ack) -> None:
        """Post one ack; AckFailed says why it did not land."""
        body = ack.body()
        try:
            status, reason, text = self._exchange("POST", self._ack_path, body, ACK_HEADERS, ACK_TIMEOUT, MAX_ACK_ANSWER)
        except _Failed as exc:
            raise AckFailed(str(exc)) from None
        if 200 <= status < 300:
            return
        said = _one_line(text.decode("utf-8", "replace")) or reason or "no reason given"
        raise AckFailed(f"lich refused it: {status} {said}", refused=status < 500)

    def abandon(self) -> None:
        """Cut any request in flight from another thread (a parked poll at shutdown)."""
        self._sockets.shut_all()

    def close(self) -> None:
        self._drop()

    # -- one exchange on the kept-alive connection ---------------------------

    def _exchange(self, method: str, path: str, body: Optional[bytes], headers: dict, timeout: Tuple[float, float], limit: int):
        """(status, reason, body) of one request. Never resent: a request
        that failed may have reached lich, and a poll or an ack must not
        be taken twice. A kept connection lich has closed meanwhile is
        noticed before the request goes out, and replaced."""
        conn = self._connection(timeout[0])
        try:
            conn.sock.settimeout(timeout[1])
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = _read_capped(resp, limit)
        except _Failed:
            self._drop()
            raise
        except socket.timeout:
            self._drop()
            raise _Failed("lich did not answer in time") from None
        except (OSError, http.client.HTTPException) as exc:
            self._drop()
            raise _Failed(_describe(exc)) from None
        if resp.will_close:
            self._drop()
        return resp.status, resp.reason, data

    def _connection(self, connect_timeout: float) -> http.client.HTTPConnection:
        if self._conn is not None and _closed_by_peer(self._conn.sock):
            self._drop()
        if self._conn is None:
            conn = http.client.HTTPConnection("127.0.0.1", self._port, timeout=connect_timeout)
            try:
                conn.connect()
            except socket.timeout:
                conn.close()
                raise _Failed(f"could not connect to lich on port {self._port} in time") from None
            except ConnectionRefusedError:
                conn.close()
                raise _Failed(f"nothing listens on port {self._port} (is lich running?)") from None
            except OSError as exc:
                conn.close()
                raise _Failed(f"could not connect to lich on port {self._port} ({_errno_name(exc)})") from None
            # Headers and body go out in one write; no wait on the peer's delayed ack.
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets.add(conn.sock)
            self._conn = conn
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _describe(exc: BaseException) -> str:
    """A phrase for a failed exchange, never its text."""
    if isinstance(exc, http.client.IncompleteRead):
        return "lich's answer broke off"
    if isinstance(exc, ConnectionResetError):
        return "lich reset the connection"
    if isinstance(exc, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionAbortedError)):
        return "the connection to lich broke"
    if isinstance(exc, http.client.HTTPException):
        return f"lich's answer was not HTTP ({type(exc).__name__})"
    return f"the connection to lich broke ({_errno_name(exc)})"


def _errno_name(exc: BaseException) -> str:
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code, type(exc).__name__) if code else type(exc).__name__


def _read_capped(resp: http.client.HTTPResponse, limit: int) -> bytes:
    too_large = f"lich's answer is over {limit // (1024 * 1024)} MiB" if limit >= 1024 * 1024 else f"lich's answer is over {limit // 1024} KiB"
    if resp.length is not None:
        if resp.length > limit:
            raise _Failed(too_large)
        return resp.read()
    chunks, size = [], 0  # chunked, or up to the close: read it in pieces
    while True:
        chunk = resp.read(65536)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > limit:
            raise _Failed(too_large)
        chunks.append(chunk)


def _closed_by_peer(sock: Optional[socket.socket]) -> bool:
    """A kept connection with something to read before we asked: lich closed
    it (or broke the protocol); either way it is not to be reused."""
    if sock is None or sock.fileno() == -1:
        return True
    poller = select.poll()  # not select(): no limit on the descriptor's number
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 200 else line[:200] + "…"


class _SocketWatch:
    """The sockets of this client's open connections, so another thread can
    cut a request that is parked in a blocking read."""

    def __init__(self):
        self._lock = threading.Lock()
        self._socks = []

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks = [s for s in self._socks if s.fileno() != -1] + [sock]

    def shut_all(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, []
        for sock in socks:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
