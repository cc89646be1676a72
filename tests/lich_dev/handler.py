"""The development lich's HTTP side: the contract's two endpoints, and the
plumbing every endpoint shares.

    GET  /mod/commands?token=…&session_id=…   the mod's long poll
    POST /mod/acks?token=…                    one ack

`http.server` reads every request line, header and body length; this module
only routes, answers, and plays the faults a test scripted (faults.py). The
stub's own endpoints (control.py) come in through the same route table.

Threads: each connection has its own (ThreadingHTTPServer), which parks in
the lich while its poll is held. Everything shared lives in the lich.
"""
from __future__ import annotations

import io
import itertools
import json
import logging
import socket
import struct
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Dict, Optional, Tuple
from urllib.parse import parse_qs, urlsplit

from .faults import AckAnswer, Answer
from .record import AckRecord, AnswerRecord, PollRecord
from .rules import MAX_ACK_BYTES, parse_json, validate_ack

log = logging.getLogger("lich_dev.lich")

PLUGIN_HEADER = "X-Lich-Plugin"
# Go's net/http server (server.go): a response is buffered this far before it
# must choose its framing, so a longer one goes out chunked; and a request body
# a handler left unread is discarded up to this much to keep the connection,
# past which the connection closes.
GO_CHUNKING_BUFFER = 2048  # bufferBeforeChunkingSize
GO_DISCARD_LIMIT = 256 * 1024  # maxPostHandlerReadBytes
RESET_LINGER = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a TCP reset

Route = Callable[["Handler", Dict[str, list]], None]


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # Read by listen() in the constructor, so it must be set on the class:
    # a hundred daemons connecting at once must not overflow the backlog.
    request_queue_size = 1024

    def handle_error(self, request, client_address) -> None:
        # A mod that went away mid-answer (a daemon stopped while its poll
        # was held), or a connection a fault cut, is lich's everyday
        # business, not a traceback on stderr.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


def make_handler(lich: Any, routes: Dict[str, Tuple[str, Route]]) -> type:
    """A handler class bound to one lich, serving `routes` (path -> (method, route))."""

    class Bound(Handler):
        pass

    Bound.lich = lich
    Bound.routes = dict(routes, **CONTRACT_ROUTES)
    return Bound


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the daemon reuses its connections
    disable_nagle_algorithm = True
    # Buffered, so an answer's headers and body go out in one write when
    # handle_one_request flushes: two made the mod wake twice per answer.
    wbufsize = -1
    server_version = "lich-stub"
    sys_version = ""
    lich: Any  # the StubLich this handler serves
    routes: Dict[str, Tuple[str, Route]]

    def setup(self) -> None:
        super().setup()
        self.lich._track(self.connection)

    def finish(self) -> None:
        self.lich._untrack(self.connection)
        try:
            super().finish()
        except OSError:
            pass  # a connection a fault (or the peer) already cut

    def do_GET(self) -> None:
        self._dispatch()

    do_POST = do_PUT = do_DELETE = do_PATCH = do_GET

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        route = self.routes.get(url.path)
        if route is None:
            self.close_connection = True  # an unread body must not be taken for a request
            return self.reply(404, b"no such path\n")
        method, serve = route
        if self.command != method:
            self.close_connection = True  # an unread body must not be taken for a request
            return self.reply(405, b"method not allowed\n", extra={"Allow": method})
        query = parse_qs(url.query)
        if not self.lich._check((query.get("token") or [None])[0]):
            self.close_connection = True
            return self.reply(401, b"invalid token\n")
        serve(self, query)

    # -- the answers ------------------------------------------------------

    def body(self, limit: int) -> Optional[bytes]:
        """The request's body, or None once a refusal went out."""
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            self.close_connection = True
            self.reply(411, b"a Content-Length is required\n")
            return None
        if int(length) > limit:
            self.close_connection = True  # the body is left unread
            self.reply(400, f"the body is over {limit // 1024} KiB\n".encode())
            return None
        return self.rfile.read(int(length))

    def body_as_lich_reads(self, limit: int) -> Optional[bytes]:
        """The body's first `limit` bytes, as lich reads an ack
        (io.ReadAll(io.LimitReader(r.Body, limit))): a longer body is cut,
        and parses only if its JSON ended inside the cut. The rest is left
        as Go's server leaves it: discarded, or the connection closed."""
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            self.close_connection = True
            self.reply(411, b"a Content-Length is required\n")
            return None
        raw = self.rfile.read(min(int(length), limit))
        rest = int(length) - len(raw)
        if rest >= GO_DISCARD_LIMIT:
            self.close_connection = True
        elif rest:
            self.rfile.read(rest)
        return raw

    def reply_json(self, status: int, doc: Any) -> None:
        self.reply(status, json.dumps(doc, ensure_ascii=False).encode("utf-8", "backslashreplace"), "application/json")

    def reply(
        self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8", extra=None,
        length: Optional[int] = None, phrase: Optional[str] = None, chunked: bool = False,
    ) -> None:
        self.send_response(status, phrase)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        if status != 204:
            self.send_header("Content-Type", content_type)
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Length", str(len(body) if length is None else length))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if status == 204:
            return
        if chunked:  # one chunk, then the last, as Go's chunkWriter writes an answer encoded in one write
            body = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
        self.wfile.write(body)

    def rendered(self, status: int, body: bytes, content_type: str, **kwargs: Any) -> bytes:
        """The bytes `reply` would send, unsent: for an answer written out slowly."""
        real, self.wfile = self.wfile, io.BytesIO()
        try:
            self.reply(status, body, content_type, **kwargs)
            return self.wfile.getvalue()
        finally:
            self.wfile = real

    def trickle(self, data: bytes, drip: float, endless: Optional[bytes] = None) -> None:
        """Write `data` one byte each `drip` seconds (at once without), then
        `endless` again and again, until the mod hangs up or lich closes."""
        self.close_connection = True
        pieces: Any = [data[i : i + 1] for i in range(len(data))] if drip else [data]
        if endless is not None:
            pieces = itertools.chain(pieces, itertools.repeat(endless))
        for piece in pieces:
            if self.lich._closed:
                return
            self.wfile.write(piece)
            self.wfile.flush()  # a mod that hung up shows here, as a broken pipe
            if drip:
                self.lich._pause(drip)

    def cut(self) -> None:
        """End the connection here, with a FIN."""
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)

    def headers_as_sent(self) -> Tuple[Tuple[str, str], ...]:
        return tuple(self.headers.raw_items())

    def log_request(self, code="-", size="-") -> None:
        # `serve --verbose` only: the ack path stays lean otherwise. The path
        # alone, never the query, which holds the token.
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s -> %s", self.command, urlsplit(self.path).path, code)

    def log_message(self, format: str, *args) -> None:
        # The request line holds the token: never log it, even at debug level.
        log.debug("lich-stub: " + format.replace("%s", "%r"), *("[request]" if "token=" in str(a) else a for a in args))


