"""A loopback OpenAI-compatible model API for opencode: `POST /v1/chat/completions`.

opencode reaches it as an `@ai-sdk/openai-compatible` provider whose
`baseURL` points here. Every request is recorded; what the answer is follows
from the request itself, so a test steers a turn through the words of its
prompt:

- a title request (opencode names each new session) gets a title at once;
- a request whose last message is a tool's result gets a closing text;
- `[hold]` in the prompt: the answer streams and stays open until the test
  calls `release()` or opencode closes the connection (an abort);
- `[tool]` in the prompt: held the same way, then answered with a call of
  opencode's `glob` tool, so the turn makes a second request;
- anything else: one text answer, `echo: <the prompt>`.

A held stream writes an SSE comment every tenth of a second; the write that
fails is how a closed connection is noticed. Waiting for a request is a
condition wait with a deadline.
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, List, Optional

TITLE_SYSTEM = "You are a title generator"
PING_SECONDS = 0.1


class Request:
    """One chat completion request as opencode sent it."""

    def __init__(self, index: int, body: dict):
        self.index = index
        self.body = body
        self.model = body.get("model")
        self.reasoning_effort = body.get("reasoning_effort")
        self.messages = body.get("messages") or []
        self.tools = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        self.closed = threading.Event()  # opencode closed a held stream
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
        return f"<Request {self.index} model={self.model} effort={self.reasoning_effort} title={self.is_title} user={self.last_user[-60:]!r}>"


class FakeModel:
    def __init__(self):
        self.cond = threading.Condition()
        self.requests: List[Request] = []
        self._released = 0  # how many release() calls so far
        self._stopping = False
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                self._json(200, {"object": "list", "data": []})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    return self._json(400, {"error": {"message": "not JSON"}})
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._json(404, {"error": {"message": f"no {self.path} here"}})
                request = api._record(body)
                self.close_connection = True
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    api._answer(request, self._event, self._comment)
                except (BrokenPipeError, ConnectionResetError):
                    request.closed.set()
                    with api.cond:
                        api.cond.notify_all()

            def _event(self, doc) -> None:
                data = doc if isinstance(doc, str) else json.dumps(doc)
                self.wfile.write(f"data: {data}\n\n".encode())
                self.wfile.flush()

            def _comment(self) -> None:
                self.wfile.write(b": ping\n\n")
                self.wfile.flush()

            def _json(self, status, doc):
                raw = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-model", daemon=True)
        self._thread.start()

    # -- what tests use ----------------------------------------------------

    def wait_for(self, match: Callable[[Request], bool], timeout: float, what: str = "a request") -> Request:
        """The first request (oldest first) that matches, waiting up to `timeout`."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for request in self.requests:
                    if match(request):
                        return request
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {what} reached the model API within {timeout:g} s; it saw {self.requests!r}")
                self.cond.wait(left)

    def turn_requests(self) -> List[Request]:
        with self.cond:
            return [r for r in self.requests if not r.is_title]

    def release(self) -> None:
        """Let every stream held so far finish (and those held later, up to one each call)."""
        with self.cond:
            self._released += 1
            self.cond.notify_all()

    def close(self) -> None:
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
        self._server.shutdown()
        self._server.server_close()

    # -- the server's side -------------------------------------------------

    def _record(self, body: dict) -> Request:
        with self.cond:
            request = Request(len(self.requests), body)
            self.requests.append(request)
            self.cond.notify_all()
            return request

    def _answer(self, request: Request, event, comment) -> None:
        chunk = _Chunks(request.model, event)
        chunk.text("")
        prompt = request.last_user
        if request.is_title:
            chunk.text("A title")
        elif request.after_tool:
            chunk.text("done after the tool")
        elif "[hold]" in prompt or "[tool]" in prompt:
            chunk.text("working")
            self._hold(comment)
            if "[tool]" in prompt:
                chunk.tool_call("glob", {"pattern": "*.md"})
                chunk.finish("tool_calls")
                request.answered.set()
                return
            chunk.text(" and done")
        else:
            chunk.text(f"echo: {prompt}")
        chunk.finish("stop")
        request.answered.set()

    def _hold(self, comment) -> None:
        with self.cond:
            ticket = self._released
        while True:
            with self.cond:
                if self._released > ticket or self._stopping:
                    return
                self.cond.wait(PING_SECONDS)
            comment()  # raises once opencode has closed the connection


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
