"""A small loopback lich for the tests: scripted, recording, and real HTTP.

Polls are held until something is queued (or `hold` runs out, answering
`[]`), like lich's. Tests queue plain commands with `send`, or script one
poll's whole answer with `script` (a status, a raw body, a dropped
connection). Every poll and ack is recorded with its headers, and waiting
for one is a condition wait with a deadline: no test sleeps.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

TOKEN = "tok-3f9a-secret"


class Answer:
    """One scripted poll answer."""

    def __init__(self, status=200, body=None, raw=None, drop=False, delay=0.0, reset_mid_body=False, length=None, close_after=False):
        self.status, self.body, self.raw = status, body, raw
        self.drop, self.delay, self.reset_mid_body, self.length = drop, delay, reset_mid_body, length
        # A declared length longer than the body only ends when the connection does.
        self.close_after = close_after or length is not None


class FakeLich:
    def __init__(self, token=TOKEN, hold=25.0, port=0):
        self.token = token
        self.hold = hold
        self.cond = threading.Condition()
        self.queue = []  # commands waiting for a poll
        self.scripted = []  # Answers for the next polls, before the queue
        self.polls = []  # (monotonic time, query, headers)
        self.acks = []  # (monotonic time, body dict or raw, headers)
        self.ack_status = []  # scripted statuses for the next acks
        self.parked = 0
        self.acks_arrived = 0
        self.ack_ids_arrived = []  # every ack attempt's id, faults included
        self.ack_gate = threading.Event()  # cleared by a test to hold acks unanswered
        self.ack_gate.set()
        self.closed = False
        self.conns = set()
        self.ack_faults = []  # scripted: "drop" closes an ack's connection unanswered
        lich = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def setup(self):
                super().setup()
                with lich.cond:
                    lich.conns.add(self.connection)

            def finish(self):
                with lich.cond:
                    lich.conns.discard(self.connection)
                try:
                    super().finish()
                except OSError:
                    pass

            def do_GET(self):
                url = urlsplit(self.path)
                if url.path != "/mod/commands":
                    return self._send(404, b"no such path")
                query = parse_qs(url.query)
                with lich.cond:
                    lich.polls.append((time.monotonic(), query, dict(self.headers)))
                    lich.cond.notify_all()
                if query.get("token") != [lich.token]:
                    return self._send(401, b"bad token")
                answer = lich._next_answer()
                if answer is None:  # killed while the poll was parked
                    self.close_connection = True
                    return
                if answer.delay:
                    threading.Event().wait(answer.delay)  # the server answering slowly
                if answer.drop:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                body = answer.raw if answer.raw is not None else json.dumps(answer.body).encode()
                if answer.reset_mid_body:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body) * 2))
                    self.end_headers()
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    self.close_connection = True
                    return
                self._send(answer.status, body, length=answer.length, close=answer.close_after)
                if answer.close_after:
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)

            def do_POST(self):
                url = urlsplit(self.path)
                if url.path != "/mod/acks":
                    return self._send(404, b"no such path")
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw
                with lich.cond:
                    lich.acks_arrived += 1
                    lich.ack_ids_arrived.append(body.get("id") if isinstance(body, dict) else None)
                    fault = lich.ack_faults.pop(0) if lich.ack_faults else None
                    lich.cond.notify_all()
                if fault == "drop":
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                lich.ack_gate.wait(30)
                with lich.cond:
                    lich.acks.append((time.monotonic(), body, dict(self.headers), parse_qs(url.query)))
                    status = lich.ack_status.pop(0) if lich.ack_status else 204
                    lich.cond.notify_all()
                if parse_qs(url.query).get("token") != [lich.token]:
                    return self._send(401, b"bad token")
                self._send(status, b"" if status == 204 else b"refused: because the test said so")

            def _send(self, status, body, length=None, close=False):
                self.send_response(status)
                if close:  # a server that closes says so, or a client may reuse the connection first
                    self.send_header("Connection", "close")
                if status != 204:
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body) if length is None else length))
                self.end_headers()
                if status != 204:
                    self.wfile.write(body)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # a daemon hanging up mid-answer is what some tests do

        self.server = Server(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def _next_answer(self) -> Answer:
        deadline = time.monotonic() + self.hold
        with self.cond:
            self.parked += 1
            try:
                while not self.scripted and not self.queue and not self.closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return Answer(body=[])
                    self.cond.wait(left)
                if self.closed:
                    return None
                if self.scripted:
                    return self.scripted.pop(0)
                batch, self.queue = self.queue, []
                return Answer(body=batch)
            finally:
                self.parked -= 1
                self.cond.notify_all()

    # -- the test's side -----------------------------------------------

    def send(self, *commands):
        with self.cond:
            self.queue.extend(commands)
            self.cond.notify_all()

    def script(self, *answers):
        with self.cond:
            self.scripted.extend(answers)
            self.cond.notify_all()

    def wait_for(self, predicate, timeout=10.0, what="the condition"):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for {what}; polls={len(self.polls)} acks={self.ack_bodies()}")
                self.cond.wait(left)

    def wait_polls(self, n, timeout=10.0):
        self.wait_for(lambda: len(self.polls) >= n, timeout, f"{n} polls")
        return self.polls

    def wait_acks(self, n, timeout=10.0):
        self.wait_for(lambda: len(self.acks) >= n, timeout, f"{n} acks")
        return self.ack_bodies()

    def wait_parked(self, timeout=10.0):
        self.wait_for(lambda: self.parked > 0, timeout, "a parked poll")

    def ack_bodies(self):
        return [body for _, body, _, _ in self.acks]

    def ack_for(self, cid, timeout=10.0):
        self.wait_for(lambda: any(isinstance(b, dict) and b.get("id") == cid for b in self.ack_bodies()), timeout, f"the ack for {cid}")
        return next(b for b in self.ack_bodies() if isinstance(b, dict) and b.get("id") == cid)

    def kill(self):
        """As if lich died: stop listening and reset every open connection."""
        with self.cond:
            self.closed = True
            conns = list(self.conns)
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()
        for conn in conns:
            try:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()
