"""A development lich: the server side of the mod-control contract, small but faithful,
and the one fake lich of the tests.

    lich-stub serve [--port N] [--token T]          (python -m lich_dev.cli)
    lich-stub control SESSION prompt TEXT | abort | model [NAME] | ...
    lich-stub ask SESSION QUESTION

In-process use (the demo, the tests, the benchmark)::

    from lich_dev.lich import StubLich, Refused, NotPolling

    with StubLich(hold=25.0) as lich:         # listens on 127.0.0.1, port 0
        lich.port, lich.token                   # give these to the daemon (LICH_PORT, LICH_TOKEN)
        lich.wait_polled("s1", timeout=5)       # True once the mod for s1 has polled
        lich.wait_until("s1", lambda info: info.hung_up, timeout=5)   # any PollInfo condition
        cid = lich.queue("s1", {"kind": "prompt", "text": "hi"})   # id assigned if absent
        outcome = lich.wait(cid, timeout=10)    # Outcome: state, ack, ok, error, took_s
        outcome = lich.send("s1", {"kind": "abort"}, timeout=10)   # queue + wait in one
        lich.queue_all("s1", [cmd, cmd, ...])   # queued as one: a single poll carries them
        lich.polled("s1")                       # PollInfo: polls, last poll age, parked, plugin
        lich.faults.script(Answer(status=503))  # faults a test scripts (faults.py)
        lich.record.ack_for("k1")               # every poll and ack it took (record.py)
        lich.acks_received                      # every valid ack, counted (benchmarks)
        lich.on_poll = lambda session_id: ...   # benchmark hooks, called on the connection
        lich.on_ack = lambda doc: ...           #   thread as a poll arrives / a valid ack lands
        lich.hang_up()                          # every connection closed, as an idle timeout does
        lich.kill()                             # as if lich died: every connection reset

`queue` refuses (`Refused`, lich's reason in lich's words: rules.py) what
lich refuses, and raises `NotPolling` when the session's mod has not polled
within the attach window or hung up its last poll. What it keeps:

- A poll answers at once with the queued commands, else holds up to `hold`
  seconds and answers `[]`; a command queued meanwhile wakes every poll held
  for the session, and one that finds the queue drained answers `[]` at once.
  An answer is written as lich's Go server writes it (rules.encode_answer,
  chunked past 2 KiB: handler.py). Delivery is at most once. A command queued more than `stale_after` seconds before the
  poll that would take it is dropped instead. A command whose caller's wait
  ended before a poll collected it is withdrawn: it is never delivered.
- An ack is read and decoded as lich reads it (its first 64 KiB, through Go's
  JSON decoder: rules.parse_json), checked as lich checks it (400 with the
  reason), and settles the wait on its command; one for an id nobody waits on is accepted all the same.
- Each session's plugin release (`X-Lich-Plugin`) is kept, and one outside
  the range lich supports is warned about once per session and release.

The 25-s hold and the 30-s rules read `clock`; a test that moves an injected
clock calls `clock_moved()` so held polls look at it again. Callers' waits
and a fault's delay are real time.

Threads: one accepts (`lich-stub`); each connection gets its own, which
parks here while its poll is held; `lich-stub-hangups` watches parked polls
for a client that went away (lich's "client gone"). All shared state sits
behind one condition; each command's ack has its own event, so thousands of
waiters do not wake each other. docs/dev-lich.md says where it differs from
lich on purpose.
"""
from __future__ import annotations

import collections
import hmac
import itertools
import logging
import secrets
import socket
import threading
import time
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Set

from . import control
from .faults import AckAnswer, Answer, Faults
from .handler import RESET_LINGER, Server, make_handler
from .hangups import HangupWatch
from .record import NotSeen, Record
from .releases import PluginReleases, compatible
from .rules import (
    CONTRACT_KINDS,
    HOLD_SECONDS,
    MAX_ACK_BYTES,
    STALE_SECONDS,
    NotPolling,
    Refused,
    check_command,
    validate_ack,
)
from .state import DELIVERED, DROPPED, WITHDRAWN, Mod, Outcome, PollInfo, Queued

# What callers import from here: the lich, its values, and the fault API's.
__all__ = [
    "StubLich", "Outcome", "PollInfo", "Refused", "NotPolling", "Answer", "AckAnswer", "NotSeen",
    "validate_ack", "HOLD_SECONDS", "STALE_SECONDS", "MAX_ACK_BYTES",
]

log = logging.getLogger("lich_dev.lich")


