"""LichClient: the two HTTP exchanges with lich, on `requests`, and nothing else.

Each client owns one `requests.Session` and is used by one thread (the
poller, the worker, the acker, each ask thread); `abandon` is the one call
another thread may make. The session keeps one connection to loopback alive,
reads no proxy or `.netrc` from the environment, never retries, and streams
each answer so no more than its limit is ever read.

Every exchange ends by its deadline however lich answers (a byte at a
time, a header line that never ends, `100 Continue` for ever), and a new
connection carries the token only once the program on the other end is
known to be ours, or cannot be known (loopback.py, peer.py).

Every error leaves here as a short phrase: the exception texts of `requests`
and `urllib3` hold the URL, and so the token, and none of them is passed on;
what lich says itself is passed on with the token taken out.
"""
from __future__ import annotations

import errno
import http.client
import os
import socket
from typing import Any, Iterator, List, Optional
from urllib.parse import quote

import attrs
import requests
import urllib3
from requests.structures import CaseInsensitiveDict

from . import CONTRACT_RELEASE, __version__
from .ack import Ack
from .batch import Answer, NotAnArray, read_answer
from .config import Config
from .loopback import CuttableAdapter, Deadline, ForeignListener
from .logs import Redactor

CONNECT_TIMEOUT = 3.0
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


@attrs.frozen
class Deadlines:
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


class _Failed(Exception):
    """The exchange failed; the text is already a safe phrase."""


class LichClient:
    def __init__(self, config: Config, deadlines: Deadlines = Deadlines(), uid: Optional[int] = None):
        """`uid` is the user lich must run as: ours unless a test says otherwise."""
        self._port = config.port
        self._deadlines = deadlines
        self._scrub = Redactor(config.token)
        token, sid = quote(config.token, safe=""), quote(config.session_id, safe="")
        base = config.lich_url
        self._deadline = Deadline()
        self._adapter = CuttableAdapter(self._deadline, os.getuid() if uid is None else uid)
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
            status, _, body = self._exchange(self._poll, self._deadlines.poll, MAX_POLL_BODY)
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
            status, reason, text = self._exchange(request, self._deadlines.ack, MAX_ACK_ANSWER)
        except _Failed as exc:
            raise AckFailed(str(exc)) from None
        if 200 <= status < 300:
            return
        # lich's own words may repeat the request's URL, and so the token.
        said = _one_line(self._scrub.redact(text.decode("utf-8", "replace"))) or _one_line(self._scrub.redact(reason or "")) or "no reason given"
        raise AckFailed(f"lich refused it: {status} {said}", refused=400 <= status < 500)

    def abandon(self) -> None:
        """Cut any request in flight from another thread (a parked poll at shutdown)."""
        self._adapter.sockets.shut_all()

    def close(self) -> None:
        self._session.close()

    def _exchange(self, request: requests.PreparedRequest, seconds: float, limit: int):
        """(status, reason, body) of one request, sent once: one that failed
        may have reached lich, and a poll or an ack must not be taken twice.
        A kept connection lich closed meanwhile is noticed by urllib3 before
        the request goes out, and replaced. The whole exchange ends within
        `seconds`: each read's timeout is what is left of them."""
        self._deadline.start(seconds)
        try:
            timeout = (min(CONNECT_TIMEOUT, seconds), seconds)
            response = self._session.send(request, stream=True, timeout=timeout, allow_redirects=False, proxies={})
            try:
                body = _read_capped(response, limit)
            finally:
                response.close()  # a body left unread closes the connection, never reuses it
        except ForeignListener as exc:
            raise _Failed(str(exc)) from None
        except _WIRE_ERRORS as exc:
            raise _Failed(_describe(exc, self._port, seconds)) from None
        finally:
            self._deadline.clear()
        return response.status_code, response.reason, body


# What a request can raise on the way or on a hostile answer: requests wraps
# nearly all of it, and what it lets through of urllib3 and http.client is
# still one failed exchange, never a dead poller. ValueError and
# OverflowError among it: a negative chunk size reaches a read of
# http.client's as a negative length, one of 20 digits as a huge one.
_BAD_LENGTH = (ValueError, OverflowError)
_WIRE_ERRORS = (requests.RequestException, urllib3.exceptions.HTTPError, http.client.HTTPException, OSError, *_BAD_LENGTH)


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
    # One growing buffer, not a list of pieces: a chunked answer of 2-byte
    # chunks would otherwise cost an object per chunk, 60 times its size.
    body = bytearray()
    for chunk in response.iter_content(CHUNK):
        body += chunk
        if len(body) > limit:
            raise _Failed(_too_large(limit))
    return bytes(body)


def _too_large(limit: int) -> str:
    return f"lich's answer is over {_size(limit)}"


def _size(n: int) -> str:
    for unit, name in ((1024 * 1024, "MiB"), (1024, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n:,} bytes"


def _describe(exc: BaseException, port: int, seconds: float) -> str:
    """A phrase for a failed exchange, from the exception's type and causes, never its text."""
    if isinstance(exc, requests.ConnectTimeout):
        return f"could not connect to lich on port {port} in time"
    causes = list(_causes(exc))
    # A read's timeout is what was left of the exchange's: either is the deadline.
    if any(isinstance(c, (requests.ReadTimeout, urllib3.exceptions.ReadTimeoutError, socket.timeout)) for c in causes):
        return f"lich did not answer within {seconds:g} s"
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
    if any(type(c) in _BAD_LENGTH for c in causes):  # a chunk size, become a read's length
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
    """lich's words as one short line: a reason is read in a status line."""
    line = " ".join(text.split())
    return line if len(line) <= 200 else line[:200] + "…"
