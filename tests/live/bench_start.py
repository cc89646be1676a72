"""How quickly the relay starts, next to the original mod: from launching an
interactive Claude Code inside lich to the first poll lich sees, in rounds
that take the two in turn (the order flipped every round), so a loaded
machine weighs on both alike. Not a test (pytest collects test_*.py only):

    python tests/live/bench_start.py --original DIR [--rounds 5] [--release 2.1.332] [--also NAME=DIR ...]

DIR is a plugin folder whose mod polls lich in Claude Code's process, as
lich-plugin's hooks/mod-control.js does (its .claude-plugin/plugin.json and
a hooks/hooks.json naming the module under `modules`); it is not part of
this repository. Ours is a copy of this checkout, its daemon run by the
interpreter that has the project installed (PYTHON, else this one) through
the plugin's `python` option, so no setup runs. Each session is one launch:
`claude --plugin-dir` under a pseudo-terminal, in the live test's world
(a throwaway home, the fake model API), against an in-process development
lich whose poll hook notes the time; then /exit, and the next. Times are
time.perf_counter, in one process. `--also` adds other plugin folders to
the rounds (another state of this relay, say: `git worktree add`).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # lich_dev

from claude_world import World, claude_binary  # noqa: E402
from devlich import Unavailable  # noqa: E402
from lich_dev.lich import StubLich  # noqa: E402
from processes import Closing  # noqa: E402
from releases import PINNED, release  # noqa: E402

WAIT = 60.0


class InProcessLich(Closing):
    """The development lich in this process, with the time of each session's first poll."""

    def __init__(self):
        self.stub = StubLich()
        self.stub.__enter__()
        self.port, self.token, self.pid = self.stub.port, self.stub.token, os.getpid()
        self.first_poll: Dict[str, float] = {}
        self._polled = threading.Condition()
        self.stub.on_poll = self._noted

    def _noted(self, session_id: str) -> None:
        at = time.perf_counter()
        with self._polled:
            self.first_poll.setdefault(session_id, at)
            self._polled.notify_all()

    def wait_first_poll(self, session_id: str, timeout: float) -> float:
        with self._polled:
            if not self._polled.wait_for(lambda: session_id in self.first_poll, timeout):
                raise AssertionError(f"no poll for {session_id} within {timeout:g} s")
            return self.first_poll[session_id]

    def close(self) -> None:
        self.stub.__exit__(None, None, None)


class BenchWorld(World):
    def start_lich(self):
        return InProcessLich()


def one_start(world: BenchWorld, session_id: str, plugin: str) -> float:
    """Seconds from launching claude to the session's first poll."""
    began = time.perf_counter()
    session = world.session(session_id, plugin_dir=plugin)
    polled = world.lich.wait_first_poll(session_id, WAIT)
    assert session.exit(WAIT) == 0, f"{session_id}: claude did not exit cleanly"
    return polled - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--original", required=True, help="the original mod's plugin folder")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--release", default=PINNED, help=f"the Claude Code release (default {PINNED})")
    parser.add_argument("--also", action="append", default=[], metavar="NAME=DIR", help="another plugin folder to time")
    args = parser.parse_args()
    try:
        claude = release(args.release, claude_binary() if args.release == PINNED else "")
    except Unavailable as exc:
        print(f"bench_start: {exc}", file=sys.stderr)
        return 1
    with BenchWorld(claude.binary, claude_env=claude.env) as world:
        plugins = {"original": os.path.abspath(args.original), "ours": world.ws.copy_checkout()}
        for also in args.also:
            name, _, folder = also.partition("=")
            plugins[name] = os.path.abspath(folder)
        times: Dict[str, List[float]] = {name: [] for name in plugins}
        # One launch of each first, not counted: the binary and Python's files in the page cache.
        for name, plugin in plugins.items():
            one_start(world, f"warm-{name}", plugin)
        for round_ in range(args.rounds):
            # Each round in turn forwards and backwards.
            order = list(plugins) if round_ % 2 == 0 else list(reversed(plugins))
            for name in order:
                times[name].append(one_start(world, f"{name}-{round_}", plugins[name]))
    print(f"Claude Code {claude.version}, launch -> first poll at lich, {args.rounds} interleaved rounds (s):")
    for name, values in times.items():
        print(f"  {name:9} median {statistics.median(values):.3f}  [{', '.join(f'{v:.3f}' for v in values)}]")
    for name in times:
        if name != "original":
            ratio = statistics.median(times[name]) / statistics.median(times["original"])
            print(f"  {name} / original (medians): {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
