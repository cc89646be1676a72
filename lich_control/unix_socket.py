"""The daemon's Unix socket: HTTP/1.1 for the relay's results and events, and status.

One thread accepts; each connection gets a thread that serves its requests
while the relay keeps it alive. Nothing here wakes on a timer: the accept and
the reads block until the relay speaks or `close` shuts the socket.
"""
from __future__ import annotations

import errno
import http
import json
import logging
import os
import socket
import threading
from typing import Any, Callable, Optional

log = logging.getLogger("lich_control.socket")

BACKLOG = 512  # a burst of results must never be refused (bridge.md: at least 128)
MAX_BODY = 16 * 1024 * 1024
MAX_LINE = 65536  # a request line or a header line
MAX_HEADERS = 100


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
            _Handler(conn, self._routes).serve()
        except OSError:
            pass  # the relay hung up mid-request
        except Exception:
            log.exception("serving a connection on the socket failed")
        finally:
            try:
                conn.close()
            except OSError:
                pass


class _Handler:
    """One relay connection: its requests read and answered in turn while the
    relay keeps it alive. A lean HTTP/1.1 reader: the benchmark measured
    `BaseHTTPRequestHandler` at half the daemon's CPU per command in a burst
    (its email-package header parser, a Date header per answer, several
    writes); the relay sends a request line, a few headers and a JSON body."""

    def __init__(self, conn: socket.socket, routes: Routes):
        self._sock = conn
        self._rfile = conn.makefile("rb")
        self.routes = routes

    def serve(self) -> None:
        try:
            while self._one():
                pass
        finally:
            self._rfile.close()

    def _one(self) -> bool:
        """Read and answer one request; False once the connection is done."""
        line = self._rfile.readline(MAX_LINE + 1)
        while line in (b"\r\n", b"\n"):  # stray line ends between requests are ignored
            line = self._rfile.readline(MAX_LINE + 1)
        if not line:
            return False  # the relay hung up
        if len(line) > MAX_LINE:
            return self._reply(414, b"the request line is too long\n", close=True)
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return self._reply(400, b"not an HTTP/1.x request line\n", close=True)
        method, target, version = parts
        headers = {}
        for _ in range(MAX_HEADERS + 1):
            raw = self._rfile.readline(MAX_LINE + 1)
            if len(raw) > MAX_LINE:
                return self._reply(431, b"a header line is too long\n", close=True)
            if raw in (b"\r\n", b"\n", b""):
                break
            name, colon, value = raw.decode("latin-1").partition(":")
            if not colon:
                return self._reply(400, b"a malformed header line\n", close=True)
            headers[name.strip().lower()] = value.strip()
        else:
            return self._reply(431, b"too many header lines\n", close=True)
        connection = headers.get("connection", "").lower()
        close = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
        has_body = headers.get("transfer-encoding", "").lower() == "chunked" or headers.get("content-length", "0") != "0"
        route = target.split("?", 1)[0]
        sink = {"/v1/result": self.routes.result, "/v1/event": self.routes.event}.get(route)
        if method == "GET" and route == "/v1/status" and not has_body:
            body = json.dumps(self.routes.status(), ensure_ascii=False).encode("utf-8", "backslashreplace")
            return self._reply(200, body, close, "application/json")
        if method != "POST" or sink is None:
            # An unread body must not be taken for the next request.
            if route in ("/v1/status", "/v1/result", "/v1/event"):
                return self._reply(405, b"method not allowed\n", close or has_body)
            return self._reply(404, b"no such path\n", close or has_body)
        if headers.get("expect", "").lower() == "100-continue":
            self._sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body, problem = self._body(headers)
        if problem is not None:
            return self._reply(problem[0], problem[1], close=True)
        try:
            doc = json.loads(body)
        except ValueError:
            return self._reply(400, b"the body is not JSON\n", close)
        try:
            sink(doc)
        except self.routes.bad as exc:
            return self._reply(400, f"{exc}\n".encode(), close)
        return self._reply(204, b"", close)

    def _body(self, headers: dict):
        """(body, None), or (None, (status, text)) when it cannot be read."""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            return self._chunked()
        length = headers.get("content-length")
        if length is None or not length.isdigit():
            return None, (411, b"a Content-Length is required\n")
        if int(length) > MAX_BODY:
            return None, (413, b"the body is too large\n")
        body = self._rfile.read(int(length))
        if len(body) < int(length):
            raise ConnectionResetError("the relay hung up mid-body")
        return body, None

    def _chunked(self):
        parts, size = [], 0
        while True:
            line = self._rfile.readline(1024).split(b";", 1)[0].strip()
            try:
                n = int(line, 16)
            except ValueError:
                n = -1
            if n < 0:  # a negative size would read to the end of the stream
                return None, (400, b"a malformed chunk\n")
            if n == 0:
                while self._rfile.readline(1024).strip():
                    pass
                return b"".join(parts), None
            size += n
            if size > MAX_BODY:
                return None, (413, b"the body is too large\n")
            parts.append(self._rfile.read(n))
            self._rfile.readline(8)

    def _reply(self, status: int, body: bytes, close: bool = False, content_type: str = "text/plain; charset=utf-8") -> bool:
        """One write per answer; True while the connection stays open."""
        head = [f"HTTP/1.1 {status} {_PHRASES.get(status, '')}", "Server: lich-control"]
        if status != 204:
            head += [f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
        if close:
            head.append("Connection: close")
        self._sock.sendall("\r\n".join(head).encode("latin-1") + b"\r\n\r\n" + (body if status != 204 else b""))
        return not close


_PHRASES = {status.value: status.phrase for status in http.HTTPStatus}
