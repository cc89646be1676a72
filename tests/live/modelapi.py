"""A fake Anthropic model API on the standard library, for a live Claude Code.

It records every request, answers `POST /v1/messages` as Claude Code asks
(server-sent events when `"stream": true`, one JSON message otherwise), and
can hold a stream open with `ping` events until the test lets it finish or
the client closes it — which is how an abort is seen from the API's side.

    with ModelAPI() as api:                       # 127.0.0.1, a free port
        api.base_url                              # ANTHROPIC_BASE_URL
        hold = api.hold("[hold-1]")               # the next request whose last user text has it
        hold.started.wait(t); hold.release()      # ...or hold.closed.wait(t): the client hung up
        api.wait_for(lambda r: ..., timeout=t)    # the first recorded Request that matches
        api.requests                              # every request so far, in arrival order

Every answer's text names the question it answers (`ANSWER_PREFIX` and the
request's last user text, cut short), so a fork's answer can be told apart.

Threads: `ModelAPI` owns the listening thread; each connection gets its own
thread (ThreadingHTTPServer), which for a held stream stays in `Hold.serve`
until released or closed. Shared state sits behind one condition.
"""
from __future__ import annotations

import itertools
import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, List, Optional
from urllib.parse import parse_qs, urlsplit

import attrs

ANSWER_PREFIX = "fake-model says: "
PING_SECONDS = 0.2
# A held stream that nobody releases ends by itself, so a failed test never
# leaves Claude Code waiting on us for longer than the run.
HOLD_LIMIT_SECONDS = 60.0


@attrs.frozen
class Request:
    """One request as the API received it."""

    seq: int
    method: str
    path: str
    query: dict
    headers: dict = attrs.field(repr=False)
    body: Optional[dict] = attrs.field(repr=False)
    at: float  # time.monotonic() on arrival

    @property
    def is_message(self) -> bool:
        return self.method == "POST" and self.path == "/v1/messages"

    @property
    def model(self) -> Optional[str]:
        return (self.body or {}).get("model")

    @property
    def streams(self) -> bool:
        return bool((self.body or {}).get("stream"))

    @property
    def last_user_blocks(self) -> List[str]:
        """The text blocks of the last user message, in order."""
        for message in reversed((self.body or {}).get("messages") or []):
            if message.get("role") == "user":
                return message_texts(message)
        return []

    @property
    def last_user_text(self) -> str:
        """The last user message's text blocks joined, or ''."""
        return "\n".join(self.last_user_blocks)

    def text(self) -> str:
        """The whole body as JSON text: for 'does it appear anywhere' checks."""
        return json.dumps(self.body, ensure_ascii=False)


def message_texts(message: dict) -> List[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    return [block.get("text", "") for block in content or [] if isinstance(block, dict) and block.get("type") == "text"]


class Hold:
    """One request held open: `started` once it arrived, `closed` once the
    client hung up on it, `finished` once it ended by either."""

    def __init__(self, marker: str):
        self.marker = marker
        self.request: Optional[Request] = None
        self.started = threading.Event()
        self.closed = threading.Event()
        self.finished = threading.Event()
        self.finished_at: Optional[float] = None  # time.monotonic() when it ended
        self._release = threading.Event()

    def release(self) -> None:
        self._release.set()

    def serve(self, handler: "_Handler", request: Request) -> None:
        self.request = request
        self.started.set()
        try:
            handler.start_stream(request)
            deadline = time.monotonic() + HOLD_LIMIT_SECONDS
            while not self._release.wait(PING_SECONDS) and time.monotonic() < deadline:
                if _peer_closed(handler.connection):
                    self.closed.set()
                    return
                handler.event("ping", {"type": "ping"})
            handler.finish_stream(answer_for(request))
        except (BrokenPipeError, ConnectionResetError):
            self.closed.set()
        finally:
            self.finished_at = time.monotonic()
            self.finished.set()


def _peer_closed(sock: socket.socket) -> bool:
    """True once the client closed its end: readable, and nothing to read."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def answer_for(request: Request) -> str:
    """The answer names the end of what it answers: a side question comes last."""
    blocks = request.last_user_blocks
    return ANSWER_PREFIX + " ".join((blocks[-1] if blocks else "").split())[-200:]


class ModelAPI:
    def __init__(self):
        self._cond = threading.Condition()
        self._requests: List[Request] = []
        self._holds: List[Hold] = []
        self._seq = itertools.count(1)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.api = self
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-model-api", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "ModelAPI":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        with self._cond:
            holds = list(self._holds)
        for hold in holds:
            hold.release()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    @property
    def requests(self) -> List[Request]:
        with self._cond:
            return list(self._requests)

    def messages(self, since: int = 0) -> List[Request]:
        """`POST /v1/messages` requests with a seq above `since`."""
        return [r for r in self.requests if r.is_message and r.seq > since]

    @property
    def last_seq(self) -> int:
        with self._cond:
            return self._requests[-1].seq if self._requests else 0

    def hold(self, marker: str) -> Hold:
        """Hold the next streamed request whose last user text holds `marker`."""
        hold = Hold(marker)
        with self._cond:
            self._holds.append(hold)
        return hold

    def wait_for(self, match: Callable[[Request], bool], timeout: float, what: str = "a matching request") -> Request:
        """The first recorded request that matches, waiting up to `timeout` s for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for request in self._requests:
                    if match(request):
                        return request
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [(r.seq, r.method, r.path, r.last_user_text[:60]) for r in self._requests[-8:]]
                    raise AssertionError(f"the model API saw no {what} within {timeout:g} s; the last requests: {seen}")
                self._cond.wait(left)

    def _record(self, handler: "_Handler", body: Optional[dict]) -> Request:
        parts = urlsplit(handler.path)
        with self._cond:
            request = Request(
                seq=next(self._seq),
                method=handler.command,
                path=parts.path,
                query=parse_qs(parts.query),
                headers={k.lower(): v for k, v in handler.headers.items()},
                body=body,
                at=time.monotonic(),
            )
            self._requests.append(request)
            self._cond.notify_all()
            return request

    def _claim_hold(self, request: Request) -> Optional[Hold]:
        if not (request.is_message and request.streams):
            return None
        text = request.last_user_text
        with self._cond:
            for hold in self._holds:
                if hold.request is None and hold.marker in text:
                    self._holds.remove(hold)
                    return hold
        return None


class _Handler(BaseHTTPRequestHandler):
    # HTTP/1.1 with keep-alive for the short answers; a stream is ended by
    # closing the connection, which an SSE client expects.
    protocol_version = "HTTP/1.1"
    server_version = "fake-model-api"

    def log_message(self, format, *args) -> None:
        pass  # the test reads the record, not a log

    def do_HEAD(self) -> None:
        self.server.api._record(self, None)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self.server.api._record(self, None)
        self.reply_json(404, {"type": "error", "error": {"type": "not_found_error", "message": "not here"}})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        api = self.server.api
        request = api._record(self, body if isinstance(body, dict) else None)
        if request.path == "/v1/messages/count_tokens":
            self.reply_json(200, {"input_tokens": 100})
        elif not request.is_message:
            self.reply_json(404, {"type": "error", "error": {"type": "not_found_error", "message": "not here"}})
        elif not request.streams:
            self.reply_json(200, _message(request, answer_for(request)))
        else:
            hold = api._claim_hold(request)
            if hold is not None:
                hold.serve(self, request)
            else:
                try:
                    self.start_stream(request)
                    self.finish_stream(answer_for(request))
                except (BrokenPipeError, ConnectionResetError):
                    pass
            self.close_connection = True

    def reply_json(self, status: int, doc: dict) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self, request: Request) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        start = _message(request, None)
        self.event("message_start", {"type": "message_start", "message": start})
        self.event("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})

    def finish_stream(self, text: str) -> None:
        self.event("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}})
        self.event("content_block_stop", {"type": "content_block_stop", "index": 0})
        self.event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 12}})
        self.event("message_stop", {"type": "message_stop"})

    def event(self, name: str, data: dict) -> None:
        self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
        self.wfile.flush()


def _message(request: Request, text: Optional[str]) -> dict:
    return {
        "id": f"msg_fake_{request.seq}",
        "type": "message",
        "role": "assistant",
        "model": request.model or "claude-fake",
        "content": [] if text is None else [{"type": "text", "text": text}],
        "stop_reason": None if text is None else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 100, "output_tokens": 1 if text is None else 12},
    }
