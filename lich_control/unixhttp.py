"""The daemon's Unix socket: HTTP/1.1 for the relay's results and events, and status.

One thread accepts; each connection gets a thread that serves its requests
while the relay keeps it alive. Nothing here wakes on a timer: the accept and
the reads block until the relay speaks or `close` shuts the socket.
"""
from __future__ import annotations

import errno
import json
import logging
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable, Optional

log = logging.getLogger("lich_control.socket")

BACKLOG = 512  # a burst of results must never be refused (bridge.md: at least 128)
MAX_BODY = 16 * 1024 * 1024


class Routes:
    """What the socket serves; each sink raises `BadMessage`-like errors with a reason."""

    def __init__(self, result: Callable[[Any], None], event: Callable[[Any], None], status: Callable[[], dict], bad: type):
        self.result, self.event, self.status, self.bad = result, event, status, bad


class UnixHttpServer:
    def __init__(self, path: str, routes: Routes):
        self.path = path
        self._routes = routes
        self._sock: Optional[socket.socket] = None
        self._thread = threading.Thread(target=self._accept, name="lich-socket", daemon=True)
        self._closing = threading.Event()

    def listen(self) -> None:
        """Bind 0600 (a stale socket of an earlier daemon is replaced) and start accepting."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # no moment when the socket is open to others
        try:
            sock.bind(self.path)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        sock.listen(BACKLOG)
        self._sock = sock
        self._thread.start()

    def close(self) -> None:
        self._closing.set()
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError as exc:
                if self._closing.is_set():
                    return
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # Out of descriptors or memory: back off briefly, not spin.
                    log.warning("accepting on %s failed: %s", self.path, exc.strerror)
                    self._closing.wait(0.1)
                    continue
                if exc.errno == errno.ECONNABORTED:
                    continue
                log.error("the socket %s stopped accepting: %s", self.path, exc.strerror)
                return
            threading.Thread(target=self._serve, args=(conn,), name="lich-socket-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            _Handler(conn, "relay", self._routes)
        except OSError:
            pass  # the relay hung up mid-request
        except Exception:
            log.exception("serving a connection on the socket failed")
        finally:
            try:
                conn.close()
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "lich-control"
    sys_version = ""

    def __init__(self, conn, address, routes: Routes):
        self.routes = routes
        super().__init__(conn, address, None)

    def do_GET(self) -> None:
        if self._route() == "/v1/status":
            self._reply(200, json.dumps(self.routes.status(), ensure_ascii=False).encode("utf-8", "backslashreplace"), "application/json")
        else:
            self._refuse()

    def do_POST(self) -> None:
        route = self._route()
        sink = {"/v1/result": self.routes.result, "/v1/event": self.routes.event}.get(route)
        if sink is None:
            return self._refuse()
        body = self._body()
        if body is None:
            return
        try:
            doc = json.loads(body)
        except ValueError:
            return self._reply(400, b"the body is not JSON\n")
        try:
            sink(doc)
        except self.routes.bad as exc:
            return self._reply(400, f"{exc}\n".encode())
        self._reply(204, b"")

    def __getattr__(self, name: str):
        # Any other method on a known path is 405, on any other path 404.
        if name.startswith("do_"):
            return self._refuse
        raise AttributeError(name)

    def _refuse(self) -> None:
        if self._route() in ("/v1/status", "/v1/result", "/v1/event"):
            self._reply(405, b"method not allowed\n")
        else:
            self._reply(404, b"no such path\n")

    def _route(self) -> str:
        return self.path.split("?", 1)[0]

    def _body(self) -> Optional[bytes]:
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return self._chunked()
        if length is None or not length.isdigit():
            self._reply(411, b"a Content-Length is required\n")
            return None
        if int(length) > MAX_BODY:
            self.close_connection = True
            self._reply(413, b"the body is too large\n")
            return None
        return self.rfile.read(int(length))

    def _chunked(self) -> Optional[bytes]:
        parts, size = [], 0
        while True:
            line = self.rfile.readline(1024).split(b";", 1)[0].strip()
            try:
                n = int(line, 16)
            except ValueError:
                self.close_connection = True
                self._reply(400, b"a malformed chunk\n")
                return None
            if n == 0:
                while self.rfile.readline(1024).strip():
                    pass
                return b"".join(parts)
            size += n
            if size > MAX_BODY:
                self.close_connection = True
                self._reply(413, b"the body is too large\n")
                return None
            parts.append(self.rfile.read(n))
            self.rfile.readline(8)

    def _reply(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        if status != 204:
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if status != 204:
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        log.debug("socket: " + format, *args)

    def address_string(self) -> str:
        return "relay"
