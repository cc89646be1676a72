"""The benchmark (issue 6): the daemon against the development lich and a relay stand-in.

    python -m lich_control.bench [--runs N] [--smoke] [--json FILE] [sizes...]

Everything but the daemon runs in this process: the development lich
(`StubLich`, on loopback) and a relay stand-in that reads the daemon's stdout
and answers every call at once over the daemon's Unix socket (forks after
`--fork-delay` seconds). Both take their timestamps from one clock
(`time.perf_counter`), so an enqueue and the moment its call line or its ack
arrives are read side by side. It prints a table, then one JSON document.

Scenarios, each on a fresh daemon per run:
  startup   process start -> first poll at lich (several spawns a run);
  dispatch  prompts queued one at a time: enqueue -> the prompt.submit line;
  ack       model commands one at a time: enqueue -> the ack at lich;
  burst     model commands queued at once (one poll carries them): time to
            the last ack, rate, order, and when the next poll went out;
  ceiling   a null client (its own process) posting acks back to back on one
            keep-alive connection: what lich on this machine can take;
  asks      asks queued at once, each fork answering after the delay;
then once: idle (a parked poll, CPU, RSS, threads, wake-ups over a window)
and scale (many daemons against one lich, a prompt and an ask each).

It asserts nothing about time: `make test` runs `--smoke` to prove it works.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import queue
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Optional

import attrs

from ..dev.lich import StubLich

CLOCK = time.perf_counter
# The folder that holds the lich_control package.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WAIT = 60.0  # the longest any one step may take before the run is called broken


@attrs.frozen
class Sizes:
    runs: int = 3
    startups: int = 5  # spawns per run for the startup figure
    dispatch: int = 300
    ack: int = 300
    burst: int = 2000
    ceiling: int = 2000
    asks: int = 20
    fork_delay: float = 1.0
    idle_seconds: float = 30.0
    scale: int = 100


SMOKE = Sizes(runs=1, startups=1, dispatch=5, ack=5, burst=40, ceiling=40, asks=3, fork_delay=0.05, idle_seconds=0.3, scale=2)


class BenchError(Exception):
    """A scenario did not complete: the daemon missed a command or an ack."""


# -- the relay stand-in -------------------------------------------------------


class UnixConnection:
    """POST /v1/result over the daemon's Unix socket, kept alive between requests.

    The relay's half of every command's chain, so it is lean: each request is
    one write, and only the status line and Content-Length of the answer are
    read. (http.client here cost ~110 us of this process's CPU per result
    -- two writes and the email package's header parser -- on the same
    critical path as the daemon's own work.) Any answer that is not a plain
    HTTP/1.1 one with a length raises `http.client.HTTPException`.
    """

    def __init__(self, path: str, timeout: float = 10.0):
        self._path, self._timeout = path, timeout
        self.sock: Optional[socket.socket] = None

    def post(self, path: str, body: bytes) -> int:
        if self.sock is None:  # at the first result, as http.client did: an idle relay holds no connection
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(self._timeout)
            self.sock.connect(self._path)
            self._rfile = self.sock.makefile("rb")
        head = f"POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        self.sock.sendall(head.encode("latin-1") + body)
        status = self._rfile.readline(65537).split(None, 2)
        if len(status) < 2 or not status[0].startswith(b"HTTP/1.") or not status[1].isdigit():
            raise http.client.BadStatusLine(repr(status))
        length = 0
        while True:
            line = self._rfile.readline(65537)
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length and len(self._rfile.read(length)) < length:
            raise http.client.IncompleteRead(b"")
        return int(status[1])

    def close(self) -> None:
        if self.sock is not None:
            self._rfile.close()
            self.sock.close()


def post_result(conn: UnixConnection, doc: dict) -> int:
    return conn.post("/v1/result", json.dumps(doc).encode())


class Relay:
    """One daemon, started as the relay starts it, and the relay's half of the bridge.

    A reader thread timestamps each stdout line, shows it to `on_call`, and
    answers it at once on one keep-alive connection; forks are answered by a
    second thread (its own connection) `fork_delay` seconds after they arrived.
    """

    def __init__(self, lich: StubLich, session_id: str, run_dir: str, fork_delay: float):
        self.session_id = session_id
        self.fork_delay = fork_delay
        self.on_call: Optional[Callable[[float, dict], None]] = None
        self.errors: List[str] = []
        self._hello = threading.Event()
        self._socket: Optional[str] = None
        self._forks: "queue.SimpleQueue" = queue.SimpleQueue()
        env = {k: v for k, v in os.environ.items() if not k.startswith("LICH_")}
        env.update(
            LICH_PORT=str(lich.port),
            LICH_TOKEN=lich.token,
            LICH_SESSION_ID=session_id,
            LICH_CONTROL_RUN_DIR=run_dir,
            PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""),
        )
        self._stderr = open(os.path.join(run_dir, f"{session_id}.stderr"), "wb")
        self.started_at = CLOCK()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lich_control.daemon"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self._reader = threading.Thread(target=self._read, name=f"relay-{session_id}", daemon=True)
        self._forker = threading.Thread(target=self._answer_forks, name=f"relay-forks-{session_id}", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_hello(self, timeout: float = WAIT) -> None:
        if not self._hello.wait(timeout):
            raise BenchError(f"daemon {self.session_id} said no hello within {timeout:g} s")

    def _read(self) -> None:
        conn: Optional[UnixConnection] = None
        try:
            for raw in self.proc.stdout:
                now = CLOCK()
                doc = json.loads(raw)
                if doc.get("op") == "hello":
                    self._socket = doc["socket"]
                    conn = UnixConnection(self._socket)
                    self._forker.start()
                    self._hello.set()
                    continue
                hook = self.on_call
                if hook is not None:
                    hook(now, doc)
                if doc["method"] == "model.fork":
                    self._forks.put((now + self.fork_delay, doc["id"]))
                    continue
                value = {"text": doc["args"]["text"]} if doc["method"] == "prompt.submit" else None
                self._answer(conn, doc["id"], value)
        except (OSError, http.client.HTTPException) as exc:
            if self.proc.poll() is None:
                self.errors.append(f"the relay stand-in lost the daemon: {exc!r}")
        finally:
            if conn is not None:
                conn.close()
            self._forks.put(None)

    def _answer(self, conn: "UnixConnection", call_id: str, value) -> None:
        status = post_result(conn, {"id": call_id, "ok": True, "value": value})
        if status != 204:
            self.errors.append(f"{call_id}: /v1/result answered {status}")

    def _answer_forks(self) -> None:
        conn = UnixConnection(self._socket)
        try:
            while True:
                item = self._forks.get()
                if item is None:
                    return
                due, call_id = item
                left = due - CLOCK()
                if left > 0:
                    time.sleep(left)  # the scenario is about time: a fork takes this long
                self._answer(conn, call_id, {"isAnswered": True, "text": f"answer to {call_id}"})
        except (OSError, http.client.HTTPException) as exc:
            if self.proc.poll() is None:
                self.errors.append(f"the fork answerer lost the daemon: {exc!r}")
        finally:
            conn.close()

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()

    def stop(self, timeout: float = 10.0) -> None:
        self.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        self._stderr.close()

    def stderr_text(self) -> str:
        self._stderr.flush()
        with open(self._stderr.name, "rb") as f:
            return f.read().decode("utf-8", "replace")


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
    lines: "queue.SimpleQueue" = queue.SimpleQueue()
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


MODELS = ("claude-opus-4-1", "claude-sonnet-4-5")


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


def run_ceiling(lich: StubLich, n: int) -> dict:
    """A null client in its own process: n acks back to back on one connection."""
    env = dict(os.environ, LICH_TOKEN=lich.token, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run(
        [sys.executable, "-m", "lich_control.bench", "--null-client", str(lich.port), str(n)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        timeout=WAIT + n / 100,
    )
    if done.returncode != 0:
        raise BenchError(f"the null client failed: {done.stderr.decode(errors='replace')[-500:]}")
    elapsed = json.loads(done.stdout)["elapsed_s"]
    return {"elapsed_s": elapsed, "per_s": n / elapsed, "per_ack_ms": elapsed / n * 1000}


def null_client(port: int, n: int) -> int:
    """Posts n valid acks back to back on one keep-alive connection; prints the time."""
    from urllib.parse import quote

    url = f"/mod/acks?token={quote(os.environ['LICH_TOKEN'], safe='')}"
    headers = {"Content-Type": "application/json", "X-Lich-Plugin": "bench"}
    bodies = [json.dumps({"session_id": "ceiling", "id": f"n{i}", "kind": "model", "ok": True}).encode() for i in range(n)]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.connect()
    conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    start = CLOCK()
    for body in bodies:
        conn.request("POST", url, body, headers)
        resp = conn.getresponse()
        resp.read()
        if resp.status != 204:
            print(f"lich answered {resp.status}", file=sys.stderr)
            return 1
    elapsed = CLOCK() - start
    conn.close()
    print(json.dumps({"elapsed_s": elapsed, "n": n}))
    return 0


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


# -- the process as /proc shows it -------------------------------------------------


CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def proc_cpu_ns(pid: int) -> Optional[int]:
    """CPU time of every thread in nanoseconds (schedstat), finer than stat's ticks."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return total


def proc_status(pid: int) -> dict:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            out[name] = value.strip()
    return out


def rss_mb(pid: int) -> float:
    return int(proc_status(pid)["VmRSS"].split()[0]) / 1024


def pss_mb(pid: int) -> Optional[float]:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def thread_switches(pid: int) -> Dict[int, int]:
    """Voluntary context switches per thread: a thread that wakes adds to its count."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        out[int(tid)] = int(line.split()[1])
        except OSError:
            pass
    return out


def run_idle(lich: StubLich, marks: Marks, relay: Relay, seconds: float) -> dict:
    """A daemon with nothing to do: its poll parked, what it costs over `seconds`."""
    sid, pid = relay.session_id, relay.pid
    # Measure from a fresh parked poll, so the window holds at most the polls
    # the protocol makes (lich answers [] after its hold and the poll goes out again).
    time.sleep(min(2.0, seconds))  # let startup finish (threads, imports still under way)
    wait_parked(lich, sid)
    polls_before = len(marks.polls.get(sid, []))
    cpu0, ns0, sw0, t0 = proc_cpu_s(pid), proc_cpu_ns(pid), thread_switches(pid), CLOCK()
    time.sleep(seconds)  # the scenario is about time: an idle window
    cpu1, ns1, sw1, t1 = proc_cpu_s(pid), proc_cpu_ns(pid), thread_switches(pid), CLOCK()
    status = proc_status(pid)
    woke = {tid: sw1.get(tid, 0) - sw0.get(tid, 0) for tid in sw1}
    return {
        "window_s": t1 - t0,
        # schedstat where the kernel has it (a thread that exited in the
        # window would be missed; none does), else stat's 10-ms ticks.
        "cpu_s": (ns1 - ns0) / 1e9 if ns0 is not None and ns1 is not None else cpu1 - cpu0,
        "cpu_ticks_s": cpu1 - cpu0,
        "rss_mb": int(status["VmRSS"].split()[0]) / 1024,
        "threads": int(status["Threads"]),
        "threads_woken": sum(1 for n in woke.values() if n > 0),
        "wakeups": sum(woke.values()),
        "polls_in_window": len(marks.polls.get(sid, [])) - polls_before,
        "hold_s": lich.hold,
    }


def run_scale(lich: StubLich, marks: Marks, n: int, run_dir: str, fork_delay: float) -> dict:
    """n daemons against one lich, started together; each gets a prompt and an ask."""
    relays: List[Relay] = []
    try:
        start = CLOCK()
        for i in range(n):
            relays.append(Relay(lich, f"x{i}", run_dir, fork_delay))
        for relay in relays:
            if not lich.wait_polled(relay.session_id, WAIT * 2, parked=True):
                raise BenchError(f"scale: daemon {relay.session_id} did not poll: {relay.stderr_text()[-300:]}")
            relay.wait_hello()
        all_polling = CLOCK() - start
        ids = []
        for i, relay in enumerate(relays):
            ids += [f"x{i}p", f"x{i}q"]
        acked = marks.expect(ids)
        start = CLOCK()
        for i, relay in enumerate(relays):
            lich.queue_all(relay.session_id, [
                {"id": f"x{i}p", "kind": "prompt", "text": f"prompt for x{i}"},
                {"id": f"x{i}q", "kind": "ask", "question": f"question for x{i}"},
            ])
        try:
            wait_acked(acked, "scale", timeout=WAIT * 2, marks=marks)
        except BenchError as exc:
            errors = [e for r in relays for e in r.errors][:5]
            raise BenchError(f"{exc}; relay errors: {errors}") from None
        wall = max(marks.acks[cid][0] for cid in ids) - start
        bad = [cid for cid in ids if marks.acks[cid][1].get("ok") is not True or marks.acks[cid][1]["session_id"] != cid[:-1]]
        rss = [rss_mb(r.pid) for r in relays]
        pss = [pss_mb(r.pid) for r in relays]
        threads = [int(proc_status(r.pid)["Threads"]) for r in relays]
        errors = [e for r in relays for e in r.errors]
        return {
            "daemons": n,
            "all_polling_s": all_polling,
            "acked": len(ids) - len(bad),
            "expected": len(ids),
            "all_acked_ok": not bad and not errors,
            "wall_s": wall,
            "total_rss_mb": sum(rss),
            "rss_per_daemon_mb": statistics.median(rss),
            "rss_max_mb": max(rss),
            "total_pss_mb": sum(p for p in pss if p is not None) if all(p is not None for p in pss) else None,
            "threads_per_daemon": statistics.median(threads),
        }
    finally:
        for relay in relays:
            relay.terminate()
        for relay in relays:
            relay.stop()


# -- a run, the figures, the table -----------------------------------------------


def percentile(values: List[float], p: float) -> float:
    """Nearest rank: the smallest value with at least p % of the values at or below it."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


def one_run(sizes: Sizes, index: int, run_dir: str, log: Callable[[str], None]) -> dict:
    with StubLich() as lich:
        marks = Marks(lich)
        startups = []
        relay = None
        try:
            for k in range(sizes.startups):
                relay, ms = start_daemon(lich, marks, f"r{index}s{k}", run_dir, sizes.fork_delay)
                startups.append(ms)
                if k < sizes.startups - 1:
                    relay.stop()
            log(f"run {index}: startup {statistics.median(startups):.0f} ms; dispatch")
            dispatch = run_dispatch(lich, marks, relay, sizes.dispatch, f"r{index}")
            log(f"run {index}: ack")
            acks = run_acks(lich, marks, relay, sizes.ack, f"r{index}")
            log(f"run {index}: burst")
            burst = run_burst(lich, marks, relay, sizes.burst, f"r{index}")
            log(f"run {index}: ceiling")
            ceiling = run_ceiling(lich, sizes.ceiling)
            log(f"run {index}: asks")
            asks = run_asks(lich, marks, relay, sizes.asks, f"r{index}")
            if relay.errors:
                raise BenchError("; ".join(relay.errors[:3]))
        finally:
            if relay is not None:
                relay.stop()
    burst["share_of_ceiling"] = burst["per_s"] / ceiling["per_s"]
    return {
        "startup_ms": startups,
        "dispatch_ms": {"p50": percentile(dispatch, 50), "p90": percentile(dispatch, 90), "p99": percentile(dispatch, 99), "max": max(dispatch)},
        "ack_ms": {"p50": percentile(acks, 50), "p99": percentile(acks, 99), "max": max(acks)},
        "burst": burst,
        "ceiling": ceiling,
        "asks": asks,
    }


@attrs.frozen
class Figure:
    key: str  # a path into a run's document, or the idle/scale one
    label: str
    fmt: str
    target: Optional[float] = None
    at_most: bool = True  # the target is a ceiling (else a floor)
    reference: Optional[str] = None  # key of a same-run figure to divide by


RUN_FIGURES = [
    Figure("dispatch_ms.p50", "dispatch p50 (ms)", "{:.3f}", 0.5),
    Figure("dispatch_ms.p90", "dispatch p90 (ms)", "{:.3f}"),
    Figure("dispatch_ms.p99", "dispatch p99 (ms)", "{:.3f}", 5.0),
    Figure("dispatch_ms.max", "dispatch max (ms)", "{:.3f}"),
    Figure("ack_ms.p50", "ack p50 (ms)", "{:.3f}", 1.0, reference="ceiling.per_ack_ms"),
    Figure("ack_ms.p99", "ack p99 (ms)", "{:.3f}", reference="ceiling.per_ack_ms"),
    Figure("burst.last_ack_s", "burst: last ack (s)", "{:.3f}"),
    Figure("burst.per_s", "burst: commands/s", "{:.0f}", 1300, at_most=False, reference="ceiling.per_s"),
    Figure("burst.share_of_ceiling", "burst: share of ceiling", "{:.2f}", 0.40, at_most=False),
    Figure("burst.next_poll_ms", "burst: next poll out (ms)", "{:.1f}"),
    Figure("ceiling.per_s", "ceiling: null client acks/s", "{:.0f}"),
    Figure("asks.wall_s", "asks: last ack (s)", "{:.3f}", 1.1),
]
ONCE_FIGURES = [
    Figure("idle.cpu_s", "idle: CPU s over window", "{:.3f}", 0.02),
    Figure("idle.rss_mb", "idle: RSS (MB)", "{:.1f}", 30.0),
    Figure("idle.threads", "idle: threads", "{:.0f}"),
    Figure("idle.threads_woken", "idle: threads woken", "{:.0f}"),
    Figure("idle.wakeups", "idle: wake-ups (ctxt sw.)", "{:.0f}"),
    Figure("idle.polls_in_window", "idle: polls in window", "{:.0f}"),
    Figure("scale.all_polling_s", "scale: all polling (s)", "{:.2f}"),
    Figure("scale.wall_s", "scale: last ack (s)", "{:.3f}"),
    Figure("scale.total_rss_mb", "scale: total RSS (MB)", "{:.0f}"),
    Figure("scale.total_pss_mb", "scale: total PSS (MB)", "{:.0f}"),
    Figure("scale.rss_per_daemon_mb", "scale: RSS/daemon (MB)", "{:.1f}", 30.0),
    Figure("scale.rss_max_mb", "scale: RSS max (MB)", "{:.1f}", 30.0),
]


def dig(doc: dict, key: str):
    for part in key.split("."):
        doc = doc[part]
    return doc


def spread(values: List[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(runs: List[dict], once: dict) -> Dict[str, dict]:
    out: Dict[str, dict] = {}
    startups = [ms for run in runs for ms in run["startup_ms"]]
    out["startup.first_poll_ms"] = dict(spread(startups), label="startup: first poll (ms)", fmt="{:.1f}", target=150.0, at_most=True)
    for fig in RUN_FIGURES:
        entry = spread([dig(run, fig.key) for run in runs])
        if fig.reference is not None:
            ratios = [dig(run, fig.key) / dig(run, fig.reference) for run in runs if dig(run, fig.key) is not None]
            entry["ratio"] = statistics.median(ratios) if ratios else None
            entry["ratio_to"] = fig.reference
        out[fig.key] = dict(entry, label=fig.label, fmt=fig.fmt, target=fig.target, at_most=fig.at_most)
    for fig in ONCE_FIGURES:
        group, key = fig.key.split(".", 1)
        values = [dig(doc, key) for doc in once[group]]
        out[fig.key] = dict(spread(values), label=fig.label, fmt=fig.fmt, target=fig.target, at_most=fig.at_most)
    for entry in out.values():
        target, value = entry["target"], entry["median"]
        entry["met"] = None if target is None or value is None else (value <= target if entry["at_most"] else value >= target)
    return out


def flags(runs: List[dict], once: dict) -> Dict[str, Optional[bool]]:
    return {
        "burst_acks_in_order": all(run["burst"]["in_order"] for run in runs),
        "burst_next_poll_before_last_ack": all(
            run["burst"]["next_poll_ms"] is not None and run["burst"]["next_poll_ms"] < run["burst"]["last_ack_s"] * 1000 for run in runs
        ),
        "scale_all_acked_ok": all(doc["all_acked_ok"] for doc in once["scale"]) if once["scale"] else None,
    }


def table(summary: Dict[str, dict], checks: Dict[str, bool], sizes: Sizes) -> str:
    lines = [
        f"lich-control benchmark: {sizes.runs} run(s); medians [min - max]",
        f"{'figure':<30} {'median':>10} {'[min - max]':>24} {'target':>10} {'ratio':>8}  verdict",
        "-" * 95,
    ]
    for entry in summary.values():
        fmt = entry["fmt"]
        show = (lambda v: "-" if v is None else fmt.format(v))
        rng = f"[{show(entry['min'])} - {show(entry['max'])}]"
        target = "" if entry["target"] is None else ("<= " if entry["at_most"] else ">= ") + fmt.format(entry["target"])
        ratio = "" if entry.get("ratio") is None else f"{entry['ratio']:.2f}x"
        verdict = {True: "met", False: "MISSED", None: ""}[entry["met"]]
        lines.append(f"{entry['label']:<30} {show(entry['median']):>10} {rng:>24} {target:>10} {ratio:>8}  {verdict}")
    lines.append("-" * 95)
    for name, ok in checks.items():
        lines.append(f"{name.replace('_', ' '):<62} {'not run' if ok is None else 'yes' if ok else 'NO'}")
    lines.append(
        "ratios: ack latency in units of one null-client ack; burst rate as a share of the null client's rate "
        "(the stub's ceiling, measured in the same run)"
    )
    return "\n".join(lines)


def machine() -> dict:
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu": model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lich_control.bench", description="Measure the daemon (issue 6).")
    defaults = Sizes()
    parser.add_argument("--smoke", action="store_true", help="a tiny configuration that only proves the benchmark works")
    parser.add_argument("--runs", type=int, help=f"runs of the per-run scenarios (default {defaults.runs})")
    parser.add_argument("--startups", type=int, help=f"daemon spawns a run for the startup figure (default {defaults.startups})")
    parser.add_argument("--dispatch", type=int, help=f"prompts one at a time (default {defaults.dispatch})")
    parser.add_argument("--ack", type=int, help=f"model commands one at a time (default {defaults.ack})")
    parser.add_argument("--burst", type=int, help=f"model commands queued at once (default {defaults.burst})")
    parser.add_argument("--ceiling", type=int, help=f"acks the null client posts (default {defaults.ceiling})")
    parser.add_argument("--asks", type=int, help=f"asks queued at once (default {defaults.asks})")
    parser.add_argument("--fork-delay", type=float, help=f"seconds each fork takes to answer (default {defaults.fork_delay:g})")
    parser.add_argument("--idle-seconds", type=float, help=f"the idle window (default {defaults.idle_seconds:g})")
    parser.add_argument("--scale", type=int, help=f"daemons in the scale scenario (default {defaults.scale}; 0 skips it)")
    parser.add_argument("--json", metavar="FILE", help="also write the JSON document to FILE")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    parser.add_argument("--null-client", nargs=2, type=int, metavar=("PORT", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.null_client:
        return null_client(*args.null_client)
    sizes = SMOKE if args.smoke else defaults
    changes = {name: getattr(args, name) for name in attrs.fields_dict(Sizes) if getattr(args, name, None) is not None}
    sizes = attrs.evolve(sizes, **changes)

    def log(text: str) -> None:
        if not args.quiet:
            print(f"bench: {text}", file=sys.stderr, flush=True)

    run_dir = tempfile.mkdtemp(prefix="lcb-", dir="/tmp" if os.path.isdir("/tmp") else None)
    try:
        runs = [one_run(sizes, i + 1, run_dir, log) for i in range(sizes.runs)]
        once: Dict[str, List[dict]] = {"idle": [], "scale": []}
        log(f"idle: {sizes.idle_seconds:g} s with the poll parked")
        with StubLich() as lich:
            marks = Marks(lich)
            relay, _ = start_daemon(lich, marks, "idle", run_dir, sizes.fork_delay)
            try:
                once["idle"].append(run_idle(lich, marks, relay, sizes.idle_seconds))
            finally:
                relay.stop()
        if sizes.scale > 0:
            log(f"scale: {sizes.scale} daemons")
            with StubLich() as lich:
                marks = Marks(lich)
                once["scale"].append(run_scale(lich, marks, sizes.scale, run_dir, sizes.fork_delay))
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    summary = summarize(runs, once)
    checks = flags(runs, once)
    doc = {
        "machine": machine(),
        "sizes": attrs.asdict(sizes),
        "summary": {key: {k: v for k, v in entry.items() if k != "fmt"} for key, entry in summary.items()},
        "checks": checks,
        "runs": runs,
        "idle": once["idle"],
        "scale": once["scale"],
    }
    print(table(summary, checks, sizes))
    print()
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
