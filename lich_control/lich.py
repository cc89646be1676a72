"""LichClient: the two HTTP exchanges with lich, on `requests`, and nothing else.

Each client owns one `requests.Session` and is used by one thread (the
poller, the worker, the acker, each ask thread); `abandon` is the one call
another thread may make. The session keeps one connection to loopback alive,
reads no proxy or `.netrc` from the environment, never retries, and streams
each answer so no more than its limit is ever read.

Every error leaves here as a short phrase: the exception texts of `requests`
and `urllib3` hold the URL, and so the token, and none of them is passed on.
"""
from __future__ import annotations

import errno
import functools
import http.client
import socket
import threading
from typing import Any, Iterator, List, Optional, Tuple
from urllib.parse import quote

import requests
import urllib3
from requests.adapters import HTTPAdapter
from requests.structures import CaseInsensitiveDict
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool

from . import CONTRACT_RELEASE, __version__
from .ack import Ack
from .batch import Answer, NotAnArray, read_answer
from .config import Config

# (connect, read) in seconds. lich holds a poll up to 25 s and Claude Code's
# own fetch gave up at 30 s: the read timeout sits between the two.
POLL_TIMEOUT = (3.0, 28.0)
ACK_TIMEOUT = (3.0, 10.0)
MAX_POLL_BODY = 16 * 1024 * 1024
MAX_ACK_ANSWER = 64 * 1024  # what is read of lich's answer to an ack (a reason)
CHUNK = 64 * 1024
HEADERS = {
    "X-Lich-Plugin": CONTRACT_RELEASE,  # the contract we speak, which lich checks: not our version
    "User-Agent": f"lich-control/{__version__}",
    "Accept": "application/json",
    # Loopback gains nothing from compression, and the limits are then on bytes read.
    "Accept-Encoding": "identity",
}


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
        self._port = config.port
        token, sid = quote(config.token, safe=""), quote(config.session_id, safe="")
        base = config.lich_url
        self._adapter = _CuttableAdapter()
        self._session = _LichSession()
        self._session.trust_env = False
        self._session.headers = CaseInsensitiveDict(HEADERS)
        self._session.mount("http://", self._adapter)
        # Prepared once: every poll is the same request, and every ack differs
        # only in its body.
        self._poll = self._session.prepare_request(requests.Request("GET", f"{base}/mod/commands?token={token}&session_id={sid}"))
        self._ack = self._session.prepare_request(
            requests.Request("POST", f"{base}/mod/acks?token={token}", headers={"Content-Type": "application/json"})
        )

    def poll(self) -> Answer:
        """One long poll: the commands lich answered with, oldest first."""
        try:
            status, _, body = self._exchange(self._poll, POLL_TIMEOUT, MAX_POLL_BODY)
        except _Failed as exc:
            raise PollFailed(str(exc)) from None
        if status == 404:
            raise LichGone("lich answered 404")
        if status != 200:
            raise PollFailed(f"lich answered {status}")
        try:
            return read_answer(body)  # read item by item as the poller takes them: batch.py
        except NotAnArray as exc:
            raise PollFailed(f"lich answered 200 with {exc}") from None

    def ack(self, ack: Ack) -> None:
        """Post one ack; AckFailed says why it did not land."""
        request = self._ack.copy()
        request.prepare_body(data=ack.body(), files=None)
        try:
            status, reason, text = self._exchange(request, ACK_TIMEOUT, MAX_ACK_ANSWER)
        except _Failed as exc:
            raise AckFailed(str(exc)) from None
        if 200 <= status < 300:
            return
        said = _one_line(text.decode("utf-8", "replace")) or reason or "no reason given"
        raise AckFailed(f"lich refused it: {status} {said}", refused=status < 500)

    def abandon(self) -> None:
        """Cut any request in flight from another thread (a parked poll at shutdown)."""
        self._adapter.sockets.shut_all()

    def close(self) -> None:
        self._session.close()

    def _exchange(self, request: requests.PreparedRequest, timeout: Tuple[float, float], limit: int):
        """(status, reason, body) of one request, sent once: one that failed
        may have reached lich, and a poll or an ack must not be taken twice.
        A kept connection lich closed meanwhile is noticed by urllib3 before
        the request goes out, and replaced."""
        try:
            response = self._session.send(request, stream=True, timeout=timeout, allow_redirects=False, proxies={})
            try:
                body = _read_capped(response, limit)
            finally:
                response.close()  # a body left unread closes the connection, never reuses it
        except _WIRE_ERRORS as exc:
            raise _Failed(_describe(exc, self._port)) from None
        return response.status_code, response.reason, body


