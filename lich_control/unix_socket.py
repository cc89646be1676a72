"""The daemon's Unix socket: HTTP/1.1 for the relay's results and events, and status.

Both ends are the standard library's. The server is `http.server` over
`socketserver.ThreadingUnixStreamServer`: one thread accepts, each connection
gets a thread that serves its requests while the relay keeps it alive, up to
a bound on connections and on idle time (socket_connections). Nothing wakes
on a timer: the accept and the reads block until the relay speaks, a read's
timeout ends an idle connection, or `close` shuts the socket.
`UnixConnection` is the client every tool and test uses to reach a daemon's
socket.
"""
from __future__ import annotations

import errno
import http.client
import json
import logging
import os
import socket
import socketserver
import stat
import sys
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, Optional, Tuple

from .commands import TooMany, loads
from .runfiles import refuse_foreign
from .socket_connections import Connections, SocketLimits

log = logging.getLogger("lich_control.socket")

BACKLOG = 512  # a burst of results must never be refused (bridge.md: at least 128)
MAX_BODY = 16 * 1024 * 1024
SKIP_PIECE = 64 * 1024
# A request line and a header line are bounded by http.server (64 KiB) and
# the number of header lines by http.client (100): both answer 414 or 431.
ROUTES = ("/v1/result", "/v1/event", "/v1/status")


class Routes:
    """What the socket serves; each sink raises `bad` with a reason for a body of the wrong shape."""

    def __init__(self, result: Callable[[Any], None], event: Callable[[Any], None], status: Callable[[], dict], bad: type):
        self.result, self.event, self.status, self.bad = result, event, status, bad


# After a failure of the accepting loop itself, it waits this long before it
# goes on, doubled per failure in a row up to the most: it never spins.
ACCEPT_PAUSE, ACCEPT_PAUSE_MOST = 0.05, 1.0


class UnixHttpServer:
    def __init__(self, path: str, routes: Routes, limits: SocketLimits = SocketLimits()):
        self.path = path
        self._server = _Server(path, routes, limits)
        self._thread = threading.Thread(target=self._serve, name="lich-socket", daemon=True)

    def listen(self) -> None:
        """Bind 0600 and start accepting. What is at the path is removed only
        if it is a socket of ours (an earlier daemon's, stale: the session
        lock is ours); anything else raises runfiles.NotOurs."""
        refuse_foreign(self.path, stat.S_ISSOCK)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        # bind creates the file 0777 less the umask: 0600 from the start, so
        # no chmod by path follows.
        old = os.umask(0o177)
        try:
            self._server.server_bind()
        finally:
            os.umask(old)
        self._server.server_activate()
        self._thread.start()

    def close(self) -> None:
        self._server.closing.set()
        try:
            self._server.socket.shutdown(socket.SHUT_RDWR)  # wakes the accept
        except OSError:
            pass
        self._server.server_close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def _serve(self) -> None:
        """The accepting thread's loop: it ends only when the server closes.

        handle_request blocks until a connection comes (the server has no
        timeout), where serve_forever would wake twice a second to look for a
        shutdown request. A failure of its own (the selector, a thread that
        would not start) is logged and the loop goes on: every later result
        comes through here."""
        pause = ACCEPT_PAUSE
        while not self._server.closing.is_set():
            try:
                self._server.handle_request()
                pause = ACCEPT_PAUSE
            except Exception as exc:  # ValueError among them: the socket closed under the selector
                if self._server.closing.is_set():
                    return
                log.warning("accepting on the socket failed (%s: %s); going on", type(exc).__name__, exc)
                self._server.closing.wait(pause)
                pause = min(pause * 2, ACCEPT_PAUSE_MOST)


