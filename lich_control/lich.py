"""LichClient: the two HTTP exchanges with lich, a poll and an ack, on
`requests`, each with a total deadline, its answer bounded, the owner of
lich's port checked, and a failure worded from the exception's classes, never
its text, which holds the token (docs/architecture.md, "What carries HTTP, and
why", To lich, says why).
Each client is used by one thread; `abandon` is the one call another may make.
"""
from __future__ import annotations

import contextlib
import functools
import http.client
import logging
import socket
import threading
import time
from typing import Any, List, Optional, Tuple, Union
from urllib.parse import quote

import attrs
import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool

from . import CONTRACT_RELEASE, __version__
from .bridge_server import BoundedSocket
from .config import Config
from .system import native

log = logging.getLogger("lich_control.lich")

CONNECT_TIMEOUT = 3.0
MAX_POLL_BODY = 16 * 1024 * 1024
MAX_ACK_ANSWER = 64 * 1024  # what is read of lich's answer to an ack (a reason)
# lich answers 401 to a token it did not hand out: LICH_TOKEN is one lich no
# longer knows, as after lich restarted; only a session lich starts anew has its token.
WRONG_TOKEN = "the token is wrong (LICH_TOKEN is not one lich knows: lich restarted?); start a new session from lich"
CHUNK = 64 * 1024
HEADERS = {
    "X-Lich-Plugin": CONTRACT_RELEASE,  # the contract we speak, which lich checks: not our version
    "User-Agent": f"lich-control/{__version__}",
    "Accept": "application/json",
    # Loopback gains nothing from compression, and the limits are then on bytes read.
    "Accept-Encoding": "identity",
}


@attrs.frozen
class ExchangeTimeouts:
    """The most one exchange may take, in seconds, from the request going out
    (connecting included) to the last byte of the answer read."""

    # lich holds a poll up to 25 s, and Claude Code's own fetch gave up at 30 s.
    poll: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))
    ack: float = attrs.field(default=10.0, validator=attrs.validators.gt(0))


class LichGone(Exception):
    """lich answered 404: it predates the contract; stop polling for good."""


class PollFailed(Exception):
    """The poll got no usable answer; back off and try again."""


class AckFailed(Exception):
    """The ack did not reach lich, or lich refused it."""

    def __init__(self, reason: str, refused: bool = False):
        super().__init__(reason)
        self.refused = refused  # lich answered 4xx: retrying would not help


class ForeignListener(Exception):
    """The program on the other end belongs to another user; the text is a phrase."""


class LichClient:
    def __init__(self, config: Config, timeouts: ExchangeTimeouts = ExchangeTimeouts(), uid: Union[int, str, None] = None):
        """`uid` is the user lich must run as (a uid; on Windows a SID): ours unless a test says otherwise."""
        self._port = config.port
        self._timeouts = timeouts
        token, sid = quote(config.token, safe=""), quote(config.session_id, safe="")
        base = config.lich_url
        self._adapter = LoopbackAdapter(native.our_user() if uid is None else uid)
        # Prepared once: every poll is the same request, and every ack differs only in its body.
        self._poll = requests.Request("GET", f"{base}/mod/commands?token={token}&session_id={sid}", HEADERS).prepare()
        ack_headers = dict(HEADERS, **{"Content-Type": "application/json"})
        self._ack = requests.Request("POST", f"{base}/mod/acks?token={token}", ack_headers).prepare()

    def poll(self) -> bytes:
        """One long poll: the body of lich's 200, which the poller reads."""
        status, _, body = self._exchange(self._poll, self._timeouts.poll, MAX_POLL_BODY, PollFailed)
        if status == 404:
            raise LichGone("lich answered 404")
        if status == 401:
            raise PollFailed(f"lich answered 401: {WRONG_TOKEN}")
        if status != 200:
            raise PollFailed(f"lich answered {status}")
        return body

    def ack(self, ack) -> None:
        """Post one ack (an `acks.Ack`, which imports this module); AckFailed says why it did not land."""
        request = self._ack.copy()
        request.prepare_body(data=ack.body(), files=None)
        status, reason, text = self._exchange(request, self._timeouts.ack, MAX_ACK_ANSWER, AckFailed)
        if 200 <= status < 300:
            return
        said = " ".join(text.decode("utf-8", "replace").split()) or reason or "no reason given"
        if status == 401:
            said = f"{said}: {WRONG_TOKEN}"
        raise AckFailed(f"lich refused it: {status} {said}", refused=400 <= status < 500)

    def abandon(self) -> None:
        """Cut any request in flight from another thread (a parked poll at
        shutdown): LoopbackAdapter.abandon says how, and why our half only."""
        self._adapter.abandon()

    def close(self) -> None:
        self._adapter.close()

    def _exchange(self, request: requests.PreparedRequest, seconds: float, limit: int, failed: type) -> Tuple[int, str, bytes]:
        """(status, reason, body) of one request, or `failed` with a phrase, within
        `seconds` (LoopbackAdapter.set_deadline). Sent once: one that failed may have reached
        lich, and a poll or an ack must not be taken twice."""
        self._adapter.set_deadline(time.monotonic() + seconds)
        try:
            timeout = (min(CONNECT_TIMEOUT, seconds), seconds)
            with self._adapter.send(request, stream=True, timeout=timeout) as response:
                body = _read_capped(response, limit)  # a body left unread closes the connection, never reuses it
        except _WIRE_ERRORS as exc:
            phrase = _phrase(exc, self._port, seconds)
            log.debug("%s %s failed: %s", request.method, request.path_url.partition("?")[0], phrase, exc_info=True)
            raise failed(phrase) from exc
        finally:
            self._adapter.set_deadline(None)
        if body is None:
            size = f"{limit // (1024 * 1024)} MiB" if limit % (1024 * 1024) == 0 else f"{limit // 1024} KiB"
            raise failed(f"lich's answer is over {size}")
        return response.status_code, response.reason, body


