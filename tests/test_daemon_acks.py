"""The daemon's promise at its exit, as one property: every command lich
handed out gets exactly one ack, or the daemon's log names the thread whose
overrun of the stop's grace cut it; no ack goes to a command lich did not
hand out. (It is daemon.py's shutdown that keeps it, with the poller, the
worker and the asks it stops: so this file is the daemon's, beside
test_daemon.py, which tests each way out once.)

Each schedule, drawn from its seed, runs the real daemon as a subprocess,
over the real bridge (this test plays the relay, answering its calls as a
session would: at once, refused, slow, never, or with a result the daemon
refuses), against the development lich on loopback HTTP. It mixes polls of
1 to 2,000 commands of every kind, asks, malformed commands that still have
ids, a lich that goes away and comes back with a new token (its ids restart
at m1: acks are told apart by the lich that handed the command out), and
ends with a stop at a random point: SIGTERM, the parent's death, the
lifeline (the bridge's socket removed), or a second daemon for the session
(its lock wait: exit 75, or taking over once the first is gone).

    LICH_PROPERTY_SEED=123 pytest tests/test_daemon_acks.py      one schedule, replayed
    SOAK_SCHEDULES=2000 pytest tests/test_daemon_acks.py -k soak -s   make soak

A failing schedule prints its seed, its events and the daemon's log.
"""
from __future__ import annotations

import collections
import heapq
import http.client
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback

import attrs
import pytest

from lich_control.bridge_server import Address, DaemonConnection
from lich_dev.lich import NotPolling, StubLich
from lich_dev.procs import ROOT, daemon_env

pytestmark = pytest.mark.skipif(os.name == "nt", reason="signals, a parent's death and the lifeline's socket are POSIX's here")

SEEDS = range(100)  # the fixed set make test runs
EXIT_WITHIN = 5.0  # the daemon's own bound is 2 s; this one only catches a hang
START_WITHIN = 20.0  # a start on a loaded machine: imports, the lock
OVERRAN = "did not stop within the"  # daemon.Daemon.shutdown's line naming a thread
NEWER_KINDS = {"rewind": ()}  # a kind lich knows and the daemon does not: acked `unknown kind`
STOPS = ("sigterm", "parent", "lifeline", "lock")


# -- what lich hands out -------------------------------------------------------------


def command(rng: random.Random) -> dict:
    """One command lich would queue, of any kind."""
    kind = rng.choice(["prompt", "notification", "abort", "model", "effort", "command", "ask", "rewind"])
    return {
        "prompt": {"kind": "prompt", "text": "run the tests"},
        "notification": {"kind": "prompt", "text": "done", "notification": {"status": "completed", "summary": "a task"}},
        "abort": {"kind": "abort"},
        "model": {"kind": "model", "model": rng.choice(["opus", ""])},
        "effort": {"kind": "effort", "effort": rng.choice(["high", "bogus", ""])},
        "command": {"kind": "command", "name": "compact"},
        "ask": {"kind": "ask", "question": "what now?"},
        "rewind": {"kind": "rewind"},
    }[kind]


MALFORMED = (
    {"kind": "model", "model": 5},
    {"kind": "prompt"},
    {"kind": "ask", "question": ["x"]},
    {"kind": "prompt", "text": "x", "notification": "late"},
    {"kind": "effort", "effort": "max", "model": {"a": 1}},
)


def poll_size(rng: random.Random) -> int:
    """1 to 2,000, mostly few: the acks of a big poll are most of a schedule's time."""
    roll = rng.random()
    if roll < 0.7:
        return rng.randint(1, 20)
    if roll < 0.95:
        return rng.randint(21, 300)
    return rng.randint(301, 2000)


