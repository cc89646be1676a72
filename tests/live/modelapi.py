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
        d = api.delegate("[go]", "the task")      # the next with "[go]" answered with a subagent call
        d.returned.started.wait(t)                # the request bringing its result back, held
        api.wait_for(lambda r: ..., timeout=t)    # the first recorded Request that matches
        api.requests                              # every request so far, in arrival order

Every answer's text names the question it answers (`ANSWER_PREFIX` and the
request's last user text, cut short), so a fork's answer can be told apart.

A delegation (`delegate(marker, task)`) answers the next streamed request
whose last user text has the marker with one call of Claude Code's subagent
tool (named as the request's `tools` name it: "Agent", or "Task" in older
releases), `task` its prompt. The subagent's own request is answered as any
other, and the main loop's request that brings the call's result back is
held (`returned`, a Hold), so the turn the subagent ran in is still
streaming when the test looks.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from typing import Dict, List, Optional
from urllib.parse import parse_qs, urlsplit

import attrs

from fakeapi import FakeAPI, FakeAPIHandler, Hold

ANSWER_PREFIX = "fake-model says: "
PING_SECONDS = 0.2
NOT_HERE = {"type": "error", "error": {"type": "not_found_error", "message": "not here"}}
# Claude Code's subagent tool, by the names its releases give it.
SUBAGENT_TOOLS = ("Agent", "Task")


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

    @property
    def tool_results(self) -> Dict[str, str]:
        """The tool results the last user message brings back: their text by
        the id of the call each answers."""
        for message in reversed((self.body or {}).get("messages") or []):
            if message.get("role") == "user":
                content = message.get("content")
                blocks = content if isinstance(content, list) else []
                return {block.get("tool_use_id", ""): "\n".join(message_texts(block))
                        for block in blocks if isinstance(block, dict) and block.get("type") == "tool_result"}
        return {}

    @property
    def tool_names(self) -> List[str]:
        """The names of the tools the request offers the model."""
        return [tool.get("name", "") for tool in (self.body or {}).get("tools") or [] if isinstance(tool, dict)]

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


class Delegation:
    """One prompt answered with a call of the subagent tool (the module's
    docstring): `asked` the request it answers, `called` set once the call
    went out (`tool`, the name it was sent under), `returned` the hold of
    the main loop's request that brings its result back (its `request`
    then; release() lets it finish)."""

    def __init__(self, marker: str, task: str, call_id: str):
        self.marker = marker
        self.task = task
        self.call_id = call_id
        self.asked: Optional[Request] = None
        self.tool: Optional[str] = None
        self.called = threading.Event()
        self.returned = Hold()


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
        delegation = self.api._claim_delegation(request)
        if delegation is not None:
            self.call_subagent(request, delegation)
            return
        hold = self.api._claim_return(request) or self.api._claim_hold(request, request.last_user_text)
        try:
            with hold.serving() if hold is not None else contextlib.nullcontext():
                self.start_message(request)
                if hold is not None:
                    hold.wait(self.connection, lambda: self.send_event({"type": "ping"}, "ping"), PING_SECONDS)
                self.finish_message(answer_for(request))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up; a hold has seen it

    def call_subagent(self, request: Request, delegation: Delegation) -> None:
        """The model's answer: one call of the subagent tool the request offers."""
        offered = [name for name in SUBAGENT_TOOLS if name in request.tool_names]
        if not offered:
            # Claude Code then shows the model's error, and the test waiting on the call says it never went out.
            self.reply_json(400, {"type": "error", "error": {"type": "invalid_request_error",
                                                             "message": f"no subagent tool ({' or '.join(SUBAGENT_TOOLS)}) offered"}})
            return
        delegation.tool = offered[0]
        call = {"description": "a task for a subagent", "prompt": delegation.task, "subagent_type": "general-purpose"}
        self.start_stream()
        self.send_event({"type": "message_start", "message": _message(request, None)}, "message_start")
        self.send_event({"type": "content_block_start", "index": 0,
                         "content_block": {"type": "tool_use", "id": delegation.call_id, "name": delegation.tool, "input": {}}},
                        "content_block_start")
        self.send_event({"type": "content_block_delta", "index": 0, "delta": {"type": "input_json_delta", "partial_json": json.dumps(call)}},
                        "content_block_delta")
        self.send_event({"type": "content_block_stop", "index": 0}, "content_block_stop")
        self.send_event({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": 12}},
                        "message_delta")
        self.send_event({"type": "message_stop"}, "message_stop")
        delegation.called.set()

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

    def __init__(self):
        super().__init__()
        self._delegations: List[Delegation] = []  # behind the record's condition, as the holds are
        self._call_ids = itertools.count(1)

    def delegate(self, marker: str, task: str) -> Delegation:
        """Answer the next streamed request whose last user text has `marker`
        with a call of the subagent tool, `task` its prompt, and hold the
        request that brings its result back."""
        with self._cond:
            delegation = Delegation(marker, task, f"toolu_live_{next(self._call_ids)}")
            self._delegations.append(delegation)
            self._holds.append(delegation.returned)
        return delegation

    def _claim_delegation(self, request: Request) -> Optional[Delegation]:
        """The delegation not yet called whose marker the request's last user text has."""
        with self._cond:
            for delegation in self._delegations:
                if delegation.asked is None and delegation.marker in request.last_user_text and not request.tool_results:
                    delegation.asked = request
                    return delegation
        return None

    def _claim_return(self, request: Request) -> Optional[Hold]:
        """The hold of the delegation whose call's result the request brings back."""
        results = request.tool_results
        with self._cond:
            for delegation in self._delegations:
                if delegation.call_id in results and delegation.returned.request is None:
                    delegation.returned.request = request
                    return delegation.returned
        return None

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
