"""The daemon's Unix socket: HTTP/1.1 for the relay's results and events, and status.

Both ends are the standard library's: `http.server`'s request handler on
each connection, and `UnixConnection`, an `http.client` connection, the
client every tool and test uses to reach a daemon's socket.

One thread accepts; each connection gets a thread that serves its requests
while the relay keeps it alive. What that costs is bounded three ways:
  - places: at most `connections` are open. At the bound the one idle the
    longest gives way to the newcomer; with every place in a request the
    accepting thread waits for one to end, and newcomers queue in the
    kernel's backlog: a burst is queued, never refused;
  - time: each read waits at most `idle_seconds`, so a connection idle or
    stalled that long ends;
  - memory: at most `bodies_at_once` bodies are read and handed on at once,
    across every connection; a body over `MAX_BODY` is refused unread.
Nothing wakes on a timer: the accept and the reads block until the relay
speaks, a read's timeout ends a connection, or `close` shuts the socket.
"""
from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, Dict, Optional, Tuple

import attrs

from .commands import TooMany, loads
from .run_folder import check_socket

log = logging.getLogger("lich_control.socket")

# A burst of results must be queued, never refused (bridge.md: at least 128).
BACKLOG = 512
MAX_BODY = 16 * 1024 * 1024
SKIP_PIECE = 64 * 1024
# After a failed accept (out of descriptors): the listener stays readable, so
# the loop pauses rather than spins.
ACCEPT_PAUSE = 0.1
# A request line and a header line are bounded by http.server (64 KiB) and
# the number of header lines by http.client (100): both answer 414 or 431.
ROUTES = ("/v1/result", "/v1/event", "/v1/status")


@attrs.frozen
class SocketLimits:
    connections: int = 64
    idle_seconds: float = 60.0
    # Two of the largest bodies held at once, and a small one never waits
    # longer than another body takes to be parsed.
    bodies_at_once: int = 2


class Routes:
    """What the socket serves; each sink raises `bad` with a reason for a body of the wrong shape."""

    def __init__(self, result: Callable[[Any], None], event: Callable[[Any], None], status: Callable[[], dict], bad: type):
        self.result, self.event, self.status, self.bad = result, event, status, bad