# What a request can raise on the way or on a hostile answer: requests wraps
# nearly all of it, and what it lets through of urllib3 and http.client is
# still one failed exchange, never a dead poller.
_WIRE_ERRORS = (requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)


class _LichSession(requests.Session):
    """A Session that never follows a redirect: lich sends none, and to
    follow one `requests` would first read its whole body, past any limit."""

    def get_redirect_target(self, resp: requests.Response) -> Optional[str]:
        return None


def _read_capped(response: requests.Response, limit: int) -> bytes:
    declared = response.headers.get("Content-Length", "")
    # isascii: headers arrive as Latin-1, and "²" is a digit to isdigit but not to int.
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise _Failed(_too_large(limit))
    chunks, size = [], 0
    for chunk in response.iter_content(CHUNK):
        size += len(chunk)
        if size > limit:
            raise _Failed(_too_large(limit))
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> str:
    return f"lich's answer is over {limit // (1024 * 1024)} MiB" if limit >= 1024 * 1024 else f"lich's answer is over {limit // 1024} KiB"


def _describe(exc: BaseException, port: int) -> str:
    """A phrase for a failed exchange, from the exception's type and causes, never its text."""
    if isinstance(exc, requests.ConnectTimeout):
        return f"could not connect to lich on port {port} in time"
    if isinstance(exc, requests.ReadTimeout):
        return "lich did not answer in time"
    causes = list(_causes(exc))
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return f"nothing listens on port {port} (is lich running?)"
    if any(type(c).__name__ == "NewConnectionError" for c in causes):
        return f"could not connect to lich on port {port} ({_errno_name(causes)})"
    if any(isinstance(c, ConnectionResetError) for c in causes):
        return "lich reset the connection"
    if isinstance(exc, requests.exceptions.ChunkedEncodingError) or any(isinstance(c, http.client.IncompleteRead) for c in causes):
        return "lich's answer broke off"
    if any(isinstance(c, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionAbortedError)) for c in causes):
        return "the connection to lich broke"
    if isinstance(exc, requests.exceptions.ContentDecodingError):
        return "lich's answer could not be decoded"
    if isinstance(exc, requests.exceptions.InvalidHeader) or any(isinstance(c, http.client.HTTPException) for c in causes):
        return "lich's answer was not HTTP"
    if any(isinstance(c, OSError) and c.errno for c in causes):
        return f"the connection to lich broke ({_errno_name(causes)})"
    return f"the exchange with lich failed ({type(causes[-1]).__name__})"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """The exception and what it wraps (urllib3 nests them in `reason`, args
    and the cause chain), each once."""
    seen: List[BaseException] = []
    todo: List[Any] = [exc]
    while todo and len(seen) < 32:
        item = todo.pop(0)
        if not isinstance(item, BaseException) or any(item is s for s in seen):
            continue
        seen.append(item)
        yield item
        todo += [getattr(item, "reason", None), item.__cause__, item.__context__, *item.args]


def _errno_name(causes: List[BaseException]) -> str:
    for cause in causes:
        code = getattr(cause, "errno", None)
        if isinstance(cause, OSError) and code:
            return errno.errorcode.get(code, type(cause).__name__)
    return type(causes[-1]).__name__


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 200 else line[:200] + "…"


# -- cutting a parked request from another thread ------------------------------


class _SocketWatch:
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


class _WatchedConnection(HTTPConnection):
    """urllib3's connection, reporting each socket it opens to the watch."""

    def __init__(self, *args: Any, sockets: _SocketWatch, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._watch = sockets

    def connect(self) -> None:
        super().connect()
        self._watch.add(self.sock)


class _WatchedPool(HTTPConnectionPool):
    ConnectionCls = _WatchedConnection  # the pool hands its extra keywords (`sockets`) to it


class _CuttableAdapter(HTTPAdapter):
    """One kept-alive connection, no retries (the default, kept), and the
    sockets of its connections remembered for `abandon`."""

    def __init__(self):
        self.sockets = _SocketWatch()
        super().__init__(pool_connections=1, pool_maxsize=1)

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = {"http": functools.partial(_WatchedPool, sockets=self.sockets)}
