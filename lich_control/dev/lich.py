"""A development lich: the server side of the mod-control contract, small but faithful.

    lich-stub serve [--port N] [--token T]          (python -m lich_control.dev.cli)
    lich-stub control SESSION prompt TEXT | abort | model [NAME] | ...
    lich-stub ask SESSION QUESTION

In-process use (the demo, the tests, the benchmark)::

    from lich_control.dev.lich import StubLich, NotPolling

    with StubLich(hold=25.0) as lich:         # listens on 127.0.0.1, port 0
        lich.port, lich.token                   # give these to the daemon (LICH_PORT, LICH_TOKEN)
        lich.wait_polled("s1", timeout=5)       # True once the mod for s1 has polled
        lich.wait_until("s1", lambda info: info.hung_up, timeout=5)   # any PollInfo condition
        cid = lich.queue("s1", {"kind": "prompt", "text": "hi"})   # id assigned if absent
        outcome = lich.wait(cid, timeout=10)    # Outcome: delivered, ack (the body), ok, took_s
        outcome = lich.send("s1", {"kind": "abort"}, timeout=10)   # queue + wait in one
        lich.polled("s1")                       # PollInfo: polls, last poll age, parked now
        lich.acks_received                      # every valid ack, counted (benchmarks)
        lich.queue_all("s1", [cmd, cmd, ...])   # queued as one: a single poll carries them
        lich.on_poll = lambda session_id: ...   # benchmark hooks, called on the connection
        lich.on_ack = lambda doc: ...           #   thread as a poll arrives / a valid ack lands

`queue` raises `NotPolling` (a `Refused`) when the session's mod has not
polled in the last 30 s or hung up its last poll, and `Refused` for what lich
itself refuses (/model and /effort as slash commands). What it keeps:

- `GET /mod/commands?token=…&session_id=…` answers at once with the queued
  commands, else holds up to `hold` seconds and answers `[]`; a command
  queued meanwhile wakes it. Delivery is at most once. A command queued more
  than 30 s before the poll that would take it is dropped instead.
- `POST /mod/acks?token=…` validates the body as `tests/fixtures/acks.jsonl`
  says (400 with the reason), 401 for a wrong token, 405 for a wrong method,
  400 for a body over 64 KiB, else 204. An ack is accepted for any kind.
- `POST /stub/control?token=…` `{"session_id", "command", "timeout"}` queues
  one command and answers, once it is acked or the time is up, with
  `Outcome.to_json()` (409 `{"error"}` when refused). `GET /stub/sessions`
  lists who polled when. Both are this stub's own, for `lich-stub control`.

Threads: one accepts (`lich-stub`); each connection gets its own, which
parks there while its poll is held; `lich-stub-hangups` watches parked polls
for a client that went away (lich's "client gone"). All shared state sits
behind one condition; each command's ack has its own event, so thousands of
waiters do not wake each other.
"""
from __future__ import annotations

import collections
import hmac
import itertools
import json
import logging
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Deque, Dict, List, Optional
from urllib.parse import parse_qs, urlsplit

import attrs

from .hangups import HangupWatch

log = logging.getLogger("lich_control.dev.lich")

HOLD_SECONDS = 25.0
STALE_SECONDS = 30.0  # lich stops queueing for a mod this long without a poll
MAX_ACK_BYTES = 64 * 1024
MAX_CONTROL_BYTES = 1024 * 1024
REFUSED_COMMANDS = ("model", "effort")  # lich refuses these slash commands


class Refused(Exception):
    """lich will not queue this command; the text says why and what to do."""


class NotPolling(Refused):
    """The session's mod is not polling: nobody would take the command."""


@attrs.frozen
class PollInfo:
    session_id: str
    polls: int
    last_poll_age_s: Optional[float]  # since the last poll arrived; None: never
    parked: int  # polls held open right now
    hung_up: bool  # the last poll ended with the client gone, none since
    plugin: Optional[str]  # X-Lich-Plugin of the last poll