class UnixHttpServer:
    """The socket: `listen` (or `with`) binds it and starts accepting, `close` ends both."""

    def __init__(self, path: str, routes: Routes, limits: SocketLimits = SocketLimits()):
        self.path = path
        self.routes = routes
        self.limits = limits
        self.connections = Connections(limits.connections)
        self.bodies = threading.BoundedSemaphore(limits.bodies_at_once)
        self._closing = threading.Event()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._thread = threading.Thread(target=self._accept, name="lich-socket", daemon=True)

    def listen(self) -> None:
        """Bind 0600 and start accepting. What is at the path is removed only
        if it is a socket (an earlier daemon's, stale: the session lock is
        ours); anything else raises run_folder.NotOurs."""
        check_socket(self.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        # bind creates the file 0777 less the umask: 0600 from the start, so
        # no chmod by path follows.
        old = os.umask(0o177)
        try:
            self._listener.bind(self.path)
        finally:
            os.umask(old)
        self._bound = os.lstat(self.path)
        self._listener.listen(BACKLOG)
        self._thread.start()

    def removed(self) -> bool:
        """True once the socket's file is gone from its path, or another is
        there: the relay, which connects by path, can no longer reach it."""
        try:
            now = os.lstat(self.path)
        except FileNotFoundError:
            return True
        return (now.st_dev, now.st_ino) != (self._bound.st_dev, self._bound.st_ino)

    def close(self) -> None:
        self._closing.set()
        self.connections.stop_waiting()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self._listener.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def __enter__(self) -> "UnixHttpServer":
        self.listen()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _accept(self) -> None:
        """The accepting thread: it ends only when the server closes."""
        failing = False  # one warning per spell of failures
        while not self._closing.is_set():
            try:
                sock, _ = self._listener.accept()
            except OSError as exc:
                if self._closing.is_set():
                    return
                if not failing:
                    log.warning("accepting on the socket failed (%s); trying again", exc.strerror or exc)
                failing = True
                self._closing.wait(ACCEPT_PAUSE)
                continue
            failing = False
            try:
                if not self.connections.admit(sock):
                    sock.close()  # closing
                    return
                threading.Thread(target=self._serve, args=(sock,), name="lich-socket-conn", daemon=True).start()
            except Exception:  # a thread that would not start: this connection is lost, the socket is not
                log.exception("serving a new connection on the socket failed")
                self.connections.close(sock)

    def _serve(self, sock: socket.socket) -> None:
        """A connection's thread: its requests, in turn, until it closes."""
        try:
            _Handler(sock, "", self)
        except OSError:
            pass  # the relay hung up or stalled past the idle limit: its business
        finally:
            self.connections.close(sock)


class Connections:
    """The open connections, each with one flag: is it in a request.

    Shared by the accepting thread (admit) and each connection's thread (its
    own flag, and close); one condition guards the table, and a socket is
    shut down or closed only under it, so the accepting thread never acts on
    a descriptor another thread has closed and the system reused. The table
    keeps the order in which connections last went idle, so the first idle
    one has been idle the longest.
    """

    def __init__(self, most: int):
        self._most = most
        self._cond = threading.Condition()
        self._in_request: Dict[socket.socket, bool] = {}
        self._stopped = False

    def admit(self, sock: socket.socket) -> bool:
        """The accepting thread: True once `sock` has a place; False if the
        server closed meanwhile. At the bound the connection idle the longest
        gives way; with none idle, it waits until one is, or one closes."""
        with self._cond:
            while len(self._in_request) >= self._most and not self._stopped:
                idle = (s for s, busy in self._in_request.items() if not busy and not _readable(s))
                victim = next(idle, None)
                if victim is None:
                    self._cond.wait()
                else:
                    del self._in_request[victim]  # its thread wakes, ends, and closes it
                    _hang_up(victim)
            if self._stopped:
                return False
            self._in_request[sock] = False
            return True

    def idle(self, sock: socket.socket) -> None:
        """The connection's thread: waiting for its next request."""
        with self._cond:
            if self._in_request.pop(sock, None) is not None:
                self._in_request[sock] = False  # now the last to have gone idle
                self._cond.notify_all()

    def begin(self, sock: socket.socket) -> bool:
        """The connection's thread: a request has begun. False if the
        connection gave way first; its thread then ends it unanswered."""
        with self._cond:
            if sock not in self._in_request:
                return False
            self._in_request[sock] = True
            return True

    def close(self, sock: socket.socket) -> None:
        """Any thread: close `sock` and free its place."""
        with self._cond:
            self._in_request.pop(sock, None)
            _hang_up(sock, socket.SHUT_WR)  # as socketserver does: the answer is not cut
            sock.close()
            self._cond.notify_all()

    def stop_waiting(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()


class _Handler(BaseHTTPRequestHandler):
    """One relay connection: its requests answered in turn while it stays open."""

    server: UnixHttpServer
    protocol_version = "HTTP/1.1"  # keep-alive
    server_version = "lich-control"
    sys_version = ""
    wbufsize = -1  # an answer's head and body leave in one write, when the request is done
    error_message_format = "%(message)s\n"  # the library's own refusals (400, 414, 431): one line of text
    error_content_type = "text/plain; charset=utf-8"

    def setup(self) -> None:
        self.timeout = self.server.limits.idle_seconds  # each read's: an idle connection ends
        super().setup()

    def handle_one_request(self) -> None:
        # Idle until the next request's first byte: only then is it read,
        # unless the connection gave way for a new one meanwhile.
        connections = self.server.connections
        connections.idle(self.connection)
        try:
            begun = bool(self.rfile.peek(1))
        except OSError:  # TimeoutError among them: idle past the limit
            begun = False
        if not begun or not connections.begin(self.connection):
            self.close_connection = True
            return
        super().handle_one_request()

    def __getattr__(self, name: str):
        # Every method is answered by `_respond`: 405 on our paths for one
        # they do not take, 404 elsewhere (the contract), where the base
        # class would answer 501.
        if name.startswith("do_"):
            return self._respond
        raise AttributeError(name)

    def _respond(self) -> None:
        """The connection's one catch-all: a bug answers 500, and the
        connection lives on for the next request."""
        route = self.path.split("?", 1)[0]
        try:
            status, body = self._answer(route)
        except OSError:
            raise  # the relay hung up, or stalled past the idle limit
        except Exception:
            log.exception("answering %s %s on the socket failed", self.command, route)
            status, body = 500, b"the daemon failed to answer (see its log)\n"
            self.close_connection = True  # a body may be left unread
        self._reply(status, body)

    def _answer(self, route: str) -> Tuple[int, bytes]:
        routes = self.server.routes
        sink = {"/v1/result": routes.result, "/v1/event": routes.event}.get(route)
        if self.command == "GET" and route == "/v1/status":
            self._leave_body_unread()
            return 200, json.dumps(routes.status()).encode()  # ASCII: the document's text is already safe
        if self.command != "POST" or sink is None:
            self._leave_body_unread()
            return (405, b"method not allowed\n") if route in ROUTES else (404, b"no such path\n")
        length = self._declared_length()
        if length is None:
            self.close_connection = True
            return 411, b"a Content-Length is required\n"
        if length > MAX_BODY:
            self.close_connection = True  # the body is left unread
            return 413, b"the body is too large\n"
        with self.server.bodies:
            body = self.rfile.read(length)
            if len(body) < length:
                self.close_connection = True
                return 400, b"the body ended before its Content-Length\n"
            try:
                doc = loads(body)  # the poll's reader: the same bound on the values it builds
            except TooMany as exc:
                return 400, f"{exc}\n".encode()
            except (ValueError, RecursionError):
                # ValueError: not JSON, or not UTF-8; nesting deeper than the
                # interpreter's stack is a RecursionError.
                return 400, b"the body is not JSON\n"
            del body
            try:
                sink(doc)
            except routes.bad as exc:
                return 400, f"{exc}\n".encode("utf-8", "backslashreplace")
        return 204, b""

    def _leave_body_unread(self) -> None:
        """Read past a refused request's body, so the connection stays usable
        and the client's write of it never meets a closed socket; one that
        cannot be read past (no length, too large, cut short) closes it,
        so it is never taken for the next request."""
        length = self._declared_length(missing="0")
        if length is None or length > MAX_BODY or not _skip(self.rfile, length):
            self.close_connection = True

    def _declared_length(self, missing: Optional[str] = None) -> Optional[int]:
        """The body's length as the request declares it (`missing` stands in
        for no header); None when it cannot be read past: chunked, or not
        a number ("²" is a digit to isdigit, not to int)."""
        length = self.headers.get("Content-Length", missing)
        if length is None or "Transfer-Encoding" in self.headers or not (length.isascii() and length.isdigit()):
            return None
        return int(length)

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        if status != 204:
            self.send_header("Content-Type", "application/json" if status == 200 else "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        else:  # so a client stops using the connection before it is closed idle
            self.send_header("Keep-Alive", f"timeout={self.server.limits.idle_seconds:g}")
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


def _readable(sock: socket.socket) -> bool:
    """Its next request is arriving: it counts as begun."""
    probe = select.poll()
    probe.register(sock, select.POLLIN)
    return bool(probe.poll(0))


def _hang_up(sock: socket.socket, how: int = socket.SHUT_RDWR) -> None:
    # SHUT_RDWR wakes a thread blocked reading the socket. An OSError:
    # already hung up, or closed.
    with contextlib.suppress(OSError):
        sock.shutdown(how)


class UnixConnection(http.client.HTTPConnection):
    """An `http.client` connection to a daemon's Unix socket, kept alive
    between requests: `connect` dials the socket, the library does the rest.
    `timeout` bounds each exchange whole, not each read: a socket answering
    a byte at a time holds its client no longer."""

    def __init__(self, path: str, timeout: float = 10.0):
        super().__init__("localhost", timeout=timeout)
        self.socket_path = path

    def connect(self) -> None:
        sock = _BoundedSocket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock

    def exchange(self, method: str, url: str, body: Optional[bytes] = None, headers: Optional[dict] = None) -> Tuple[int, bytes]:
        """(status, body) of one request on this connection, within `timeout`."""
        if self.sock is None:
            self.connect()
        self.sock.deadline = time.monotonic() + self.timeout
        self.request(method, url, body=body, headers=headers or {})
        response = self.getresponse()
        return response.status, response.read()


class _BoundedSocket(socket.socket):
    """A socket whose every read ends by `deadline` (time.monotonic)."""

    deadline: Optional[float] = None

    def recv_into(self, *args: Any) -> int:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("the exchange's deadline passed")
            self.settimeout(left)
        return super().recv_into(*args)