# -- the contract's endpoints -----------------------------------------------


def mod_commands(req: Handler, query: Dict[str, list]) -> None:
    lich = req.lich
    session_id = (query.get("session_id") or [""])[0]
    lich.record.add(PollRecord(time.monotonic(), session_id, query, req.headers_as_sent()))
    if not session_id:
        return req.reply(400, b"session_id is required\n")
    answer = lich._poll(session_id, req.headers.get(PLUGIN_HEADER), req.connection)
    if answer is None:  # the client left, or the lich was killed: nobody to answer
        req.close_connection = True
        return
    _give(req, answer)
    if answer.status == 200 and answer.raw is None and not answer.drop and not answer.trickles:
        lich.record.add(AnswerRecord(time.monotonic(), session_id, answer.body))


def _give(req: Handler, answer: Answer) -> None:
    """Send one poll's answer the way it says."""
    if answer.delay:
        req.lich._pause(answer.delay)
    if answer.drop:
        return req.cut()
    if answer.trickles:
        req.close_connection = True
        data = answer.wire if answer.wire is not None else req.rendered(answer.status, answer.payload(), "application/json")
        return req.trickle(data, answer.drip, answer.endless)
    body = answer.payload()
    # A closed lich answers its last poll and hangs up: a mod kept on this
    # connection would otherwise poll a closing stub in a loop.
    if req.lich._closed:
        req.close_connection = True
    chunked = answer.chunked if answer.chunked is not None else len(body) > GO_CHUNKING_BUFFER
    req.reply(answer.status, body, "application/json", chunked=chunked)


def mod_acks(req: Handler, query: Dict[str, list]) -> None:
    lich = req.lich
    raw = req.body_as_lich_reads(MAX_ACK_BYTES)
    if raw is None:
        return
    doc = parse_json(raw)
    problem = validate_ack(doc, lich.kinds)
    scripted: Optional[AckAnswer] = lich.faults.take_ack_answer()
    status = _ack_status(scripted, problem)
    lich.record.add(AckRecord(time.monotonic(), doc, raw, query, req.headers_as_sent(), status))
    if status is None:
        return req.cut()
    lich.faults.wait_acks_open()
    if scripted is not None and not scripted.takes:
        return _answer_ack(req, scripted, status, f"{scripted.reason}\n".encode())
    if problem:
        log.warning("a bad ack: %s", problem)  # lich logs a bad payload: the one place it shows
        return req.reply(400, f"{problem}\n".encode())
    lich._ack(doc, req.headers.get(PLUGIN_HEADER))
    if scripted is not None:
        return _answer_ack(req, scripted, status, b"")
    req.reply(status, b"")


def _answer_ack(req: Handler, scripted: AckAnswer, status: int, body: bytes) -> None:
    """An ack's answer as a test scripted it: its phrase, and slowly if it says so."""
    if not scripted.drip:
        return req.reply(status, body, phrase=scripted.phrase)
    req.close_connection = True
    req.trickle(req.rendered(status, body, "text/plain; charset=utf-8", phrase=scripted.phrase), scripted.drip)


def _ack_status(scripted: Optional[AckAnswer], problem: Optional[str]) -> Optional[int]:
    """The status an ack gets; None: its connection is cut unanswered. A
    scripted 2xx still leaves a bad ack a 400: only a valid one is taken."""
    if scripted is not None and (scripted.drop or not scripted.takes):
        return None if scripted.drop else scripted.status
    if problem:
        return 400
    return 204 if scripted is None else scripted.status


CONTRACT_ROUTES: Dict[str, Tuple[str, Route]] = {
    "/mod/commands": ("GET", mod_commands),
    "/mod/acks": ("POST", mod_acks),
}
