"""A soak: thousands of commands through the real daemon with acks failing at
random. Memory, threads and file descriptors must stay flat, and no command
may be acked twice."""
import collections
import os
import random
import time

from lich_control.asks import POOL_SIZE

TOTAL = 2000
BATCH = 50


def proc_figures(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.split()
    return {"rss_kib": int(fields["VmRSS"][0]), "threads": int(fields["Threads"][0]), "fds": len(os.listdir(f"/proc/{pid}/fd"))}


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
    lich.wait_parked()
    pid = r.proc.pid

    def run(start, n):
        faults = [rng.choice([None] * 16 + ["drop", "drop"]) for _ in range(n)]
        statuses = [rng.choice([204] * 14 + [400, 500]) for _ in range(n)]
        with lich.cond:
            lich.ack_faults.extend(faults)
            lich.ack_status.extend(s for s, f in zip(statuses, faults) if f is None)
        target = lich.acks_arrived + n
        lich.send(*commands(rng, start, n))
        lich.wait_for(lambda: lich.acks_arrived >= target, timeout=30, what=f"{n} ack attempts")

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

    attempts = collections.Counter(lich.ack_ids_arrived)
    assert len(attempts) == TOTAL and max(attempts.values()) == 1  # each acked once, failures not resent
    assert end["rss_kib"] - warm["rss_kib"] < 4 * 1024, (warm, middle, end)
    assert end["rss_kib"] - middle["rss_kib"] < 2 * 1024, (warm, middle, end)
    assert end["threads"] <= warm["threads"] + POOL_SIZE and end["threads"] <= middle["threads"] + 4, (warm, middle, end)
    # An ask thread the pool adds brings its own keep-alive connection to lich,
    # and a relay connection may be mid-close; a leak over ~400 failed acks
    # and 1,500 results would show as hundreds.
    assert (end["fds"] - end["threads"]) - (warm["fds"] - warm["threads"]) <= 6, (warm, end)
    assert r.proc.poll() is None
    # lich counts an ack when it arrives; the daemon is done with it once it
    # has read lich's answer, a moment later: give it that moment.
    deadline = time.monotonic() + 5
    status = r.status()
    while status["in_flight"] and time.monotonic() < deadline:
        time.sleep(0.01)
        status = r.status()
    assert status["in_flight"] == [] and len(status["recent"]) == 20 and len(status["errors"]) == 10