class _Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    block_on_close = False  # a relay's idle kept-alive connection must not hold the exit
    request_queue_size = BACKLOG

    def __init__(self, path: str, routes: Routes, limits: SocketLimits):
        super().__init__(path, _Handler, bind_and_activate=False)
        self.routes = routes
        self.closing = threading.Event()
        self.connections = Connections(limits)
        self._refusing = False  # the accepting thread's: one warning per run of refusals

    def get_request(self) -> Tuple[socket.socket, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                # Out of descriptors or memory: the listener stays readable,
                # so back off briefly instead of spinning on it.
                log.warning("accepting on %s failed: %s", self.server_address, exc.strerror)
                self.closing.wait(0.1)
            raise  # handle_request drops this attempt and the loop goes on

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        # ThreadingMixIn's, with the thread named for what it does, once the
        # connection has a place within the bound.
        if not self.connections.admit(request):
            if not self._refusing:
                log.warning("refusing connections on the socket: %d are open, each in a request", len(self.connections))
            self._refusing = True
            return self.shutdown_request(request)
        self._refusing = False
        threading.Thread(target=self.process_request_thread, args=(request, client_address), name="lich-socket-conn", daemon=True).start()

    def shutdown_request(self, request: socket.socket) -> None:
        self.connections.close(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A relay hanging up mid-request is its business; anything else is a bug.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            log.exception("serving a connection on the socket failed")


class _Handler(BaseHTTPRequestHandler):
    """One relay connection: its requests answered in turn while it stays open."""

    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive
    server_version = "lich-control"
    sys_version = ""
    wbufsize = -1  # an answer's head and body leave in one write, when the request is done
    error_message_format = "%(message)s\n"  # the library's own refusals (400, 414, 431): one line of text
    error_content_type = "text/plain; charset=utf-8"

    def setup(self) -> None:
        self.timeout = self.server.connections.limits.idle_seconds  # each read's: an idle connection ends
        super().setup()

    def handle_one_request(self) -> None:
        # Idle until the next request's first byte: only then is it read,
        # unless the connection was given up for a new one meanwhile.
        connections = self.server.connections
        connections.idle(self.connection)
        try:
            begun = bool(self.rfile.peek(1))
        except OSError:  # TimeoutError among them: idle past the limit
            begun = False
        if not begun or not connections.reading(self.connection):
            self.close_connection = True
            return
        super().handle_one_request()

    def do_GET(self) -> None:
        if self._route() == "/v1/status":
            self._leave_body_unread()
            body = json.dumps(self.server.routes.status(), ensure_ascii=False).encode("utf-8", "backslashreplace")
            return self._reply(200, body, "application/json")
        self._elsewhere()

    def do_POST(self) -> None:
        routes = self.server.routes
        sink = {"/v1/result": routes.result, "/v1/event": routes.event}.get(self._route())
        if sink is None:
            return self._elsewhere()
        body = self._body()
        if body is None:
            return
        try:
            doc = loads(body)  # an over-long integer is no reason to refuse a result
        except TooMany as exc:
            return self._reply(400, f"{exc}\n".encode())
        except (ValueError, RecursionError):
            # ValueError: not JSON, or not UTF-8; nesting
            # deeper than the interpreter's stack is a RecursionError.
            return self._reply(400, b"the body is not JSON\n")
        try:
            sink(doc)
        except routes.bad as exc:
            return self._reply(400, f"{exc}\n".encode("utf-8", "backslashreplace"))
        except Exception:  # a bug: the relay still gets an answer, and the connection lives
            log.exception("taking a message on %s failed", self._route())
            return self._reply(500, b"the daemon failed to take it (see its log)\n")
        self._reply(204, b"")

    def __getattr__(self, name: str):
        # Any other method: 405 on our paths, 404 elsewhere (the contract),
        # where the base class would answer 501.
        if name.startswith("do_"):
            return self._elsewhere
        raise AttributeError(name)

    def _route(self) -> str:
        return self.path.split("?", 1)[0]

    def _elsewhere(self) -> None:
        self._leave_body_unread()
        if self._route() in ROUTES:
            return self._reply(405, b"method not allowed\n")
        self._reply(404, b"no such path\n")

    def _leave_body_unread(self) -> None:
        """Read past a refused request's body, so the connection stays usable
        and the client's write of it never meets a closed socket; one that
        cannot be read past (no length, too large, cut short) closes it,
        so it is never taken for the next request."""
        length = self._declared_length(missing="0")
        if length is None or length > MAX_BODY or not _skip(self.rfile, length):
            self.close_connection = True
        self.server.connections.answering(self.connection)

    def _body(self) -> Optional[bytes]:
        """The request's body, or None once a refusal is sent."""
        length = self._declared_length()
        if length is None:
            self.close_connection = True
            self._reply(411, b"a Content-Length is required\n")
            return None
        if length > MAX_BODY:
            self.close_connection = True  # the body is left unread
            self._reply(413, b"the body is too large\n")
            return None
        body = self.rfile.read(length)
        if len(body) < length:
            self.close_connection = True  # the relay hung up mid-body
            return None
        self.server.connections.answering(self.connection)
        return body

    def _declared_length(self, missing: Optional[str] = None) -> Optional[int]:
        """The body's length as the request declares it (`missing` stands in
        for no header); None when it cannot be read past: chunked, or not
        a number ("²" is a digit to isdigit, not to int)."""
        length = self.headers.get("Content-Length", missing)
        if length is None or "Transfer-Encoding" in self.headers or not (length.isascii() and length.isdigit()):
            return None
        return int(length)

    def _reply(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        if status != 204:
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        else:  # so a client stops using the connection before it is closed idle
            self.send_header("Keep-Alive", f"timeout={self.server.connections.limits.idle_seconds:g}")
        self.end_headers()
        if status != 204 and self.command != "HEAD":
            self.wfile.write(body)

    def log_request(self, code: Any = "-", size: Any = "-") -> None:
        pass  # no line per request: results come in bursts

    def log_message(self, format: str, *args: Any) -> None:
        log.info("socket: " + format, *args)  # the library's own refusals; stderr is not ours to write


def _skip(stream, size: int) -> bool:
    """Read `size` bytes and keep none (a refused body may be 16 MiB, on
    each of 64 connections); False if the stream ends first."""
    while size:
        piece = stream.read(min(size, SKIP_PIECE))
        if not piece:
            return False
        size -= len(piece)
    return True


class UnixConnection(http.client.HTTPConnection):
    """An `http.client` connection to a daemon's Unix socket, kept alive
    between requests: `connect` dials the socket, the library does the rest."""

    def __init__(self, path: str, timeout: float = 10.0):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock

    def exchange(self, method: str, url: str, body: Optional[bytes] = None, headers: Optional[dict] = None) -> Tuple[int, bytes]:
        """(status, body) of one request on this connection."""
        self.request(method, url, body=body, headers=headers or {})
        response = self.getresponse()
        return response.status, response.read()


def unix_request(path: str, method: str, url: str, body: Optional[bytes] = None, headers: Optional[dict] = None, timeout: float = 10.0) -> Tuple[int, bytes]:
    """One request on a connection of its own: (status, body)."""
    conn = UnixConnection(path, timeout)
    try:
        return conn.exchange(method, url, body, headers)
    finally:
        conn.close()
