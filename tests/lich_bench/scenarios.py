"""The scenarios of one run, each on a daemon whose poll is parked at the
development lich, and the floors of the stack they are measured against."""
from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from typing import Dict, List, Optional

from lich_dev.lich import StubLich
from lich_dev.procs import ROOT, daemon_env
from lich_control.bridge_server import DaemonConnection
from .common import CLOCK, WAIT, BenchError, floor_figures
from .relay import JSON, Relay

MODELS = ("claude-opus-4-1", "claude-sonnet-4-5")


# -- lich's side: timestamps of polls and acks ---------------------------------


class Marks:
    """What lich saw, with the time it saw it; the stub's hooks feed it."""

    def __init__(self, lich: StubLich):
        self._lock = threading.Lock()
        self.polls: Dict[str, List[float]] = {}
        self.acks: Dict[str, tuple] = {}  # id -> (time, body)
        self.order: List[str] = []
        self._waiting: Optional[set] = None
        self._done = threading.Event()
        lich.on_poll = self._poll
        lich.on_ack = self._ack

    def _poll(self, session_id: str) -> None:
        now = CLOCK()
        with self._lock:
            self.polls.setdefault(session_id, []).append(now)

    def _ack(self, doc: dict) -> None:
        now = CLOCK()
        with self._lock:
            self.acks[doc["id"]] = (now, doc)
            self.order.append(doc["id"])
            if self._waiting is not None:
                self._waiting.discard(doc["id"])
                if not self._waiting:
                    self._waiting = None
                    self._done.set()

    def expect(self, ids: List[str]) -> threading.Event:
        """An event set once every id in `ids` is acked. One expectation at a time."""
        with self._lock:
            self._done = threading.Event()
            left = {cid for cid in ids if cid not in self.acks}
            if left:
                self._waiting = left
            else:
                self._done.set()
            return self._done

    def missing(self) -> set:
        with self._lock:
            return set(self._waiting or ())

    def polls_after(self, session_id: str, moment: float) -> List[float]:
        with self._lock:
            return [t for t in self.polls.get(session_id, []) if t > moment]


def wait_acked(event: threading.Event, what: str, timeout: float = WAIT, marks: Optional["Marks"] = None) -> None:
    if not event.wait(timeout):
        missing = sorted(marks.missing()) if marks is not None else []
        raise BenchError(f"{what}: not every ack arrived within {timeout:g} s; {len(missing)} missing, e.g. {missing[:5]}")


def check_ok(marks: Marks, ids: List[str], what: str) -> None:
    bad = [cid for cid in ids if marks.acks[cid][1].get("ok") is not True]
    if bad:
        raise BenchError(f"{what}: {len(bad)} acks not ok, e.g. {marks.acks[bad[0]][1]}")


# -- the scenarios ---------------------------------------------------------------


def start_daemon(lich: StubLich, marks: Marks, session_id: str, run_dir: str, fork_delay: float) -> tuple:
    """A daemon polling with its poll parked; (relay, ms from process start to first poll)."""
    relay = Relay(lich, session_id, run_dir, fork_delay)
    if not lich.wait_polled(session_id, WAIT, parked=True):
        relay.stop()
        raise BenchError(f"daemon {session_id} did not poll within {WAIT:g} s: {relay.stderr_text()[-500:]}")
    relay.wait_hello()
    return relay, (marks.polls[session_id][0] - relay.started_at) * 1000


def wait_parked(lich: StubLich, session_id: str) -> None:
    if not lich.wait_until(session_id, lambda info: info.parked > 0, WAIT):
        raise BenchError(f"daemon {session_id} did not poll again")


def run_dispatch(lich: StubLich, marks: Marks, relay: Relay, n: int, tag: str) -> List[float]:
    """Prompts one at a time, each from a parked poll: enqueue -> its call line."""
    lines: "queue.Queue" = queue.Queue()
    relay.on_call = lambda now, doc: lines.put((now, doc)) if doc["method"] == "prompt.submit" else None
    sid, out = relay.session_id, []
    try:
        for i in range(n):
            cid = f"{tag}d{i}"
            acked = marks.expect([cid])
            start = CLOCK()
            lich.queue(sid, {"id": cid, "kind": "prompt", "text": cid})
            try:
                seen, doc = lines.get(timeout=WAIT)
            except queue.Empty:
                raise BenchError(f"dispatch: no prompt.submit for {cid}") from None
            if doc["args"]["text"] != cid:
                raise BenchError(f"dispatch: expected the call for {cid}, got {doc}")
            out.append((seen - start) * 1000)
            wait_acked(acked, f"dispatch {cid}")
            wait_parked(lich, sid)
        check_ok(marks, [f"{tag}d{i}" for i in range(n)], "dispatch")
    finally:
        relay.on_call = None
    return out


