"""A soak: thousands of commands through the real daemon with acks failing at
random. Memory, threads and file descriptors must stay flat, and no command
may be acked twice."""
import collections
import os
import random

from lich_control.asks import POOL_SIZE
from lich_bench.procfs import proc_status
from lich_dev.lich import AckAnswer

TOTAL = 2000
BATCH = 50


def proc_figures(pid):
    status = proc_status(pid)
    return {"rss_kib": int(status["VmRSS"].split()[0]), "threads": int(status["Threads"]), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def commands(rng, start, n):
    out = []
    for i in range(start, start + n):
        cid = f"k{i}"
        out.append(
            rng.choice(
                [
                    {"id": cid, "kind": "model", "model": rng.choice(["opus", "sonnet"])},
                    {"id": cid, "kind": "effort", "effort": rng.choice(["low", "max", "bogus"])},
                    {"id": cid, "kind": "prompt", "text": "go " * rng.randint(1, 50)},
                    {"id": cid, "kind": "command", "name": "compact", "args": "x"},
                    {"id": cid, "kind": "ask", "question": "how far along?"},
                    {"id": cid, "kind": "abort"},
                    {"id": cid, "kind": "rewind"},
                ]
            )
        )
    return out


def test_a_soak_with_failing_acks_stays_flat_and_acks_each_command_at_most_once(relay, lich):
    rng = random.Random(7)
    r = relay()
    r.wait_hello()
    r.autoanswer(fork_text="a fairly long answer " * 50)
    assert lich.wait_polled("s1", 10, parked=True)
    pid = r.proc.pid
    # One in nine acks dropped unanswered; of the rest, one in eight refused or failed.
    answers = [AckAnswer(drop=True)] * 2 + [AckAnswer()] * 14 + [AckAnswer(status=400), AckAnswer(status=500)]

    def run(start, n):
        lich.faults.script_acks(*(rng.choice(answers) for _ in range(n)))
        target = len(lich.record.acks) + n
        lich.queue_all("s1", commands(rng, start, n))
        lich.record.wait_for(lambda: len(lich.record.acks) >= target, timeout=30, what=f"{n} ack attempts")

    sent = 0
    while sent < 500:  # warm up: pools, caches, the allocator's arenas
        run(sent, BATCH)
        sent += BATCH
    warm = proc_figures(pid)
    middle = None
    while sent < TOTAL:
        run(sent, BATCH)
        sent += BATCH
        if sent == (TOTAL + 500) // 2 // BATCH * BATCH:
            middle = proc_figures(pid)
    end = proc_figures(pid)

    attempts = collections.Counter(a.id for a in lich.record.acks)
    assert len(attempts) == TOTAL and max(attempts.values()) == 1  # each acked once, failures not resent
    assert end["rss_kib"] - warm["rss_kib"] < 4 * 1024, (warm, middle, end)
    assert end["rss_kib"] - middle["rss_kib"] < 2 * 1024, (warm, middle, end)
    assert end["threads"] <= warm["threads"] + POOL_SIZE and end["threads"] <= middle["threads"] + 4, (warm, middle, end)
    # An ask thread the pool adds brings its own keep-alive connection to lich,
    # and a relay connection may be mid-close; a leak over ~400 failed acks
    # and 1,500 results would show as hundreds.
    assert (end["fds"] - end["threads"]) - (warm["fds"] - warm["threads"]) <= 6, (warm, end)
    assert r.proc.poll() is None
    # lich records an ack as it arrives, the daemon once lich has answered it.
    status = r.wait_status(lambda s: s["in_flight"] == [], timeout=5)
    assert len(status["recent"]) == 20 and len(status["errors"]) == 10
