"""The benchmark: the daemon against the development lich and a relay stand-in.

    python -m lich_bench [--runs N] [--smoke] [--json FILE] [sizes...]

Everything but the daemon runs in this process: the development lich
(`StubLich`, on loopback) and the relay stand-in (`relay.py`), which answers
every call at once over the daemon's Unix socket (forks after
`--fork-delay` seconds). All timestamps come from one clock. It prints a
table, then one JSON document.

Scenarios, each run on fresh daemons (`scenarios.py`):
  startup   process start -> first poll at lich (several spawns a run);
  dispatch  prompts queued one at a time: enqueue -> the prompt.submit line;
  floors    the stack with nothing of ours in it: a bare requests.Session
            posting the same ack to the same lich back to back (its own
            process), and bare round trips on the daemon's socket;
  ack       model commands one at a time: enqueue -> the ack at lich;
  burst     model commands queued at once (one poll carries them): time to
            the last ack, rate, order, and when the next poll went out;
  asks      asks queued at once, each fork answering after the delay;
then once (`fleet.py`): idle (a parked poll: CPU, RSS, threads, wake-ups over
a window) and scale (many daemons against one lich, a prompt and an ask each).

It asserts nothing about time: `make test` runs `--smoke` to prove it works.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from typing import Callable, Dict, List

import attrs

from lich_dev.lich import StubLich
from .common import BenchError
from .fleet import run_idle, run_scale
from .report import flags, machine, percentile, summarize, table
from .scenarios import Marks, run_acks, run_asks, run_burst, run_dispatch, run_requests_floor, run_socket_floor, start_daemon


@attrs.frozen
class Sizes:
    runs: int = 3
    startups: int = 5  # spawns per run for the startup figure
    dispatch: int = 300
    floor: int = 1000  # round trips of each floor
    ack: int = 300
    burst: int = 2000
    asks: int = 20
    fork_delay: float = 1.0
    idle_seconds: float = 30.0
    scale: int = 100


SMOKE = Sizes(runs=1, startups=1, dispatch=5, floor=20, ack=5, burst=40, asks=3, fork_delay=0.05, idle_seconds=0.3, scale=2)


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
            log(f"run {index}: floors")
            floor = {"requests": run_requests_floor(lich, sizes.floor), "socket": run_socket_floor(relay, sizes.floor)}
            log(f"run {index}: ack")
            acks = run_acks(lich, marks, relay, sizes.ack, f"r{index}")
            log(f"run {index}: burst")
            burst = run_burst(lich, marks, relay, sizes.burst, f"r{index}")
            log(f"run {index}: asks")
            asks = run_asks(lich, marks, relay, sizes.asks, f"r{index}")
            if relay.errors:
                raise BenchError("; ".join(relay.errors[:3]))
        finally:
            if relay is not None:
                relay.stop()
    floor["sum_ms"] = floor["requests"]["p50_ms"] + floor["socket"]["p50_ms"]
    floor["per_s"] = 1000 / floor["sum_ms"]  # one ack and one result a command, back to back
    return {
        "startup_ms": startups,
        "floor": floor,
        "dispatch_ms": {"p50": percentile(dispatch, 50), "p90": percentile(dispatch, 90), "p99": percentile(dispatch, 99), "max": max(dispatch)},
        "ack_ms": {"p50": percentile(acks, 50), "p99": percentile(acks, 99), "max": max(acks)},
        "burst": burst,
        "asks": asks,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lich_bench", description="Measure the daemon against the floors of its stack.")
    defaults = Sizes()
    parser.add_argument("--smoke", action="store_true", help="a tiny configuration that only proves the benchmark works")
    parser.add_argument("--runs", type=int, help=f"runs of the per-run scenarios (default {defaults.runs})")
    parser.add_argument("--startups", type=int, help=f"daemon spawns a run for the startup figure (default {defaults.startups})")
    parser.add_argument("--dispatch", type=int, help=f"prompts one at a time (default {defaults.dispatch})")
    parser.add_argument("--floor", type=int, help=f"round trips of each floor (default {defaults.floor})")
    parser.add_argument("--ack", type=int, help=f"model commands one at a time (default {defaults.ack})")
    parser.add_argument("--burst", type=int, help=f"model commands queued at once (default {defaults.burst})")
    parser.add_argument("--asks", type=int, help=f"asks queued at once (default {defaults.asks})")
    parser.add_argument("--fork-delay", type=float, help=f"seconds each fork takes to answer (default {defaults.fork_delay:g})")
    parser.add_argument("--idle-seconds", type=float, help=f"the idle window (default {defaults.idle_seconds:g})")
    parser.add_argument("--scale", type=int, help=f"daemons in the scale scenario (default {defaults.scale}; 0 skips it)")
    parser.add_argument("--json", metavar="FILE", help="also write the JSON document to FILE")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)
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
    print(table(summary, checks, sizes.runs))
    print()
    text = json.dumps(doc, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
