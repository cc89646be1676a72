"""The daemon's socket: HTTP/1.1 for the relay's results and events, and
status, on `socketserver` and `http.server`, on a Unix socket, 0600, or where
there are none (Windows) on loopback TCP behind a per-daemon secret; and
`DaemonConnection`, the `http.client` connection every tool and test reaches
a daemon with. What bounds a request and a connection, and why:
docs/architecture.md, "What carries HTTP, and why".
"""
from __future__ import annotations

import contextlib
import http.client
import json
import logging
import hmac
import os
import secrets
import socket
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, Optional, Tuple

import attrs

from .bridge import BadMessage
from .json_reader import TooMany, loads
from .run_folder import check_socket, open_file
from .system import native

log = logging.getLogger("lich_control.socket")

# A burst of results must be queued, never refused (bridge.md: at least 128).
BACKLOG = 512
MAX_BODY = 16 * 1024 * 1024
IDLE_SECONDS = 60.0
ROUTES = ("/v1/result", "/v1/event", "/v1/status")
SECRET_HEADER = "X-Lich-Control-Secret"
# The loopback listener's, for a connection that has not shown the secret:
# the relay sends at most eight requests at once, each head well under 1 KiB.
CONNECTIONS = 64
HEAD_SECONDS = 10.0
HEAD_BYTES = 16 * 1024


@attrs.frozen
class Routes:
    """What the socket serves; each sink raises bridge.BadMessage with a reason for a body of the wrong shape."""

    result: Callable[[Any], None]
    event: Callable[[Any], None]
    status: Callable[[], dict]


