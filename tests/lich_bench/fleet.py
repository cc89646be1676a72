"""The daemon at rest and in numbers: idle (a parked poll over a window) and
scale (many daemons against one lich, a prompt and an ask each)."""
from __future__ import annotations

import statistics
import time
from typing import List

from lich_dev.lich import StubLich
from .common import CLOCK, WAIT, BenchError
from .procfs import proc_cpu_ns, proc_cpu_s, proc_status, pss_mb, rss_mb, thread_switches
from .relay import Relay
from .scenarios import Marks, wait_acked, wait_parked


def run_idle(lich: StubLich, marks: Marks, relay: Relay, seconds: float) -> dict:
    """A daemon with nothing to do: its poll parked, what it costs over `seconds`."""
    sid, pid = relay.session_id, relay.pid
    # Measure from a fresh parked poll, so the window holds at most the polls
    # the protocol makes (lich answers [] after its hold and the poll goes out again).
    wait_parked(lich, sid)
    wait_quiet(pid)
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


def wait_quiet(pid: int, still: float = 0.25) -> None:
    """Until the daemon has spent no CPU for `still` seconds: its start (the
    imports a first request loads, the threads it starts) is over, and the
    idle window holds only what a parked poll costs."""
    deadline = CLOCK() + WAIT
    last = proc_cpu_ns(pid)
    while CLOCK() < deadline:
        time.sleep(still)  # the quiet being waited for is a span of time
        now = proc_cpu_ns(pid)
        if now is None or now == last:
            return
        last = now
    raise BenchError(f"idle: the daemon (pid {pid}) never went quiet in {WAIT:g} s")


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