@attrs.frozen
class Outcome:
    """What became of one queued command."""

    id: str
    kind: str
    session_id: str
    delivered: bool
    ack: Optional[dict] = None  # the ack body as the mod sent it
    dropped: Optional[str] = None  # why it was never delivered
    took_s: Optional[float] = None  # queued to acked

    @property
    def acked(self) -> bool:
        return self.ack is not None

    @property
    def ok(self) -> bool:
        return self.ack is not None and self.ack.get("ok") is True

    def to_json(self) -> dict:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> "Outcome":
        return cls(**{f.name: doc.get(f.name) for f in attrs.fields(cls)})


def validate_ack(doc) -> Optional[str]:
    """None for a well-formed ack body, else lich's reason (the fixtures' `reject`)."""
    if not isinstance(doc, dict):
        return "body must be a JSON object"
    for name in ("session_id", "id", "kind"):
        if name not in doc or doc[name] is None:
            return f"{name} is required"
        if not isinstance(doc[name], str) or not doc[name]:
            return f"{name} must be a non-empty string"
    if not isinstance(doc.get("ok"), bool):
        return "ok must be a boolean"
    if "error" in doc and not isinstance(doc["error"], str):
        return "error must be a string"
    if "answer" in doc:
        if doc["kind"] != "ask" or doc["ok"] is not True:
            return "only an answered ask carries an answer"
        if not isinstance(doc["answer"], str):
            return "answer must be a string"
    return None


class _Queued:
    """One command from queueing to its ack; its fields are guarded by the stub's lock."""

    __slots__ = ("command", "session_id", "queued_at", "delivered", "dropped", "ack", "acked_at", "settled")

    def __init__(self, command: dict, session_id: str, now: float):
        self.command, self.session_id, self.queued_at = command, session_id, now
        self.delivered = False
        self.dropped: Optional[str] = None
        self.ack: Optional[dict] = None
        self.acked_at: Optional[float] = None
        self.settled = threading.Event()  # acked or dropped


class _Mod:
    """What the stub knows of one session's mod."""

    def __init__(self):
        self.waiting: Deque[_Queued] = collections.deque()
        self.polls = 0
        self.last_poll: Optional[float] = None
        self.parked = 0
        self.hung_up = False
        self.plugin: Optional[str] = None


