"""A loopback OpenAI-compatible model API for opencode: `POST /v1/chat/completions`,
the wire format on tests/live/fakeapi.py's server, record and holds.

opencode reaches it as an `@ai-sdk/openai-compatible` provider whose
`baseURL` points here. What the answer is follows from the request itself,
so a test steers a turn through the words of its prompt:

- a title request (opencode names each new session) gets a title at once;
- a request whose last message is a tool's result gets a closing text;
- `[hold]` in the prompt: the answer streams and stays open until the test
  calls `release()` or opencode closes the connection (an abort);
- `[tool]` in the prompt: held the same way, then answered with a call of
  opencode's `glob` tool, so the turn makes a second request;
- anything else: one text answer, `echo: <the prompt>`.

A held stream writes an SSE comment every tenth of a second.
"""
from __future__ import annotations

import json
import threading
import time
from typing import List, Optional

from fakeapi import FakeAPI, FakeAPIHandler

TITLE_SYSTEM = "You are a title generator"
PING_SECONDS = 0.1


class Request:
    """One chat completion request as opencode sent it."""

    def __init__(self, seq: int, body: dict):
        self.seq = seq
        self.body = body
        self.model = body.get("model")
        self.reasoning_effort = body.get("reasoning_effort")
        self.messages = body.get("messages") or []
        self.tools = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        self.closed = threading.Event()  # opencode closed its stream
        self.answered = threading.Event()

    @property
    def is_title(self) -> bool:
        return any(m.get("role") == "system" and TITLE_SYSTEM in _text(m) for m in self.messages)

    @property
    def last_user(self) -> str:
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return _text(message)
        return ""

    @property
    def after_tool(self) -> bool:
        return bool(self.messages) and self.messages[-1].get("role") == "tool"

    def __repr__(self):
        return f"<Request {self.seq} model={self.model} effort={self.reasoning_effort} title={self.is_title} user={self.last_user[-60:]!r}>"


class _Handler(FakeAPIHandler):
    def do_GET(self):
        self.reply_json(200, {"object": "list", "data": []})

    def do_POST(self):
        try:
            body = self.read_json() or {}
        except ValueError:
            return self.reply_json(400, {"error": {"message": "not JSON"}})
        if self.path.rstrip("/") != "/v1/chat/completions":
            return self.reply_json(404, {"error": {"message": f"no {self.path} here"}})
        request = self.api._record(lambda seq: Request(seq, body))
        try:
            self.start_stream()
            self.answer(request, _Chunks(request.model, self.send_event))
            request.answered.set()
        except (BrokenPipeError, ConnectionResetError):
            request.closed.set()

    def answer(self, request: Request, chunk: "_Chunks") -> None:
        chunk.text("")
        prompt = request.last_user
        if request.is_title:
            chunk.text("A title")
        elif request.after_tool:
            chunk.text("done after the tool")
        elif "[hold]" in prompt or "[tool]" in prompt:
            chunk.text("working")
            with self.api._hold_now(request).serving() as hold:
                hold.wait(self.connection, self.ping, PING_SECONDS)
            if "[tool]" in prompt:
                chunk.tool_call("glob", {"pattern": "*.md"})
                chunk.finish("tool_calls")
                return
            chunk.text(" and done")
        else:
            chunk.text(f"echo: {prompt}")
        chunk.finish("stop")

    def ping(self) -> None:
        self.wfile.write(b": ping\n\n")
        self.wfile.flush()


class FakeModel(FakeAPI):
    Handler = _Handler
    BASE_PATH = "/v1"

    def turn_requests(self) -> List[Request]:
        return [r for r in self.requests if not r.is_title]

    def release(self) -> None:
        """Let every stream held so far finish; one held later waits for the next call."""
        self.release_all()


class _Chunks:
    """The chunks of one streamed chat completion."""

    def __init__(self, model, event):
        self._model = model
        self._event = event

    def text(self, content: str) -> None:
        self._send({"role": "assistant", "content": content})

    def tool_call(self, name: str, arguments: dict) -> None:
        self._send({"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]})

    def finish(self, reason: str) -> None:
        self._send({}, finish=reason, usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
        self._event("[DONE]")

    def _send(self, delta: dict, finish: Optional[str] = None, usage: Optional[dict] = None) -> None:
        doc = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": int(time.time()), "model": self._model,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage is not None:
            doc["usage"] = usage
        self._event(doc)


def _text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""
