"""What the live tests' fake model APIs share, whatever wire format each
speaks (modelapi.py: Anthropic's, for Claude Code; tests/opencode's
fakemodel.py: OpenAI's chat completions, for opencode): a loopback HTTP
server on the standard library, the record of every request it was sent,
waiting for a request, and holding a streamed answer open until the test
lets it finish or the client hangs up — which is how an abort is seen from
the API's side.

    class MyAPI(FakeAPI):
        Handler = MyHandler                         # a FakeAPIHandler: the wire format
    with MyAPI() as api:                            # 127.0.0.1, a free port
        api.wait_for(lambda r: ..., timeout=t)      # the first recorded request that matches
        hold = api.hold("[marker]")                 # the next held request whose text has it
        hold.started.wait(t); hold.release()        # ...or hold.closed.wait(t): the client hung up

Threads: `FakeAPI` owns the listening thread; each connection gets its own
thread (ThreadingHTTPServer), which for a held stream stays in `Hold.wait`
until released or closed. The record and the holds sit behind one condition.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Iterator, List, Optional, TypeVar

# A held stream that nobody releases ends by itself, so a failed test never
# leaves the host waiting on us for longer than the run.
HOLD_LIMIT_SECONDS = 60.0

R = TypeVar("R")


class Hold:
    """One streamed answer held open: `started` once its request arrived,
    `closed` once the client hung up on it, `finished` once it ended by either."""

    def __init__(self, marker: Optional[str] = None):
        self.marker = marker
        self.request = None  # the request it holds, once one has claimed it
        self.started = threading.Event()
        self.closed = threading.Event()
        self.finished = threading.Event()
        self.finished_at: Optional[float] = None  # time.monotonic() when it ended
        self._release = threading.Event()

    def release(self) -> None:
        self._release.set()

    @contextlib.contextmanager
    def serving(self) -> Iterator["Hold"]:
        """While its request is answered: a hung-up client sets `closed` (and the error goes on)."""
        self.started.set()
        try:
            yield self
        except (BrokenPipeError, ConnectionResetError):
            self.closed.set()
            raise
        finally:
            self.finished_at = time.monotonic()
            self.finished.set()

    def wait(self, connection: socket.socket, ping: Callable[[], None], interval: float) -> None:
        """Keep the stream open, `ping()` every `interval` s, until released
        or past the limit; raises ConnectionResetError once the client hung up."""
        deadline = time.monotonic() + HOLD_LIMIT_SECONDS
        while not self._release.wait(interval) and time.monotonic() < deadline:
            if _peer_closed(connection):
                raise ConnectionResetError("the client closed the connection")
            ping()  # raises too, once the client has gone


def _peer_closed(sock: socket.socket) -> bool:
    """True once the client closed its end: readable, and nothing to read."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


class FakeAPIHandler(BaseHTTPRequestHandler):
    """The HTTP side a wire format builds on: JSON in and out, and server-sent events."""

    # HTTP/1.1 with keep-alive for the short answers; a stream is ended by
    # closing the connection, which an SSE client expects.
    protocol_version = "HTTP/1.1"
    server_version = "fake-model-api"

    def log_message(self, format, *args) -> None:
        pass  # the test reads the record, not a log

    @property
    def api(self) -> "FakeAPI":
        return self.server.api

    def read_json(self):
        """The request's body as JSON, None when it has none; ValueError when it is not JSON."""
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        return json.loads(raw) if raw else None

    def reply_json(self, status: int, doc: dict) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self) -> None:
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()

    def send_event(self, data, name: Optional[str] = None) -> None:
        """One server-sent event: `data` a JSON document, or text as it is."""
        text = data if isinstance(data, str) else json.dumps(data)
        self.wfile.write(((f"event: {name}\n" if name else "") + f"data: {text}\n\n").encode())
        self.wfile.flush()


class FakeAPI:
    """The server, the record and the holds; a subclass names its Handler
    and the path its API lives under."""

    Handler = FakeAPIHandler
    BASE_PATH = ""

    def __init__(self):
        self._cond = threading.Condition()
        self._requests: list = []
        self._holds: List[Hold] = []
        self._seq = itertools.count(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self.Handler)
        self._server.daemon_threads = True
        self._server.api = self
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"fake-{type(self).__name__}", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}{self.BASE_PATH}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.release_all()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def requests(self) -> list:
        """Every request so far, in arrival order."""
        with self._cond:
            return list(self._requests)

    def wait_for(self, match: Callable[[R], bool], timeout: float, what: str = "a matching request") -> R:
        """The first recorded request that matches, waiting up to `timeout` s for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for request in self._requests:
                    if match(request):
                        return request
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the model API saw no {what} within {timeout:g} s; the last requests: {self._requests[-8:]}")
                self._cond.wait(left)

    def hold(self, marker: str) -> Hold:
        """Hold the next held-to-be request whose text holds `marker` (the wire format says which are)."""
        hold = Hold(marker)
        with self._cond:
            self._holds.append(hold)
        return hold

    def release_all(self) -> None:
        """Let every stream held so far finish."""
        with self._cond:
            holds = list(self._holds)
        for hold in holds:
            hold.release()

    def _record(self, make: Callable[[int], R]) -> R:
        """Keep the request `make(seq)` builds, numbered from 1 in arrival order."""
        with self._cond:
            request = make(next(self._seq))
            self._requests.append(request)
            self._cond.notify_all()
            return request

    def _claim_hold(self, request, text: str) -> Optional[Hold]:
        """The unclaimed hold whose marker `text` holds, now `request`'s; None when none does."""
        with self._cond:
            for hold in self._holds:
                if hold.request is None and hold.marker is not None and hold.marker in text:
                    hold.request = request
                    return hold
        return None

    def _hold_now(self, request) -> Hold:
        """A hold of `request` from its arrival, released by release_all()."""
        hold = Hold()
        hold.request = request
        with self._cond:
            self._holds.append(hold)
        return hold