class UnixListener:
    """The bridge on a Unix socket at `path`, 0600: the socket's mode is the
    guard, and the hello names the path."""

    family = getattr(socket, "AF_UNIX", None)
    secret: Optional[str] = None

    def __init__(self, path: str):
        self.path = self.server_address = path

    def bind(self, server: "BridgeServer") -> None:
        """What is at the path is removed only if it is a socket (an earlier
        daemon's, stale: the session lock is ours); anything else raises
        run_folder.NotOurs."""
        check_socket(self.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        # bind creates the file 0777 less the umask: 0600 from the start, so
        # no chmod by path follows.
        old = os.umask(0o177)
        try:
            server.server_bind()
        finally:
            os.umask(old)
        self._bound = os.lstat(self.path)

    @property
    def address(self) -> "Address":
        return Address(socket=self.path)

    def removed(self) -> bool:
        """True once the socket's file is gone from its path, or another is
        there: the relay, which connects by path, can no longer reach it."""
        try:
            now = os.lstat(self.path)
        except FileNotFoundError:
            return True
        return not os.path.samestat(now, self._bound)

    def close(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    # Only our own user reaches the socket (0600, in the 0700 run folder):
    # its connections are neither counted nor bounded before their first request.

    def accepted(self, sock: socket.socket) -> socket.socket:
        return sock

    def admit(self) -> bool:
        return True

    def release(self) -> None:
        pass


class LoopbackListener:
    """The bridge on 127.0.0.1 at a port of the system's choosing, where
    there are no Unix sockets (Windows): every request must carry the
    per-daemon `secret` in SECRET_HEADER, which the hello gives the relay and
    the address file at `path` lich-mod-status (the bridge's secret, never
    lich's token). Any local program can connect here, so until a
    connection's first request shows the secret, what it costs is bounded by
    `connections`, `head_seconds` and `head_bytes` (docs/architecture.md,
    "What carries HTTP, and why", says how far)."""

    family = socket.AF_INET
    server_address = ("127.0.0.1", 0)

    def __init__(self, path: str, connections: int = CONNECTIONS, head_seconds: float = HEAD_SECONDS, head_bytes: int = HEAD_BYTES):
        self.path = path
        self.secret = secrets.token_urlsafe(32)
        self.port = 0
        self.connections, self.head_seconds, self.head_bytes = connections, head_seconds, head_bytes
        self._slots = threading.BoundedSemaphore(connections)
        self._full = False  # a run of connections refused at the cap is logged once

    def bind(self, server: "BridgeServer") -> None:
        server.server_bind()
        self.port = server.server_address[1]
        # An earlier daemon's, stale (the session lock is ours). What cannot
        # be removed (a folder) is refused by the exclusive create.
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        fd = open_file(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with open(fd, "w", encoding="ascii") as out:
            json.dump({"pid": os.getpid(), "port": self.port, "secret": self.secret}, out)

    @property
    def address(self) -> "Address":
        return Address(port=self.port, secret=self.secret)

    def removed(self) -> bool:
        return not os.path.exists(self.path)

    def close(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def accepted(self, sock: socket.socket) -> "BoundedSocket":
        """`sock`, its first request's head held to the deadline and the budget
        until it shows the secret (`_Handler._answer` lifts both)."""
        sock = BoundedSocket.taking_over(sock)
        sock.deadline = time.monotonic() + self.head_seconds
        sock.budget = self.head_bytes
        return sock

    def admit(self) -> bool:
        """Whether an accepted connection is served: it then holds a slot until `release`."""
        if self._slots.acquire(blocking=False):
            return True
        if not self._full:
            self._full = True
            log.warning("the bridge holds %d connections, its most: newcomers are closed until one ends (the relay keeps 8 at most: another program holds them)", self.connections)
        return False

    def release(self) -> None:
        self._full = False
        self._slots.release()


def listener_at(path: str):
    """The platform's bridge listener (native.BRIDGE) for a daemon whose address is `path`."""
    return {"unix": UnixListener, "loopback": LoopbackListener}[native.BRIDGE](path)


class BridgeServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """The bridge's HTTP server on `listener`, the only difference between the
    platforms: `listen` (or `with`) binds it and starts a thread accepting,
    each connection served by a thread of its own; `close` ends both."""

    daemon_threads = True  # a connection's thread never holds the exit
    block_on_close = False
    request_queue_size = BACKLOG

    def __init__(self, listener, routes: Routes, idle_seconds: float = IDLE_SECONDS):
        self.address_family = listener.family
        super().__init__(listener.server_address, _Handler, bind_and_activate=False)
        self.listener = listener
        self.routes = routes
        self.idle_seconds = idle_seconds
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="lich-socket", daemon=True)

    def listen(self) -> None:
        self.listener.bind(self)
        self.server_activate()
        self._thread.start()

    def removed(self) -> bool:
        return self.listener.removed()

    def close(self) -> None:
        self._closing.set()
        with contextlib.suppress(OSError):
            self.socket.shutdown(socket.SHUT_RDWR)  # wakes the accept
        self.server_close()
        self.listener.close()

    def __enter__(self) -> "BridgeServer":
        self.listen()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # The listener's bounds, on socketserver's hooks: each accepted socket as
    # the listener wraps it, served only if the listener admits it (closed
    # at once otherwise), its slot released before the connection is shut,
    # so a client that sees it end can connect again.

    def get_request(self) -> Tuple[socket.socket, Any]:
        sock, address = super().get_request()
        return self.listener.accepted(sock), address

    def verify_request(self, request: Any, client_address: Any) -> bool:
        return self.listener.admit()

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            super().finish_request(request, client_address)
        finally:
            self.listener.release()

    def _accept(self) -> None:
        """The accepting thread: a blocking `handle_request` at a time, where
        `serve_forever` would wake twice a second; it ends once closed."""
        while not self._closing.is_set():
            try:
                self.handle_request()
            except OSError:  # Windows: the socket closed under its select
                if not self._closing.is_set():
                    raise

    def handle_error(self, request: Any, client_address: Any) -> None:
        # What a connection's handler did not answer: the relay hung up, or
        # stalled past the idle limit (its business), or a bug (the log's).
        if not isinstance(sys.exc_info()[1], OSError):
            log.exception("serving a connection on the socket failed")


class _Handler(BaseHTTPRequestHandler):
    """One relay connection: its requests answered in turn while it stays open."""

    server: BridgeServer
    protocol_version = "HTTP/1.1"  # keep-alive
    server_version = "lich-control"
    sys_version = ""
    wbufsize = -1  # an answer's head and body leave in one write, when the request is done
    error_message_format = "%(message)s\n"  # the library's own refusals (400, 414, 431): one line of text
    error_content_type = "text/plain; charset=utf-8"

    def setup(self) -> None:
        self.timeout = self.server.idle_seconds  # each read's: an idle connection ends
        # Over TCP: without it an answer waits for the client's delayed ACK, 40 ms a round trip.
        self.disable_nagle_algorithm = self.server.address_family == socket.AF_INET
        super().setup()

    def __getattr__(self, name: str):
        # Every method is answered by `_respond`: 405 on our paths for one
        # they do not take, 404 elsewhere (the contract), where the base
        # class would answer 501.
        if name.startswith("do_"):
            return self._respond
        raise AttributeError(name)

    def _respond(self) -> None:
        """The connection's one catch-all: a bug answers 500, and the server goes on."""
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
        secret = self.server.listener.secret
        if secret is not None:
            if not hmac.compare_digest(self.headers.get(SECRET_HEADER, "").encode(), secret.encode()):
                log.warning("refused %s %s on the bridge: %s", self.command, route, "a wrong secret" if SECRET_HEADER in self.headers else "no secret")
                self.close_connection = True  # a body it may carry is left unread
                return 403, b"the bridge's secret is missing or wrong\n"
            # The relay's: its body, and its next requests, as the idle limit allows.
            self.connection.unbound()
        routes = self.server.routes
        sink = {"/v1/result": routes.result, "/v1/event": routes.event}.get(route)
        if self.command == "GET" and route == "/v1/status":
            return 200, json.dumps(routes.status()).encode()  # ASCII: the document's text is already safe
        if self.command != "POST" or sink is None:
            self.close_connection = True  # no relay asks this: a body it may carry is left unread
            return (405, b"method not allowed\n") if route in ROUTES else (404, b"no such path\n")
        length = self.headers.get("Content-Length", "")
        # None, chunked, or not a number ("²" is a digit to isdigit, not to int).
        if "Transfer-Encoding" in self.headers or not (length.isascii() and length.isdigit()):
            self.close_connection = True
            return 411, b"a Content-Length is required\n"
        length = int(length)
        if length > MAX_BODY:
            self.close_connection = True  # the body is left unread
            return 413, b"the body is too large\n"
        body = self.rfile.read(length)
        if len(body) < length:
            self.close_connection = True
            return 400, b"the body ended before its Content-Length\n"
        try:
            doc = loads(body)  # the poll's reader: the same bound on the values it builds
        except TooMany as exc:
            return 400, f"{exc}\n".encode()
        except (ValueError, RecursionError):  # not JSON, or nested deeper than the stack
            return 400, b"the body is not JSON\n"
        del body
        try:
            sink(doc)
        except BadMessage as exc:
            return 400, f"{exc}\n".encode("utf-8", "backslashreplace")
        return 204, b""

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        if status != 204:
            self.send_header("Content-Type", "application/json" if status == 200 else "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        else:  # so a client stops using the connection before it is closed idle
            self.send_header("Keep-Alive", f"timeout={self.server.idle_seconds:g}")
        self.end_headers()
        if status != 204 and self.command != "HEAD":
            self.wfile.write(body)

    def log_request(self, code: Any = "-", size: Any = "-") -> None:
        pass  # no line per request: results come in bursts

    def log_message(self, format: str, *args: Any) -> None:
        log.info("socket: " + format, *args)  # the library's own refusals; stderr is not ours to write


@attrs.frozen
class Address:
    """Where a daemon's bridge is: its Unix socket, or its loopback port and
    the secret every request there carries (kept out of `repr`)."""

    socket: Optional[str] = None
    port: Optional[int] = None
    secret: Optional[str] = attrs.field(default=None, repr=False)

    def hello(self) -> dict:
        """This address as the hello line gives it to the relay."""
        return {"socket": self.socket} if self.socket is not None else {"port": self.port, "secret": self.secret}

    @classmethod
    def of(cls, doc: dict) -> "Address":
        """From a hello line or an address file; KeyError or TypeError for one of neither shape."""
        if "socket" in doc:
            return cls(socket=str(doc["socket"]))
        if not isinstance(doc["port"], int) or not isinstance(doc["secret"], str):
            raise TypeError("not a port and a secret")
        return cls(port=doc["port"], secret=doc["secret"])


def read_address(path: str) -> Address:
    """The address a daemon's file at `path` names: the socket itself, or
    the address file a LoopbackListener wrote (OSError, ValueError,
    LookupError or TypeError for one that cannot be read)."""
    if not path.endswith(".address"):
        return Address(socket=path)
    with open(path, encoding="ascii") as file:
        return Address.of(json.loads(file.read(4096)))


class DaemonConnection(http.client.HTTPConnection):
    """An `http.client` connection to a daemon's bridge at `address`, kept
    alive between requests. `timeout` bounds each exchange whole, not each
    read: a socket answering a byte at a time holds its client no longer."""

    def __init__(self, address: Address, timeout: float = 10.0):
        super().__init__("127.0.0.1", address.port, timeout=timeout)
        self.address = address

    def connect(self) -> None:
        unix = self.address.socket is not None
        sock = BoundedSocket(socket.AF_UNIX if unix else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.address.socket if unix else (self.host, self.port))
            if not unix:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            sock.close()
            raise
        self.sock = sock

    def putrequest(self, *args: Any, **kwargs: Any) -> None:
        super().putrequest(*args, **kwargs)
        if self.address.secret is not None:  # every request on a loopback bridge carries it
            self.putheader(SECRET_HEADER, self.address.secret)

    def exchange(self, method: str, url: str, body: Optional[bytes] = None, headers: Optional[dict] = None) -> Tuple[int, bytes]:
        """(status, body) of one request on this connection, within `timeout`."""
        if self.sock is None:
            self.connect()
        self.sock.deadline = time.monotonic() + self.timeout
        self.request(method, url, body=body, headers=headers or {})
        response = self.getresponse()
        return response.status, response.read()


class BoundedSocket(socket.socket):
    """A socket whose every read and write ends by `deadline`
    (time.monotonic), and whose reads take at most `budget` bytes in all
    (None: not bounded), so a peer trickling bytes cannot hold a reader, nor
    grow its buffer. http.client reads through `recv_into` (a file made on
    the socket calls it too) and writes through `sendall`. The one deadline
    socket: the bridge's connections, a client's of a daemon, and lich's."""

    deadline: Optional[float] = None
    budget: Optional[int] = None
    _timeout: Optional[float] = None  # the timeout last set, for one call

    @classmethod
    def taking_over(cls, sock: socket.socket) -> "BoundedSocket":
        """`sock`, connected, as one of these, with the timeout it had."""
        timeout = sock.gettimeout()
        new = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        new.settimeout(timeout)
        return new

    def settimeout(self, value: Optional[float]) -> None:
        self._timeout = value
        super().settimeout(value)

    def unbound(self) -> None:
        """Neither deadline nor budget from now on: each read waits the timeout last set."""
        self.deadline = self.budget = None
        super().settimeout(self._timeout)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._cap()
        if self.budget is None:
            return super().recv_into(buffer, nbytes, flags)
        if self.budget == 0:
            raise ConnectionAbortedError("the read budget is spent")
        got = super().recv_into(buffer, min(nbytes or len(buffer), self.budget), flags)
        self.budget -= got
        return got

    def sendall(self, *args: Any) -> None:
        self._cap()
        super().sendall(*args)

    def _cap(self) -> None:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("the deadline passed")
            super().settimeout(left if self._timeout is None else min(left, self._timeout))