# What an exchange can raise: requests wraps nearly all of it, and what it
# lets through of urllib3 and http.client (a chunk size of 20 hex digits
# reaches a read as a length too large, a negative one as a negative length)
# is still one failed exchange, never a dead poller.
_WIRE_ERRORS = (
    requests.RequestException,
    urllib3.exceptions.HTTPError,
    http.client.HTTPException,
    OSError,
    ValueError,
    OverflowError,
    ForeignListener,
)


def _phrase(exc: BaseException, port: int, seconds: float) -> str:
    """What went wrong, sorted by the classes of the exception and its causes
    as HTTPAdapter.send sorts urllib3's: never from their texts."""
    if isinstance(exc, ForeignListener):
        return str(exc)
    if isinstance(exc, requests.ConnectTimeout):
        return f"could not connect to lich on port {port} in time"
    causes: List[BaseException] = []  # the exception and those it was raised from or while handling
    link: Optional[BaseException] = exc
    while link is not None and link not in causes:
        causes.append(link)
        link = link.__cause__ or link.__context__

    def caused_by(*kinds: type) -> bool:
        return any(isinstance(cause, kinds) for cause in causes)

    # A read's timeout is what was left of the exchange's: either is the deadline.
    if caused_by(requests.ReadTimeout, urllib3.exceptions.ReadTimeoutError, socket.timeout):
        return f"lich did not answer within {seconds:g} s"
    if caused_by(ConnectionRefusedError):
        return f"nothing listens on port {port} (is lich running?)"
    if caused_by(http.client.RemoteDisconnected):
        return "lich closed the connection without answering"
    if caused_by(ConnectionResetError):
        return "lich reset the connection"
    if caused_by(requests.exceptions.ChunkedEncodingError, http.client.IncompleteRead):
        return "lich's answer broke off"
    if caused_by(requests.exceptions.InvalidHeader, http.client.HTTPException):
        return "lich's answer was not HTTP"
    if caused_by(requests.exceptions.ContentDecodingError):
        return "lich's answer could not be decoded"
    return f"the exchange with lich failed ({type(causes[-1]).__name__})"


def _read_capped(response: requests.Response, limit: int) -> Optional[bytes]:
    """The body, or None once it is past `limit`: refused unread when its
    Content-Length says so, or as soon as the bytes read pass it (a chunked
    answer declares none)."""
    declared = response.raw.length_remaining  # urllib3's reading of Content-Length
    if declared is not None and declared > limit:
        return None
    # One growing buffer, not a list of pieces: a chunked answer of 2-byte
    # chunks would otherwise cost an object per chunk, 60 times its size.
    body = bytearray()
    for chunk in response.iter_content(CHUNK):
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


# -- the connection ------------------------------------------------------------------------


class LoopbackAdapter(HTTPAdapter):
    """One kept-alive connection, no retries (the default, kept), whose
    connections check the listener's owner before the token goes out, keep
    each exchange to its deadline on every read and write of their socket, a
    bridge_server.BoundedSocket (urllib3's read timeout bounds each read
    alone: a byte a second would hold an exchange for ever), and can be cut by
    `abandon` from another thread, which shares the socket list under the
    lock. docs/architecture.md, "What carries HTTP, and why", says why each."""

    def __init__(self, uid: Union[int, str, None]):
        self.uid = uid
        self._deadline: Optional[float] = None
        self._lock = threading.Lock()
        self._sockets: List[socket.socket] = []
        self._abandoned = False
        super().__init__(pool_connections=1, pool_maxsize=1)

    def init_poolmanager(self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        # The pool hands its extra keywords to each connection it makes.
        self.poolmanager.pool_classes_by_scheme = {"http": functools.partial(_Pool, adapter=self)}

    def set_deadline(self, at: Optional[float]) -> None:
        """Every read and write ends by `at` (time.monotonic; None between exchanges), set by the client's thread."""
        self._deadline = at
        with self._lock:
            for sock in self._sockets:
                sock.deadline = at

    def opened(self, sock: BoundedSocket) -> None:
        sock.deadline = self._deadline
        with self._lock:
            self._sockets = [s for s in self._sockets if s.fileno() != -1] + [sock]
            abandoned = self._abandoned
        if abandoned:
            # Opened after the cut, by a poll already past its stop check:
            # cut too, or it would park for 25 s and take commands nobody applies.
            sock.shutdown(socket.SHUT_RDWR)

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            # Our half only: lich hands each command out once, and a cut of
            # both halves would throw away an answer already on its way.
            with contextlib.suppress(OSError):  # closed meanwhile
                sock.shutdown(socket.SHUT_WR)


class _Connection(HTTPConnection):
    def __init__(self, *args: Any, adapter: LoopbackAdapter, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._adapter = adapter

    def connect(self) -> None:
        super().connect()
        # Before the request, and so the token, is written to it.
        owner = native.listener_owner(self.sock)
        if owner is not None and owner != self._adapter.uid:
            self.sock.close()
            raise ForeignListener(f"the program listening on port {self.port} belongs to another user ({native.USER_KIND} {owner}); the token is not sent")
        self.sock = BoundedSocket.taking_over(self.sock)
        self._adapter.opened(self.sock)


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection
