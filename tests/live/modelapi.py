"""A fake Anthropic model API, for a live Claude Code: the wire format on
fakeapi.py's server, record and holds.

It answers `POST /v1/messages` as Claude Code asks (server-sent events when
`"stream": true`, one JSON message otherwise), and holds a stream open with
`ping` events where the test asked for it (`hold(marker)`: the next streamed
request whose last user text has the marker).

    with ModelAPI() as api:                       # 127.0.0.1, a free port
        api.base_url                              # ANTHROPIC_BASE_URL
        hold = api.hold("[hold-1]")               # the next request whose last user text has it
        hold.started.wait(t); hold.release()      # ...or hold.closed.wait(t): the client hung up
        api.wait_for(lambda r: ..., timeout=t)    # the first recorded Request that matches
        api.requests                              # every request so far, in arrival order

Every answer's text names the question it answers (`ANSWER_PREFIX` and the
request's last user text, cut short), so a fork's answer can be told apart.
"""
from __future__ import annotations

import contextlib
import json
import time
from typing import List, Optional
from urllib.parse import parse_qs, urlsplit

import attrs

from fakeapi import FakeAPI, FakeAPIHandler

ANSWER_PREFIX = "fake-model says: "
PING_SECONDS = 0.2
NOT_HERE = {"type": "error", "error": {"type": "not_found_error", "message": "not here"}}


@attrs.frozen(repr=False)
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

    def __repr__(self) -> str:
        return f"<Request {self.seq} {self.method} {self.path} {self.last_user_text[:60]!r}>"


def message_texts(message: dict) -> List[str]:
    content = message.get("content")
    if isinstance(content, str):
        return [content]
    return [block.get("text", "") for block in content or [] if isinstance(block, dict) and block.get("type") == "text"]


def answer_for(request: Request) -> str:
    """The answer names the end of what it answers: a side question comes last."""
    blocks = request.last_user_blocks
    return ANSWER_PREFIX + " ".join((blocks[-1] if blocks else "").split())[-200:]


class _Handler(FakeAPIHandler):
    def do_HEAD(self) -> None:
        self.api.record(self, None)
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self.api.record(self, None)
        self.reply_json(404, NOT_HERE)

    def do_POST(self) -> None:
        try:
            body = self.read_json()
        except ValueError:
            body = None
        request = self.api.record(self, body if isinstance(body, dict) else None)
        if request.path == "/v1/messages/count_tokens":
            self.reply_json(200, {"input_tokens": 100})
        elif not request.is_message:
            self.reply_json(404, NOT_HERE)
        elif not request.streams:
            self.reply_json(200, _message(request, answer_for(request)))
        else:
            self.stream(request)

    def stream(self, request: Request) -> None:
        hold = self.api._claim_hold(request, request.last_user_text)
        try:
            with hold.serving() if hold is not None else contextlib.nullcontext():
                self.start_message(request)
                if hold is not None:
                    hold.wait(self.connection, lambda: self.send_event({"type": "ping"}, "ping"), PING_SECONDS)
                self.finish_message(answer_for(request))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up; a hold has seen it

    def start_message(self, request: Request) -> None:
        self.start_stream()
        self.send_event({"type": "message_start", "message": _message(request, None)}, "message_start")
        self.send_event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}, "content_block_start")

    def finish_message(self, text: str) -> None:
        self.send_event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}, "content_block_delta")
        self.send_event({"type": "content_block_stop", "index": 0}, "content_block_stop")
        self.send_event({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 12}}, "message_delta")
        self.send_event({"type": "message_stop"}, "message_stop")


class ModelAPI(FakeAPI):
    Handler = _Handler

    def messages(self, since: int = 0) -> List[Request]:
        """`POST /v1/messages` requests with a seq above `since`."""
        return [r for r in self.requests if r.is_message and r.seq > since]

    def record(self, handler: _Handler, body: Optional[dict]) -> Request:
        parts = urlsplit(handler.path)
        return self._record(lambda seq: Request(
            seq=seq,
            method=handler.command,
            path=parts.path,
            query=parse_qs(parts.query),
            headers={k.lower(): v for k, v in handler.headers.items()},
            body=body,
            at=time.monotonic(),
        ))


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