@attrs.frozen
class Schedule:
    seed: int
    events: tuple  # (name, argument) in order; the last is the stop
    answers: dict  # the relay's way with each call: weights of ok, refuse, slow, silent, bad

    @classmethod
    def draw(cls, seed: int) -> "Schedule":
        rng = random.Random(seed)
        events = []
        for _ in range(rng.randint(1, 4)):
            what = rng.choice(["poll", "poll", "asks", "malformed", "settle", "pace"])
            if what == "poll":
                events.append(("poll", [command(rng) for _ in range(poll_size(rng))]))
            elif what == "asks":
                events.append(("poll", [{"kind": "ask", "question": f"q{n}?"} for n in range(rng.randint(1, 50))]))
            elif what == "malformed":
                items = [dict(rng.choice(MALFORMED)) for _ in range(rng.randint(1, 10))] + ["junk", {"kind": "abort"}]
                events.append(("malformed", items))
            elif what == "settle":
                events.append(("settle", round(rng.random(), 2)))  # until this share of what was handed out is acked
            else:
                events.append(("pace", rng.choice([0.0, 0.001, 0.01, 0.05])))
        if rng.random() < 0.15:
            events.append(("lich restarts", None))
        stop = rng.choice(STOPS)
        events.append((stop, {"lock": rng.choice([0.0, 3.0]), "then": [command(rng) for _ in range(rng.randint(1, 30))]} if stop == "lock" else None))
        weights = {"ok": rng.randint(1, 10), "refuse": rng.randint(0, 3), "slow": rng.randint(0, 3), "silent": rng.randint(0, 2), "bad": rng.randint(0, 1)}
        return cls(seed, tuple(events), weights)

    def describe(self) -> str:
        lines = [f"seed {self.seed}; the relay answers {self.answers}"]
        for name, arg in self.events:
            if name in ("poll", "malformed"):
                kinds = collections.Counter(item.get("kind") if isinstance(item, dict) else "junk" for item in arg)
                lines.append(f"  {name} of {len(arg)}: {dict(kinds)}")
            else:
                lines.append(f"  {name} {arg if arg is not None else ''}".rstrip())
        return "\n".join(lines)


# -- the lich, shared by the schedules of its lifetime ----------------------------------