class StubLich:
    def __init__(
        self,
        token: Optional[str] = None,
        port: int = 0,
        hold: float = HOLD_SECONDS,
        stale_after: float = STALE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        newer_kinds: Optional[Mapping[str, Iterable[str]]] = None,
    ):
        """`newer_kinds` plays a lich newer than the mod: kinds beyond the
        contract's six (name -> its fields) that it queues and takes acks of."""
        self.token = token or secrets.token_hex(24)  # never a leading "-", which a command line would take for an option
        self.hold = hold
        self.stale_after = stale_after
        self.kinds = dict(CONTRACT_KINDS, **{kind: tuple(fields) for kind, fields in (newer_kinds or {}).items()})
        self._clock = clock
        self._cond = threading.Condition()
        self._mods: Dict[str, Mod] = collections.defaultdict(Mod)
        self._commands: Dict[str, Queued] = {}
        self._ids = itertools.count(1)
        self._closed = False
        self._killed = False
        self._closing = threading.Event()  # ends a fault's delay early
        self._conns: Set[socket.socket] = set()
        self.faults = Faults(self._cond)
        self.record = Record(self._cond)
        self.plugins = PluginReleases(log)
        self.acks_received = 0
        self.stray_acks = 0  # valid acks nobody waits on
        # Timestamp hooks for the benchmark; they must return at once.
        self.on_poll: Optional[Callable[[str], None]] = None
        self.on_ack: Optional[Callable[[dict], None]] = None
        self._hangups = HangupWatch()
        self._server = Server(("127.0.0.1", port), make_handler(self, control.ROUTES))
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
        self._stop(killed=False)

    def kill(self) -> None:
        """As if lich died: stop listening, and reset every open connection,
        held polls unanswered. Waiters hear "ended"."""
        self._stop(killed=True)

    def _stop(self, killed: bool) -> None:
        with self._cond:
            self._closed = True
            self._killed = self._killed or killed
            self._cond.notify_all()
            waiting = list(self._commands.values())
            conns = list(self._conns) if killed else []
        self._closing.set()
        self.faults.close()
        for entry in waiting:
            entry.settled.set()  # a waiter hears "not acked" now, not at its timeout
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
        _cut(conns, reset=True)
        self._hangups.close()

    def hang_up(self) -> None:
        """Close every open connection from lich's side, as a server's idle
        timeout does: a client that keeps connections must open a new one."""
        with self._cond:
            conns = list(self._conns)
        _cut(conns, reset=False)

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
        commands = [check_command(command, self.kinds) for command in commands]
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
                entry = self._commands[command["id"]] = Queued(command, session_id, now)
                mod.waiting.append(entry)
            mod.queued += 1
            self._cond.notify_all()
        return ids

    def wait(self, cid: str, timeout: Optional[float]) -> Outcome:
        """Wait until the command is acked or dropped, or `timeout` runs out.

        A wait that ends first ends the command's wait for good, as lich's
        does: one no poll collected yet is withdrawn and never delivered,
        and a later ack for it is taken as one nobody waits on."""
        with self._cond:
            entry = self._commands[cid]
        entry.settled.wait(timeout)
        with self._cond:
            if entry.ack is None and entry.state is None and not self._closed:
                entry.wait_ended = True
                entry.state = DELIVERED if entry.delivered else WITHDRAWN
                if not entry.delivered:
                    self._mods[entry.session_id].waiting.remove(entry)
                entry.settled.set()  # its outcome is final: another wait hears it at once
            return entry.outcome(self._closed)

    def send(self, session_id: str, command: dict, timeout: Optional[float]) -> Outcome:
        return self.wait(self.queue(session_id, command), timeout)

    def polled(self, session_id: str) -> PollInfo:
        now = self._clock()
        with self._cond:
            return self._info(session_id, self._mods.get(session_id) or Mod(), now)

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
                if predicate(self._info(session_id, self._mods.get(session_id) or Mod(), self._clock())):
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                self._cond.wait(left)

    def clock_moved(self) -> None:
        """Have held polls read the injected clock again (a test moved it)."""
        with self._cond:
            self._cond.notify_all()

    # -- the contract's side (connection threads) ---------------------------

    def _poll(self, session_id: str, plugin: Optional[str], conn: socket.socket) -> Optional[Answer]:
        """This poll's answer, held until there is one; None if the client left or lich was killed."""
        if self.on_poll is not None:
            self.on_poll(session_id)
        self.plugins.note(session_id, plugin)
        gone = threading.Event()
        with self._cond:
            mod = self._mods[session_id]
            mod.polls += 1
            mod.last_poll = self._clock()
            deadline = mod.last_poll + self.hold
            mod.hung_up = False
            self._cond.notify_all()
        self._hangups.watch(conn, lambda: self._hung_up(gone))
        parked_at = None  # mod.queued when this poll found nothing and parked
        try:
            with self._cond:
                while True:
                    if gone.is_set():
                        mod.hung_up = True  # it took nothing with it
                        return None
                    if self._killed:
                        return None
                    scripted = self.faults.take_answer(session_id)
                    if scripted is not None:
                        return scripted
                    batch = self._drain(mod)
                    left = deadline - self._clock()
                    woken = parked_at is not None and mod.queued != parked_at
                    if batch or woken or self._closed or left <= 0:
                        return Answer(body=batch)
                    if parked_at is None:  # counted as held only now, as lich parks it only now
                        parked_at = mod.queued
                        mod.parked += 1
                        self._cond.notify_all()
                    self._cond.wait(left)
        finally:
            self._hangups.forget(conn)
            with self._cond:
                if parked_at is not None:
                    mod.parked -= 1
                self._cond.notify_all()

    def _drain(self, mod: Mod) -> List[dict]:
        """Take the session's queue: every command but those that outlived the
        attach window, which a mod polling now would apply to an unrelated turn."""
        batch: List[dict] = []
        now = self._clock()
        while mod.waiting:
            entry = mod.waiting.popleft()
            if now - entry.queued_at > self.stale_after:
                entry.state, entry.dropped = DROPPED, f"no poll took it within {self.stale_after:g} s"
                entry.settled.set()
                log.warning("dropped %s (%s): queued for session %s, no poll collected it", entry.command["id"], entry.command["kind"], entry.session_id)
                continue
            entry.delivered = True
            batch.append(entry.command)
        return batch

    def _hung_up(self, gone: threading.Event) -> None:
        with self._cond:
            gone.set()
            self._cond.notify_all()

    def _ack(self, doc: dict, plugin: Optional[str]) -> None:
        """Take a valid ack: it settles the wait on its command, if anyone waits."""
        self.plugins.note(doc["session_id"], plugin)
        now = self._clock()
        with self._cond:
            self.acks_received += 1
            entry = self._commands.get(doc["id"])
            if entry is None or entry.session_id != doc["session_id"] or not entry.delivered or entry.wait_ended or entry.ack is not None:
                self.stray_acks += 1  # lich leaves an ack nobody waits on alone, and answers 204
                return
            entry.ack, entry.acked_at = doc, now
        if self.on_ack is not None:
            self.on_ack(doc)
        entry.settled.set()

    def _pause(self, seconds: float) -> None:
        """A fault's delay: real time, cut short by close."""
        self._closing.wait(seconds)

    def _track(self, conn: socket.socket) -> None:
        with self._cond:
            self._conns.add(conn)

    def _untrack(self, conn: socket.socket) -> None:
        with self._cond:
            self._conns.discard(conn)

    def _not_polling(self, session_id: str, mod: Mod, now: float) -> Optional[str]:
        """Why nobody would collect a command for the session, with what to fix; None if a mod polls."""
        if mod.last_poll is None:
            why = "no mod has ever polled for it"
        elif mod.hung_up and not mod.parked:
            why = "its mod hung up its last poll and has not polled since"
        elif now - mod.last_poll > self.stale_after and not mod.parked:
            why = (
                f"its mod has not polled for {now - mod.last_poll:.0f} s "
                f"(lich counts a mod as polling for {self.stale_after:g} s after its last poll)"
            )
        else:
            return None
        return (
            f"session {session_id} cannot take commands: {why}. Check that lich-mod-daemon runs for it with "
            f"LICH_PORT={self.port}, LICH_SESSION_ID={session_id} and this stub's token; inside Claude Code, "
            f"that needs 2.1.280 or later with mods on (docs/install.md, \"Which Claude Code\") and the "
            f"session's folder trusted"
        )

    def _info(self, session_id: str, mod: Mod, now: float) -> PollInfo:
        age = None if mod.last_poll is None else round(now - mod.last_poll, 3)
        plugin = self.plugins.of(session_id) or None
        return PollInfo(session_id, mod.polls, age, mod.parked, mod.hung_up, plugin, compatible(plugin))

    def _check(self, token: Optional[str]) -> bool:
        return token is not None and hmac.compare_digest(token.encode(), self.token.encode())


def _cut(conns: Iterable[socket.socket], reset: bool) -> None:
    """End connections another thread serves: with a FIN, or a TCP reset."""
    for conn in conns:
        try:
            if reset:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, RESET_LINGER)
            conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # its own thread closed it first