def run_acks(lich: StubLich, marks: Marks, relay: Relay, n: int, tag: str) -> List[float]:
    """Model commands one at a time, each from a parked poll: enqueue -> ack at lich."""
    sid, out = relay.session_id, []
    for i in range(n):
        cid = f"{tag}a{i}"
        acked = marks.expect([cid])
        start = CLOCK()
        lich.queue(sid, {"id": cid, "kind": "model", "model": MODELS[i % 2]})
        wait_acked(acked, f"ack {cid}")
        out.append((marks.acks[cid][0] - start) * 1000)
        wait_parked(lich, sid)
    check_ok(marks, [f"{tag}a{i}" for i in range(n)], "ack")
    return out

def run_burst(lich: StubLich, marks: Marks, relay: Relay, n: int, tag: str) -> dict:
    sid = relay.session_id
    ids = [f"{tag}b{i}" for i in range(n)]
    commands = [{"id": cid, "kind": "model", "model": MODELS[i % 2]} for i, cid in enumerate(ids)]
    acked = marks.expect(ids)
    start = CLOCK()
    lich.queue_all(sid, commands)
    wait_acked(acked, "burst", timeout=WAIT + n / 100)
    check_ok(marks, ids, "burst")
    last = max(marks.acks[cid][0] for cid in ids)
    wanted = set(ids)
    with marks._lock:
        seen = [cid for cid in marks.order if cid in wanted]
    polls = marks.polls_after(sid, start)
    took = last - start
    wait_parked(lich, sid)
    return {
        "last_ack_s": took,
        "per_s": n / took,
        "in_order": seen == ids,
        "next_poll_ms": (polls[0] - start) * 1000 if polls else None,
    }


def run_asks(lich: StubLich, marks: Marks, relay: Relay, n: int, tag: str) -> dict:
    sid = relay.session_id
    ids = [f"{tag}q{i}" for i in range(n)]
    acked = marks.expect(ids)
    start = CLOCK()
    lich.queue_all(sid, [{"id": cid, "kind": "ask", "question": f"question {cid}"} for cid in ids])
    wait_acked(acked, "asks", timeout=WAIT + relay.fork_delay)
    check_ok(marks, ids, "asks")
    if any(not marks.acks[cid][1].get("answer", "").startswith("answer to ") for cid in ids):
        raise BenchError("asks: an ack without the fork's answer")
    return {"wall_s": max(marks.acks[cid][0] for cid in ids) - start}




# -- the floors: the chosen stack with nothing of ours in it ---------------------------


def run_requests_floor(lich: StubLich, n: int) -> dict:
    """The lich side's floor: a bare requests.Session in its own process
    posting the same ack to the same lich n times back to back."""
    done = subprocess.run(
        [sys.executable, "-m", "lich_bench.floor", str(lich.port), str(n)],
        cwd=ROOT,
        env=daemon_env(LICH_TOKEN=lich.token),
        capture_output=True,
        timeout=WAIT + n / 50,
    )
    if done.returncode != 0:
        raise BenchError(f"the requests floor failed: {done.stderr.decode(errors='replace')[-500:]}")
    return json.loads(done.stdout)


def run_socket_floor(relay: Relay, n: int) -> dict:
    """The socket's floor: n bare round trips on the daemon's socket from
    the relay stand-in's process, on one kept-alive connection. Each posts a
    turn.complete for no turn, which the daemon takes and ignores."""
    body = json.dumps({"event": "turn.complete", "turnId": "floor"}).encode()
    conn = DaemonConnection(relay.socket)
    took: List[float] = []
    try:
        for _ in range(n + 1):  # the first opens the connection and is not counted
            start = CLOCK()
            status, _ = conn.exchange("POST", "/v1/event", body, JSON)
            took.append((CLOCK() - start) * 1000)
            if status != 204:
                raise BenchError(f"the socket floor: /v1/event answered {status}")
    finally:
        conn.close()
    return floor_figures(took[1:])