class Lichs:
    """The development lich of this lifetime, and the next on the same
    port with a new token when a schedule restarts it. Each numbers its
    commands from m1, as lich does."""

    def __init__(self):
        self.lich = self._first()
        self.lifetime = 1
        self._ids = 0

    @staticmethod
    def _first() -> StubLich:
        """A lich on a port below the system's ephemeral range: one a
        restart finds free again, where a port the system chose could be
        taken meanwhile by any program's outgoing connection."""
        try:
            with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
                ephemeral = int(f.read().split()[0])
        except OSError:
            ephemeral = 32768  # Linux's default
        rng = random.Random()
        for _ in range(100):
            try:
                return StubLich(port=rng.randrange(ephemeral // 2, ephemeral), newer_kinds=NEWER_KINDS).start()
            except OSError:
                continue  # another test's listener there
        raise AssertionError(f"no free port below {ephemeral} for the development lich")

    def ids(self, n: int) -> list:
        self._ids += n
        return [f"m{k}" for k in range(self._ids - n + 1, self._ids + 1)]

    def restart(self) -> None:
        port = self.lich.port
        self.lich.kill()
        self.lich = StubLich(port=port, newer_kinds=NEWER_KINDS).start()  # a new token
        self.lifetime += 1
        self._ids = 0

    def close(self) -> None:
        self.lich.close()


# -- the relay, playing the session ------------------------------------------------------


class Delayed:
    """One thread that posts the slow results when each falls due."""

    def __init__(self):
        self._cond = threading.Condition()
        self._due: list = []
        self._n = 0
        self._closed = False
        threading.Thread(target=self._run, daemon=True).start()

    def at(self, when: float, job) -> None:
        with self._cond:
            self._n += 1
            heapq.heappush(self._due, (when, self._n, job))
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._due or self._due[0][0] > time.monotonic()):
                    self._cond.wait(None if not self._due else self._due[0][0] - time.monotonic())
                if self._closed:
                    return
                _, _, job = heapq.heappop(self._due)
            job()


class Daemon:
    """One daemon started as the relay starts it (or under a parent that
    will die), its calls answered by `answers`' weights."""

    def __init__(self, env: dict, rng: random.Random, answers: dict, parent: bool = False):
        argv = [sys.executable, "-m", "lich_control"]
        if parent:  # a parent the test can kill; the daemon finds it with getppid
            argv = ["sh", "-c", '"$@" & wait', "sh", *argv]
        else:
            env = dict(env, LICH_CONTROL_PARENT_PID=str(os.getpid()))
        self.proc = subprocess.Popen(argv, cwd=ROOT, env=daemon_env(**env), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self.parent = parent
        self._rng = random.Random(rng.random())
        self._methods, self._weights = zip(*answers.items())
        self.hello: dict | None = None
        self.hello_seen = threading.Event()
        self.ended = threading.Event()
        self.rss = []  # kB, at the first poll and before the stop
        self._delayed = Delayed()
        self._turn = 0
        threading.Thread(target=self._read, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.hello["pid"]

    def wait_hello(self, timeout: float = START_WITHIN) -> bool:
        self.hello_seen.wait(timeout)
        return self.hello is not None

    def note_rss(self) -> None:
        try:
            with open(f"/proc/{self.pid}/status") as status:
                self.rss.append(next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")))
        except (OSError, StopIteration):
            pass

    def wait_exit(self) -> bool:
        """True once the daemon has ended (its stdout at EOF, which only its exit closes)."""
        if not self.ended.wait(EXIT_WITHIN):
            return False
        if not self.parent:
            self.proc.wait(EXIT_WITHIN)
        return True

    def kill(self) -> None:
        """Whatever is left, at the end of a schedule."""
        self._delayed.close()
        for pid in ([self.hello["pid"]] if self.hello else []) + [self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.proc.wait(EXIT_WITHIN)
        for stream in (self.proc.stdin, self.proc.stdout):
            stream.close()

    def _read(self) -> None:
        """Until the daemon's stdout ends, which only its exit does: so this
        thread must outlive any failure to answer."""
        conn = None
        try:
            for raw in self.proc.stdout:
                line = json.loads(raw)
                if line["op"] == "hello":
                    self.hello = line
                    self.hello_seen.set()
                    conn = DaemonConnection(Address.of(line), 5.0)
                    continue
                self._answer(conn, line)
        finally:
            self.hello_seen.set()
            self.ended.set()
            self._delayed.close()

    def _answer(self, conn, call: dict) -> None:
        method = call["method"]
        how = self._rng.choices(self._methods, self._weights)[0]
        awaited = method in ("turn.abort", "overrides.set")  # the worker waits 10 s on these: never left unanswered
        if awaited and how in ("silent", "bad"):
            how = "ok"
        if how == "silent":
            return
        if how == "bad":
            return self._post(conn, "/v1/result", {"id": call["id"], "ok": "yes"})  # refused: 400, the call left pending
        if method == "prompt.submit" and how != "refuse":
            self._turn += 1
            self._post(conn, "/v1/event", {"event": "turn.start", "turnId": f"t{self._turn}"})
        value = {"isAnswered": True, "text": "an answer", "usage": {}} if method == "model.fork" else {"text": "ok"}
        body = {"id": call["id"], "ok": False, "error": "the session refused it"} if how == "refuse" else {"id": call["id"], "ok": True, "value": value}
        if how == "slow":
            slow = DaemonConnection(Address.of(self.hello), 5.0)
            self._delayed.at(time.monotonic() + self._rng.uniform(0.001, 0.3), lambda: self._post(slow, "/v1/result", body, close=True))
        else:
            self._post(conn, "/v1/result", body)
        if self._rng.random() < 0.05:  # the same result again: nothing may come of it
            self._post(conn, "/v1/result", body)

    @staticmethod
    def _post(conn, url: str, body: dict, close: bool = False) -> None:
        try:
            conn.exchange("POST", url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        except (OSError, http.client.HTTPException):
            close = True  # the daemon is gone, or going; a later post tries a new connection
        finally:
            if close:
                conn.close()


# -- one schedule ------------------------------------------------------------------------


@attrs.define
class Outcome:
    handed: int = 0
    acked: int = 0
    overran: int = 0  # unacked, and the log names a thread that overran the grace
    gone: int = 0  # unacked, and their lich killed: no ack can reach it
    rss: list = attrs.Factory(list)  # (at start, at the stop) per daemon, kB
    problems: list = attrs.Factory(list)


def run_schedule(schedule: Schedule, lichs: Lichs, run_dir: str) -> Outcome:
    rng = random.Random(schedule.seed + 1)
    session = f"p{schedule.seed}-{rng.randrange(1 << 30)}"
    env = {"LICH_PORT": str(lichs.lich.port), "LICH_TOKEN": lichs.lich.token, "LICH_SESSION_ID": session, "LICH_CONTROL_RUN_DIR": run_dir}
    served = [lichs.lich]  # every lich this schedule's daemons met, in order
    stop, arg = schedule.events[-1]
    first = Daemon(env, rng, schedule.answers, parent=stop == "parent")
    daemons = [first]
    outcome = Outcome()
    try:
        assert first.wait_hello(), "the daemon sent no hello"
        assert lichs.lich.wait_polled(session, START_WITHIN, parked=True), "the daemon never polled"
        first.note_rss()
        for name, value in schedule.events[:-1]:
            lich = lichs.lich
            if name == "poll":
                cmds = [dict(c, id=i) for c, i in zip(value, lichs.ids(len(value)))]
                try:
                    lich.queue_all(session, cmds)
                except NotPolling:
                    pass  # between a cut poll and the next: lich would refuse it too
            elif name == "malformed":
                lich.faults.deliver(*[dict(item, id=i) if isinstance(item, dict) and item.get("kind") != "abort" else item for item, i in zip(value, lichs.ids(len(value)))], session_id=session)
            elif name == "settle":
                handed = sum(len(a.body) for a in lich.record.answers if a.session_id == session)
                try:
                    lich.record.wait_for(lambda: sum(1 for a in lich.record.acks if _session(a) == session) >= value * handed, 0.3, "acks")
                except AssertionError:
                    pass  # some are left unanswered on purpose
            elif name == "pace":
                time.sleep(value)  # the schedule's own pace, not a wait on the daemon
            elif name == "lich restarts":
                lichs.restart()
                served.append(lichs.lich)
        first.note_rss()
        if stop == "sigterm":
            first.proc.send_signal(signal.SIGTERM)
        elif stop == "parent":
            first.proc.kill()  # sh, the daemon's parent
            first.proc.wait(EXIT_WITHIN)
        elif stop == "lifeline":
            os.remove(first.hello["socket"])
        elif stop == "lock":
            second = Daemon(dict(env, LICH_CONTROL_LOCK_WAIT=str(arg["lock"])), rng, schedule.answers)
            daemons.append(second)
            if arg["lock"] == 0:
                second.proc.wait(START_WITHIN)
                if second.proc.returncode != 75:
                    outcome.problems.append(f"the second daemon exited {second.proc.returncode}, not 75")
            polls_before = lichs.lich.polled(session).polls
            first.proc.send_signal(signal.SIGTERM)
        if not first.wait_exit():
            outcome.problems.append(f"the daemon did not exit within {EXIT_WITHIN:g} s of the stop")
        if stop == "lock" and arg["lock"] and second.wait_hello() and len(served) == 1:  # else its token is the old lich's
            lich = lichs.lich
            if lich.wait_until(session, lambda info: info.polls > polls_before and info.parked, START_WITHIN):
                second.note_rss()
                cmds = [dict(c, id=i) for c, i in zip(arg["then"], lichs.ids(len(arg["then"])))]
                try:
                    lich.queue_all(session, cmds)
                except NotPolling:
                    pass
                second.note_rss()
            second.proc.send_signal(signal.SIGTERM)
            if not second.wait_exit():
                outcome.problems.append(f"the second daemon did not exit within {EXIT_WITHIN:g} s")
    finally:
        for daemon in daemons:
            daemon.kill()
    outcome.rss = [tuple(d.rss[:1] + d.rss[-1:]) for d in daemons if d.rss]
    _judge(schedule, session, served, run_dir, outcome)
    return outcome


def _session(ack) -> str:
    return ack.body.get("session_id") if isinstance(ack.body, dict) else None


def _judge(schedule: Schedule, session: str, served: list, run_dir: str, outcome: Outcome) -> None:
    """The property, for each lich the schedule met: its acks by id against what it handed out."""
    try:
        with open(os.path.join(run_dir, f"{session}.log"), encoding="utf-8", errors="replace") as file:
            log = file.read()
    except OSError:
        log = ""
    overran = OVERRAN in log
    for lifetime, lich in enumerate(served):
        handed = collections.Counter(
            item["id"] for answer in lich.record.answers if answer.session_id == session
            for item in answer.body if isinstance(item, dict) and isinstance(item.get("id"), str)
        )
        acks = collections.Counter(ack.id for ack in lich.record.acks if _session(ack) == session)
        gone = lich is not served[-1]  # killed with acks on their way: they cannot reach it
        outcome.handed += sum(handed.values())
        outcome.acked += sum(acks.values())
        for cid, n in handed.items():
            if n > 1:
                outcome.problems.append(f"lich {lifetime + 1} handed {cid} out {n} times (a test bug)")
        for cid, n in acks.items():
            if cid not in handed:
                outcome.problems.append(f"lich {lifetime + 1}: {n} ack(s) for {cid}, which it never handed out")
            elif n > 1:
                outcome.problems.append(f"lich {lifetime + 1}: {cid} acked {n} times")
        missing = sorted(set(handed) - set(acks), key=lambda cid: int(cid[1:]))
        if missing and gone:
            outcome.gone += len(missing)
        elif missing and overran:
            outcome.overran += len(missing)
        elif missing:
            outcome.problems.append(f"lich {lifetime + 1}: {len(missing)} of {len(handed)} handed out got no ack, and no thread overran its grace: {missing[:10]}")
    if outcome.problems:
        tail = "\n".join(log.splitlines()[-30:])
        raise AssertionError("\n".join([schedule.describe(), *outcome.problems, f"the daemon's log ends:\n{tail}"]))


# -- the tests ----------------------------------------------------------------------------

LANES = 2  # schedules run two at a time, each lane with its own lich: one per core here


def run_lanes(seeds, run_dir: str, lanes: int = LANES):
    """Every schedule of `seeds`, in `lanes` threads; (outcomes, failures), failures as text."""
    outcomes, failures = [], []

    def lane(mine):
        lichs = Lichs()
        try:
            for seed in mine:
                try:
                    outcomes.append(run_schedule(Schedule.draw(seed), lichs, run_dir))
                except Exception as failed:  # the property, or the harness itself: either fails the seed, and the lane goes on
                    said = str(failed) if isinstance(failed, AssertionError) else traceback.format_exc()
                    failures.append(f"{said}\nreplay: LICH_PROPERTY_SEED={seed} pytest {__file__}")
                finally:
                    lichs.lich.record.clear()
        finally:
            lichs.close()

    threads = [threading.Thread(target=lane, args=(list(seeds)[n::lanes],)) for n in range(lanes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes, failures


def test_every_command_lich_hands_out_is_acked_once_however_the_daemon_ends(tmp_path):
    replay = os.environ.get("LICH_PROPERTY_SEED")
    outcomes, failures = run_lanes([int(replay)] if replay else SEEDS, str(tmp_path))
    assert not failures, "\n\n".join(failures)
    assert sum(o.handed for o in outcomes) > 0


@pytest.mark.skipif(not os.environ.get("SOAK_SCHEDULES"), reason="make soak: SOAK_SCHEDULES=N schedules")
def test_soak(tmp_path):
    count = int(os.environ["SOAK_SCHEDULES"])
    first = int(os.environ.get("SOAK_FIRST_SEED", "1000"))
    started = time.monotonic()
    outcomes, failures = run_lanes(range(first, first + count), str(tmp_path))
    took = time.monotonic() - started
    rss = [r for o in outcomes for r in o.rss]
    starts, ends = sorted(r[0] for r in rss), sorted(r[-1] for r in rss)
    print(
        f"\nsoak: {count} schedules (seeds {first} to {first + count - 1}, {LANES} at a time) in {took:.0f} s; "
        f"{len(rss)} daemons; {sum(o.handed for o in outcomes):,} commands handed out, "
        f"{sum(o.acked for o in outcomes):,} acks; unacked: {sum(o.overran for o in outcomes):,} with a grace overrun logged, "
        f"{sum(o.gone for o in outcomes):,} of a lich killed; {len(failures)} schedules failed\n"
        f"daemon RSS, each daemon at its first poll and before its stop: start median {starts[len(starts) // 2] / 1024:.1f} MiB "
        f"(max {starts[-1] / 1024:.1f}), end median {ends[len(ends) // 2] / 1024:.1f} MiB (max {ends[-1] / 1024:.1f})"
    )
    assert not failures, "\n\n".join(failures)
