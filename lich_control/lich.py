"""LichClient: the two HTTP exchanges with lich, and nothing else.

HTTP/1.1 on one keep-alive connection to loopback. It was `requests`, then
`http.client`, until the benchmark measured them (docs/performance.md):
`import requests` alone cost ~110 ms and ~14 MB of the daemon's 150 ms and
30 MB budgets; `http.client` sent each ack in two writes and parsed every
answer's headers with the email package. Here a request goes out in one
write and the answer is read by a lean HTTP/1.1 reader (status line,
Content-Length or chunked, Connection). A client is used by one thread
only; `abandon` is the one call another thread may make.

Every error leaves here as a short phrase: no exception text of the network
stack is ever passed on, so no URL, and so no token, reaches a log.
"""
from __future__ import annotations

import errno
import json
import select
import socket
import threading
from typing import Any, List, Optional, Tuple
from urllib.parse import quote

from . import __version__
from .ack import Ack
from .config import Config

# (connect, read) in seconds. lich holds a poll up to 25 s and Claude Code's
# own fetch gave up at 30 s: the read timeout sits between the two.
POLL_TIMEOUT = (3.0, 28.0)
ACK_TIMEOUT = (3.0, 10.0)
MAX_POLL_BODY = 16 * 1024 * 1024
MAX_ACK_ANSWER = 64 * 1024  # what is read of lich's answer to an ack (a reason)
MAX_LINE = 65536  # a status line or a header line of lich's answer
MAX_HEADERS = 100
HEADERS = f"X-Lich-Plugin: {__version__}\r\nAccept: application/json\r\n"
ACK_HEADERS = f"X-Lich-Plugin: {__version__}\r\nContent-Type: application/json\r\n"


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
        self._conn: Optional["_Connection"] = None
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

    def _exchange(self, method: str, path: str, body: Optional[bytes], headers: str, timeout: Tuple[float, float], limit: int):
        """(status, reason, body) of one request. Never resent: a request
        that failed may have reached lich, and a poll or an ack must not
        be taken twice. A kept connection lich has closed meanwhile is
        noticed before the request goes out, and replaced."""
        conn = self._connection(timeout[0])
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self._port}\r\n{headers}"
        if body is not None:
            head += f"Content-Length: {len(body)}\r\n"
        try:
            conn.timeout(timeout[1])
            conn.sock.sendall((head + "\r\n").encode("latin-1") + (body or b""))  # one write
            status, reason, data, will_close = conn.read_answer(limit)
        except _Failed:
            self._drop()
            raise
        except socket.timeout:
            self._drop()
            raise _Failed("lich did not answer in time") from None
        except OSError as exc:
            self._drop()
            raise _Failed(_describe(exc)) from None
        if will_close:
            self._drop()
        return status, reason, data

    def _connection(self, connect_timeout: float) -> "_Connection":
        if self._conn is not None and self._conn.closed_by_peer():
            self._drop()
        if self._conn is None:
            try:
                sock = socket.create_connection(("127.0.0.1", self._port), timeout=connect_timeout)
            except socket.timeout:
                raise _Failed(f"could not connect to lich on port {self._port} in time") from None
            except ConnectionRefusedError:
                raise _Failed(f"nothing listens on port {self._port} (is lich running?)") from None
            except OSError as exc:
                raise _Failed(f"could not connect to lich on port {self._port} ({_errno_name(exc)})") from None
            # Small requests go out at once: no wait on the peer's delayed ack.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets.add(sock)
            self._conn = _Connection(sock, connect_timeout)
        return self._conn

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _Connection:
    """One kept-alive connection to lich and the reader of its answers."""

    def __init__(self, sock: socket.socket, timeout: float):
        self.sock = sock
        self._timeout = timeout
        self._rfile = sock.makefile("rb")
        self._poller = select.poll()  # not select(): no limit on the descriptor's number
        self._poller.register(sock, select.POLLIN)

    def timeout(self, seconds: float) -> None:
        if seconds != self._timeout:  # each settimeout is a system call
            self.sock.settimeout(seconds)
            self._timeout = seconds

    def closed_by_peer(self) -> bool:
        """Something to read before we asked: lich closed the connection (or
        broke the protocol); either way it is not to be reused."""
        return self.sock.fileno() == -1 or bool(self._poller.poll(0))

    def read_answer(self, limit: int):
        """(status, reason, body, will_close) of one answer; _Failed with a phrase."""
        while True:
            version, status, reason = self._status_line()
            headers = self._headers()
            if not 100 <= status < 200:
                break  # an interim answer (100 Continue) is skipped, as http.client did
        connection = headers.get("connection", "").lower()
        will_close = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
        if status in (204, 304):
            return status, reason, b"", will_close
        if headers.get("transfer-encoding", "").lower() == "chunked":
            return status, reason, self._chunked(limit), will_close
        length = headers.get("content-length")
        if length is None:  # the body runs up to the close
            return status, reason, self._read_capped(-1, limit), True
        if not length.isdigit():
            raise _Failed("lich's answer was not HTTP (a bad Content-Length)")
        if int(length) > limit:
            raise _Failed(_too_large(limit))
        body = self._rfile.read(int(length))
        if len(body) < int(length):
            raise _Failed("lich's answer broke off")
        return status, reason, body, will_close

    def _status_line(self):
        line = self._rfile.readline(MAX_LINE + 1)
        if not line:
            raise _Failed("the connection to lich broke")
        parts = line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
            raise _Failed("lich's answer was not HTTP (a bad status line)")
        return parts[0], int(parts[1]), parts[2].strip() if len(parts) == 3 else ""

    def _headers(self) -> dict:
        headers = {}
        for _ in range(MAX_HEADERS + 1):
            line = self._rfile.readline(MAX_LINE + 1)
            if len(line) > MAX_LINE:
                raise _Failed("lich's answer was not HTTP (a header line is too long)")
            if line in (b"\r\n", b"\n"):
                return headers
            if not line:
                raise _Failed("lich's answer broke off")
            name, colon, value = line.decode("latin-1").partition(":")
            if colon:
                headers[name.strip().lower()] = value.strip()
        raise _Failed("lich's answer was not HTTP (too many header lines)")

    def _chunked(self, limit: int) -> bytes:
        parts, size = [], 0
        while True:
            line = self._rfile.readline(MAX_LINE + 1)
            if not line:
                raise _Failed("lich's answer broke off")
            try:
                n = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise _Failed("lich's answer was not HTTP (a bad chunk)") from None
            if n == 0:
                self._headers()  # trailers, up to the blank line
                return b"".join(parts)
            size += n
            if size > limit:
                raise _Failed(_too_large(limit))
            parts.append(self._read_capped(n, n))
            self._rfile.readline(MAX_LINE + 1)  # the chunk's line end

    def _read_capped(self, n: int, limit: int) -> bytes:
        """n bytes (-1: up to the close), at most `limit` of them."""
        if n >= 0:
            data = self._rfile.read(n)
            if len(data) < n:
                raise _Failed("lich's answer broke off")
            return data
        chunks, size = [], 0
        while True:
            chunk = self._rfile.read1(65536)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > limit:
                raise _Failed(_too_large(limit))
            chunks.append(chunk)

    def close(self) -> None:
        self._rfile.close()
        self.sock.close()


def _too_large(limit: int) -> str:
    return f"lich's answer is over {limit // (1024 * 1024)} MiB" if limit >= 1024 * 1024 else f"lich's answer is over {limit // 1024} KiB"


def _describe(exc: OSError) -> str:
    """A phrase for a failed exchange, never its text."""
    if isinstance(exc, ConnectionResetError):
        return "lich reset the connection"
    if isinstance(exc, (BrokenPipeError, ConnectionAbortedError)):
        return "the connection to lich broke"
    return f"the connection to lich broke ({_errno_name(exc)})"


def _errno_name(exc: BaseException) -> str:
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code, type(exc).__name__) if code else type(exc).__name__


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 200 else line[:200] + "…"


class _SocketWatch:
    """The sockets of this client's open connections, so another thread can
    cut a request that is parked in a blocking read."""

    def __init__(self):
        self._lock = threading.Lock()
        self._socks = []
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
