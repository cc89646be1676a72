"""LichClient: the two HTTP exchanges with lich, and nothing else.

Every error leaves here as a short phrase without the URL: requests puts
the URL, and so the token, into its exception texts. A client is used by
one thread only (a `requests.Session` is not shared between threads).
"""
from __future__ import annotations

import json
import socket
import threading
from typing import Any, List, Optional
from urllib.parse import quote

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool

from . import __version__
from .acks import Ack
from .config import Config

# lich holds a poll up to 25 s and Claude Code's own fetch gave up at 30 s:
# the read timeout sits between the two.
POLL_TIMEOUT = (3.0, 28.0)
ACK_TIMEOUT = (3.0, 10.0)
MAX_POLL_BODY = 16 * 1024 * 1024
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


class LichClient:
    def __init__(self, config: Config, session: Optional[requests.Session] = None):
        self._session_id = config.session_id
        token, sid = quote(config.token, safe=""), quote(config.session_id, safe="")
        self._poll_url = f"{config.lich_url}/mod/commands?token={token}&session_id={sid}"
        self._ack_url = f"{config.lich_url}/mod/acks?token={token}"
        self._port = config.port
        self._http = session or _session()
        self._sockets = _SocketWatch()
        _watch_sockets(self._http, self._sockets)

    def poll(self) -> List[Any]:
        """One long poll: the commands lich answered with, oldest first."""
        try:
            with self._http.get(self._poll_url, headers=HEADERS, timeout=POLL_TIMEOUT, stream=True) as resp:
                if resp.status_code == 404:
                    raise LichGone("lich answered 404")
                if resp.status_code != 200:
                    raise PollFailed(f"lich answered {resp.status_code}")
                body = _read_capped(resp)
        except requests.RequestException as exc:
            raise PollFailed(describe(exc, self._port)) from None
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
            resp = self._http.post(self._ack_url, data=body, headers=ACK_HEADERS, timeout=ACK_TIMEOUT)
        except requests.RequestException as exc:
            raise AckFailed(describe(exc, self._port)) from None
        if 200 <= resp.status_code < 300:
            return
        reason = _one_line(resp.text) or resp.reason or "no reason given"
        raise AckFailed(f"lich refused it: {resp.status_code} {reason}", refused=resp.status_code < 500)

    def abandon(self) -> None:
        """Cut any request in flight from another thread (a parked poll at shutdown)."""
        self._sockets.shut_all()

    def close(self) -> None:
        self._http.close()


def describe(exc: BaseException, port: int) -> str:
    """A phrase for a requests failure, never its text (which holds the URL)."""
    if isinstance(exc, requests.ConnectTimeout):
        return f"could not connect to lich on port {port} in time"
    if isinstance(exc, requests.ReadTimeout):
        return "lich did not answer in time"
    if isinstance(exc, requests.exceptions.ChunkedEncodingError):
        return "lich's answer broke off"
    if isinstance(exc, requests.ConnectionError):
        text = repr(exc)
        if "Connection refused" in text or "NewConnectionError" in text:
            return f"nothing listens on port {port} (is lich running?)"
        if "reset" in text.lower():
            return "lich reset the connection"
        return "the connection to lich broke"
    if isinstance(exc, _BodyTooLarge):
        return str(exc)
    return f"the request to lich failed ({type(exc).__name__})"


class _BodyTooLarge(requests.RequestException):
    pass


def _read_capped(resp: requests.Response) -> bytes:
    declared = resp.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > MAX_POLL_BODY:
        raise _BodyTooLarge(f"lich's answer is over {MAX_POLL_BODY // (1024 * 1024)} MiB")
    chunks, size = [], 0
    for chunk in resp.iter_content(chunk_size=65536):
        size += len(chunk)
        if size > MAX_POLL_BODY:
            raise _BodyTooLarge(f"lich's answer is over {MAX_POLL_BODY // (1024 * 1024)} MiB")
        chunks.append(chunk)
    return b"".join(chunks)


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= 200 else line[:200] + "…"


def _session() -> requests.Session:
    http = requests.Session()
    # Keep-alive to one host; requests' own retries would resend a poll or an ack.
    http.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=1, max_retries=0))
    return http


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


def _watch_sockets(http: requests.Session, watch: _SocketWatch) -> None:
    class Connection(HTTPConnection):
        def connect(self):
            super().connect()
            watch.add(self.sock)

    class Pool(HTTPConnectionPool):
        ConnectionCls = Connection

    adapter = http.get_adapter("http://")
    adapter.poolmanager.pool_classes_by_scheme = {"http": Pool}