class StubLich:
    def __init__(
        self,
        token: Optional[str] = None,
        port: int = 0,
        hold: float = HOLD_SECONDS,
        stale_after: float = STALE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.token = token or secrets.token_urlsafe(24)
        self.hold = hold
        self.stale_after = stale_after
        self._clock = clock  # the 30-s rules read it; held polls wait on real time
        self._cond = threading.Condition()
        self._mods: Dict[str, _Mod] = collections.defaultdict(_Mod)
        self._commands: Dict[str, _Queued] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self.acks_received = 0
        self.stray_acks = 0  # acks for an id this stub never handed out
        # Timestamp hooks for the benchmark; they must return at once.
        self.on_poll: Optional[Callable[[str], None]] = None
        self.on_ack: Optional[Callable[[dict], None]] = None
        self._hangups = HangupWatch()
        self._server = _Server(("127.0.0.1", port), _handler_for(self))
        self.port: int = self._server.server_address[1]
        # serve_forever notices shutdown only between selects: a short
        # interval keeps close() (and every test's teardown) quick.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="lich-stub", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "StubLich":
        self._hangups.start()
        self._thread.start()
        return self

    def close(self) -> None:
        """Answer every held poll `[]`, stop listening, and let waiters go."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            waiting = list(self._commands.values())
        for entry in waiting:
            entry.settled.set()  # a waiter hears "not acked" now, not at its timeout
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        self._hangups.close()

    def __enter__(self) -> "StubLich":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the driving side --------------------------------------------------

    def queue(self, session_id: str, command: dict) -> str:
        """Queue one command for the session's next poll; its id (assigned when absent)."""
        return self.queue_all(session_id, [command])[0]

    def queue_all(self, session_id: str, commands: List[dict]) -> List[str]:
        """Queue several commands at once, so a poll takes all or none of
        them; their ids. One refused command refuses them all."""
        commands = [dict(command) for command in commands]
        for command in commands:
            if command.get("kind") == "command" and command.get("name") in REFUSED_COMMANDS:
                raise Refused(
                    f"/{command['name']} is refused: run through a mod it would become the default of every "
                    f"new session; use the {command['name']} command instead"
                )
        now = self._clock()
        with self._cond:
            mod = self._mods[session_id]
            problem = self._not_polling(session_id, mod, now)
            if problem:
                raise NotPolling(problem)
            ids = []
            for command in commands:
                cid = command.setdefault("id", f"k{next(self._ids)}")
                if cid in self._commands or cid in ids:
                    raise Refused(f"a command with id {cid!r} was queued already")
                ids.append(cid)
            for command in commands:
                entry = self._commands[command["id"]] = _Queued(command, session_id, now)
                mod.waiting.append(entry)
            self._cond.notify_all()
        return ids

    def wait(self, cid: str, timeout: Optional[float]) -> Outcome:
        """Wait until the command is acked or dropped, or `timeout` runs out."""
        with self._cond:
            entry = self._commands[cid]
        entry.settled.wait(timeout)
        with self._cond:
            took = None if entry.acked_at is None else round(entry.acked_at - entry.queued_at, 3)
            return Outcome(
                id=cid,
                kind=str(entry.command.get("kind")),
                session_id=entry.session_id,
                delivered=entry.delivered,
                ack=entry.ack,
                dropped=entry.dropped,
                took_s=took,
            )

    def send(self, session_id: str, command: dict, timeout: Optional[float]) -> Outcome:
        return self.wait(self.queue(session_id, command), timeout)

    def polled(self, session_id: str) -> PollInfo:
        now = self._clock()
        with self._cond:
            return self._info(session_id, self._mods.get(session_id) or _Mod(), now)

    def sessions(self) -> List[PollInfo]:
        now = self._clock()
        with self._cond:
            return [self._info(sid, mod, now) for sid, mod in sorted(self._mods.items()) if mod.polls]

    def wait_polled(self, session_id: str, timeout: float, more_than: int = 0, parked: bool = False) -> bool:
        """True once the session has polled more than `more_than` times (and,
        with `parked`, a poll is held open right now)."""
        return self.wait_until(session_id, lambda info: info.polls > more_than and (info.parked > 0 or not parked), timeout)

    def wait_until(self, session_id: str, predicate: Callable[[PollInfo], bool], timeout: float) -> bool:
        """True once `predicate` holds for the session's PollInfo; False when time runs out."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if predicate(self._info(session_id, self._mods.get(session_id) or _Mod(), self._clock())):
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._cond.wait(left)

    # -- the contract's side (connection threads) ---------------------------

    def _poll(self, session_id: str, plugin: Optional[str], conn) -> Optional[List[dict]]:
        """The commands for one poll, held until some come; None if the client left."""
        if self.on_poll is not None:
            self.on_poll(session_id)
        gone = threading.Event()
        deadline = time.monotonic() + self.hold
        with self._cond:
            mod = self._mods[session_id]
            mod.polls += 1
            mod.last_poll = self._clock()
            mod.hung_up = False
            mod.plugin = plugin
            mod.parked += 1
            self._cond.notify_all()
        self._hangups.watch(conn, lambda: self._hung_up(gone))
        try:
            with self._cond:
                while True:
                    self._drop_stale(mod)
                    if gone.is_set():
                        mod.hung_up = True
                        return None
                    left = deadline - time.monotonic()
                    if mod.waiting or self._closed or left <= 0:
                        batch, mod.waiting = list(mod.waiting), collections.deque()
                        for entry in batch:
                            entry.delivered = True
                        return [entry.command for entry in batch]
                    self._cond.wait(left)
        finally:
            self._hangups.forget(conn)
            with self._cond:
                mod.parked -= 1
                self._cond.notify_all()

    def _hung_up(self, gone: threading.Event) -> None:
        with self._cond:
            gone.set()
            self._cond.notify_all()

    def _ack(self, doc: dict) -> None:
        now = self._clock()
        with self._cond:
            self.acks_received += 1
            entry = self._commands.get(doc["id"])
            if entry is None or not entry.delivered:
                self.stray_acks += 1
                return
            if entry.ack is not None:
                return  # lich resolves a wait with the first ack it gets
            entry.ack, entry.acked_at = doc, now
        if self.on_ack is not None:
            self.on_ack(doc)
        entry.settled.set()

    def _drop_stale(self, mod: _Mod) -> None:
        now = self._clock()
        while mod.waiting and now - mod.waiting[0].queued_at > self.stale_after:
            entry = mod.waiting.popleft()
            entry.dropped = f"no poll took it within {self.stale_after:g} s"
            entry.settled.set()

    def _not_polling(self, session_id: str, mod: _Mod, now: float) -> Optional[str]:
        check = (
            f"check that lich-mod-daemon runs for session {session_id} with LICH_PORT={self.port}, "
            f"LICH_SESSION_ID={session_id} and this stub's token"
        )
        if mod.last_poll is None:
            return f"no mod has polled for session {session_id}: {check}"
        if mod.hung_up and not mod.parked:
            return f"the mod for session {session_id} hung up its poll and has not polled since: {check}"
        age = now - mod.last_poll
        if age > self.stale_after and not mod.parked:
            return f"the mod for session {session_id} has not polled for {age:.0f} s: {check}"
        return None

    def _info(self, session_id: str, mod: _Mod, now: float) -> PollInfo:
        age = None if mod.last_poll is None else round(now - mod.last_poll, 3)
        return PollInfo(session_id, mod.polls, age, mod.parked, mod.hung_up, mod.plugin)

    def _check(self, token: Optional[str]) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.token.encode())


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Read by listen() in the constructor, so it must be set on the class:
    # a hundred daemons connecting at once must not overflow the backlog.
    request_queue_size = 1024

    def handle_error(self, request, client_address) -> None:
        # A mod that went away mid-answer (a daemon stopped while its poll
        # was held) is lich's everyday business, not a traceback on stderr.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


def _handler_for(lich: StubLich):
    class Handler(_Handler):
        pass

    Handler.lich = lich
    return Handler


_MAX_HEADERS = 100


class _Headers(dict):
    """A request's headers by lower-cased name; `get` takes any case."""

    def get(self, name: str, default=None):
        return dict.get(self, name.lower(), default)


_MOD_PATHS = {"/mod/commands": "GET", "/mod/acks": "POST", "/stub/control": "POST", "/stub/sessions": "GET"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the daemon reuses its connections
    disable_nagle_algorithm = True
    # Buffered, so an answer's headers and body go out in one write when
    # handle_one_request flushes: two made the mod wake twice per answer.
    wbufsize = -1
    server_version = "lich-stub"
    sys_version = ""
    lich: StubLich

    def parse_request(self) -> bool:
        """The request line and headers, without the email package's parser
        BaseHTTPRequestHandler uses (~30 us a request, on every ack's path
        in the benchmark); what that would refuse is refused here too."""
        self.command, self.request_version, self.close_connection = None, "HTTP/0.9", True
        self.requestline = self.raw_requestline.decode("iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if len(words) != 3 or not words[2].startswith("HTTP/1."):
            self.send_error(400, "Bad request")
            return False
        self.command, self.path, self.request_version = words
        headers = _Headers()
        for _ in range(_MAX_HEADERS + 1):
            line = self.rfile.readline(65537)
            if len(line) > 65536:
                self.send_error(431, "Line too long")
                return False
            if line in (b"\r\n", b"\n", b""):
                break
            name, colon, value = line.decode("iso-8859-1").partition(":")
            if colon:
                headers[name.strip().lower()] = value.strip()
        else:
            self.send_error(431, "Too many headers")
            return False
        self.headers = headers
        connection = headers.get("Connection", "").lower()
        self.close_connection = connection == "close" or (self.request_version == "HTTP/1.0" and connection != "keep-alive")
        if headers.get("Expect", "").lower() == "100-continue":
            return self.handle_expect_100()
        return True

    def __getattr__(self, name: str):
        if name.startswith("do_"):
            return self._dispatch
        raise AttributeError(name)

    def _dispatch(self) -> None:
        url = urlsplit(self.path)
        wanted = _MOD_PATHS.get(url.path)
        if wanted is None:
            self.close_connection = True  # an unread body must not be taken for a request
            return self._reply(404, b"no such path\n")
        if self.command != wanted:
            self.close_connection = True  # an unread body must not be taken for a request
            return self._reply(405, b"method not allowed\n", extra={"Allow": wanted})
        query = parse_qs(url.query)
        if not self.lich._check((query.get("token") or [None])[0]):
            self.close_connection = True
            return self._reply(401, b"wrong token\n")
        getattr(self, "_" + url.path.rsplit("/", 1)[1])(query)

    def _commands(self, query: dict) -> None:
        session_id = (query.get("session_id") or [""])[0]
        if not session_id:
            return self._reply(400, b"session_id is required\n")
        batch = self.lich._poll(session_id, self.headers.get("X-Lich-Plugin"), self.connection)
        if batch is None:
            self.close_connection = True
            return
        if self.lich._closed:
            # A closed lich answers its last poll and hangs up: a mod kept on
            # this connection would otherwise poll a closing stub in a loop.
            self.close_connection = True
        self._reply(200, json.dumps(batch, ensure_ascii=False).encode("utf-8", "backslashreplace"), "application/json")

    def _acks(self, query: dict) -> None:
        raw = self._body(MAX_ACK_BYTES)
        if raw is None:
            return
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        problem = validate_ack(doc)
        if problem:
            return self._reply(400, f"{problem}\n".encode())
        self.lich._ack(doc)
        self._reply(204, b"")

    def _control(self, query: dict) -> None:
        raw = self._body(MAX_CONTROL_BYTES)
        if raw is None:
            return
        try:
            doc = json.loads(raw)
            session_id, command, timeout = doc["session_id"], doc["command"], float(doc.get("timeout", 100))
            if not isinstance(session_id, str) or not session_id or not isinstance(command, dict):
                raise ValueError
        except (ValueError, KeyError, TypeError):
            return self._json(400, {"error": "the body must be {session_id, command, timeout}"})
        try:
            cid = self.lich.queue(session_id, command)
        except Refused as exc:
            return self._json(409, {"error": str(exc), "not_polling": isinstance(exc, NotPolling)})
        self._json(200, self.lich.wait(cid, timeout).to_json())

    def _sessions(self, query: dict) -> None:
        self._json(200, {"sessions": [attrs.asdict(info) for info in self.lich.sessions()]})

    def _body(self, limit: int) -> Optional[bytes]:
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            self.close_connection = True
            self._reply(411, b"a Content-Length is required\n")
            return None
        if int(length) > limit:
            self.close_connection = True  # the body is left unread
            self._reply(400, f"the body is over {limit // 1024} KiB\n".encode())
            return None
        return self.rfile.read(int(length))

    def _json(self, status: int, doc: dict) -> None:
        self._reply(status, json.dumps(doc, ensure_ascii=False).encode("utf-8", "backslashreplace"), "application/json")

    def _reply(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8", extra=None) -> None:
        self.send_response(status)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        if status != 204:
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if status != 204:
            self.wfile.write(body)

    def log_request(self, code="-", size="-") -> None:
        pass  # the ack path stays lean: no line per request

    def log_message(self, format: str, *args) -> None:
        # The request line holds the token: never log it, even at debug level.
        log.debug("lich-stub: " + format.replace("%s", "%r"), *("[request]" if "token=" in str(a) else a for a in args))

