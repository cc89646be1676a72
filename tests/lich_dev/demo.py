"""The demo: a development lich, a daemon on the simulated session, every kind of command.

    python -m lich_dev.demo          walk through every kind, check each
                                         outcome, show lich-mod-status, exit
    python -m lich_dev.demo --run    keep both up for lich-stub control,
                                         until Ctrl-C

The lich runs in this process (`StubLich`); the daemon is a subprocess in
this process's group, on a private run folder that is removed at the end.
The live view interleaves three voices as they happen: `→` what lich sent,
`session:` what the simulated session did (the daemon's stderr), `←` the ack.

Threads: main runs the steps; `demo-session` reads the daemon's stderr into
`SessionLines`; a small pool waits on each command's ack and prints it as
it lands.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait as wait_all
from typing import List, Optional

import attrs

from .cli import RUNTIME_NAME, remove_runtime, write_runtime
from .lich import Outcome, StubLich
from .procs import ROOT, daemon_env, stop

SESSION = "demo"
# Short so the walk-through stays well under 30 s, long enough to abort a turn.
DEMO_TIMINGS = {"LICH_SIM_TURN_SECONDS": "1.2", "LICH_SIM_STEPS": "3", "LICH_SIM_FORK_SECONDS": "0.5"}
RUN_TIMINGS = {"LICH_SIM_TURN_SECONDS": "8", "LICH_SIM_STEPS": "4", "LICH_SIM_FORK_SECONDS": "2"}
ACK_TIMEOUT = 10.0


@attrs.frozen
class Expect:
    ok: bool
    error: Optional[str] = None


class Say:
    """One printer for every thread, each line stamped with the time since the start."""

    def __init__(self, out=sys.stdout):
        self._out = out
        self._lock = threading.Lock()
        self._start = time.monotonic()

    def __call__(self, text: str = "") -> None:
        with self._lock:
            stamp = f"{time.monotonic() - self._start:6.2f}s " if text else ""
            self._out.write(f"{stamp}{text}\n")
            self._out.flush()


class SessionLines:
    """The daemon's stderr, printed as it comes and kept for `wait_for`. Its thread owns the reading."""

    def __init__(self, stream, say: Say, on_end=lambda: None):
        self._stream = stream
        self._on_end = on_end
        self._say = say
        self._cond = threading.Condition()
        self._lines: List[str] = []
        self._thread = threading.Thread(target=self._run, name="demo-session", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for raw in self._stream:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self._say(f"    {line}" if line.startswith("session: ") else f"    daemon: {line}")
            with self._cond:
                self._lines.append(line)
                self._cond.notify_all()
        self._on_end()  # the daemon closed its stderr: it has exited

    def wait_for(self, pattern: str, timeout: float, start: int = 0) -> Optional[str]:
        """The first line from index `start` on matching `pattern`, or None when time runs out."""
        deadline = time.monotonic() + timeout
        regex = re.compile(pattern)
        with self._cond:
            while True:
                hit = next((line for line in self._lines[start:] if regex.search(line)), None)
                left = deadline - time.monotonic()
                if hit is not None or left <= 0:
                    return hit
                self._cond.wait(left)

    @property
    def count(self) -> int:
        with self._cond:
            return len(self._lines)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


class Demo:
    """The lich, the daemon and their run folder, started and stopped as one."""

    def __init__(self, timings: dict, say: Say, on_daemon_exit=lambda: None):
        self.say = say
        self.run_dir = tempfile.mkdtemp(prefix="lich-demo-")  # short: socket paths
        # A lich newer than the mod: it knows a kind the mod does not, to show that ack.
        self.lich = StubLich(newer_kinds={"rewind": ("to",)}).start()
        self.runtime_file = os.path.join(self.run_dir, RUNTIME_NAME)
        self.env = daemon_env(
            **timings,
            LICH_PORT=str(self.lich.port),
            LICH_TOKEN=self.lich.token,
            LICH_SESSION_ID=SESSION,
            LICH_CONTROL_RUN_DIR=self.run_dir,
        )
        # stdin stays a pipe: if this process dies, the daemon sees it close and stops.
        self.daemon = subprocess.Popen(
            [sys.executable, "-m", "lich_dev.sim"],
            cwd=ROOT,
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.session = SessionLines(self.daemon.stderr, say, on_daemon_exit)
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="demo-ack")
        self.mismatches: List[str] = []
        self._lock = threading.Lock()

    def wait_polling(self, timeout: float = 10.0) -> bool:
        return self.lich.wait_polled(SESSION, timeout)

    def send(self, command: dict, expect: Expect) -> "Future[Outcome]":
        """Queue one command; its ack is printed and checked when it lands."""
        cid = self.queue(command)
        future = self._pool.submit(self.lich.wait, cid, ACK_TIMEOUT)
        future.add_done_callback(lambda done: self._landed(done, expect))
        return future

    def queue(self, command: dict) -> str:
        """Queue one command and say so, without waiting for its ack."""
        cid = self.lich.queue(SESSION, command)
        shown = {k: v for k, v in command.items() if k != "kind"}
        self.say(f"→ {cid} {command['kind']} {json.dumps(shown, ensure_ascii=False) if shown else ''}".rstrip())
        return cid

    def settle(self, *futures: "Future[Outcome]") -> None:
        wait_all(futures, timeout=ACK_TIMEOUT + 1)

    def check(self, what: str, good: bool) -> None:
        if not good:
            with self._lock:
                self.mismatches.append(what)
            self.say(f"  ✗ {what}")

    def _landed(self, done: "Future[Outcome]", expect: Expect) -> None:
        outcome = done.result()
        head = f"← {outcome.id} {outcome.kind}"
        if outcome.ack is None:
            got = "never delivered" if not outcome.delivered else f"no ack within {ACK_TIMEOUT:g} s"
        elif outcome.ok:
            answer = outcome.ack.get("answer")
            got = "ok" + (f": {answer!r}" if answer is not None else "")
        else:
            got = f"failed: {outcome.ack.get('error')}"
        took = f" ({outcome.took_s * 1000:.0f} ms)" if outcome.took_s is not None else ""
        good = outcome.acked and outcome.ok == expect.ok and (expect.error is None or outcome.ack.get("error") == expect.error)
        wanted = "ok" if expect.ok else f"failed: {expect.error}"
        self.say(f"{head} {got}{took}" + ("" if good else f"   ✗ expected {wanted}"))
        if not good:
            with self._lock:
                self.mismatches.append(f"{outcome.kind} {outcome.id}: got {got}, expected {wanted}")

    def status(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "lich_control.status_cli", *args],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=10,
        )
        return done.stdout + done.stderr

    def close(self) -> None:
        """Stop the daemon (SIGTERM, then SIGKILL), the lich, and remove the run folder."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        stop(self.daemon)
        self.daemon.stdin.close()
        self.session.join(2)
        self.daemon.stderr.close()
        remove_runtime(self.runtime_file)
        self.lich.close()
        shutil.rmtree(self.run_dir, ignore_errors=True)


def walk(demo: Demo) -> None:
    """Every kind, in an order that shows the contract's rules."""
    say, send, settle, lines = demo.say, demo.send, demo.settle, demo.session

    say("== model and effort set: every request of the next turn carries them")
    settle(send({"kind": "model", "model": "sim-opus"}, Expect(True)))
    settle(send({"kind": "effort", "effort": "high"}, Expect(True)))

    say("== a prompt: acked once its turn starts")
    mark = lines.count
    settle(send({"kind": "prompt", "text": "run the tests"}, Expect(True)))
    demo.check("the turn's requests carry model=sim-opus effort=high", bool(lines.wait_for(r"request 1/\d+ sent with model=sim-opus effort=high", 5, mark)))
    demo.check("the first turn ends", bool(lines.wait_for(r"turn t1 answered", 10, mark)))

    say("== a slash command queued behind a turn, and several asks at once beside it")
    mark = lines.count
    prompt = send({"kind": "prompt", "text": "write the changelog"}, Expect(True))
    compact = send({"kind": "command", "name": "compact", "args": "keep the test plan"}, Expect(True))
    asks = [
        send({"kind": "ask", "question": "what are you working on?"}, Expect(True)),
        send({"kind": "ask", "question": "which file is next?"}, Expect(True)),
        send({"kind": "ask", "question": "fail:api-error, please"}, Expect(False, "api-error 529 overloaded")),
    ]
    settle(prompt, compact, *asks)
    demo.check("/compact ran only once turn t2 ended", bool(lines.wait_for(r"turn t2 answered", 1, mark)))

    say("== an abort of the running turn")
    mark = lines.count
    settle(send({"kind": "prompt", "text": "refactor everything"}, Expect(True)))
    settle(send({"kind": "abort"}, Expect(True)))
    demo.check("turn t3 was aborted", bool(lines.wait_for(r"turn t3 aborted", 2, mark)))

    say("== a prompt with a notification: submitted as the user, as a task notification")
    mark = lines.count
    settle(send({"kind": "prompt", "text": "Session \"docs\" finished: if a < b && c > d, see </result>.",
                 "notification": {"status": "completed", "summary": "session \"docs\" finished"}}, Expect(True)))
    demo.check("the session got a task notification", bool(lines.wait_for(r"as the user, a task notification", 2, mark)))
    demo.check("the notification's turn ends", bool(lines.wait_for(r"turn t4 answered", 10, mark)))

    say("== model and effort dropped, an invalid effort, an abort with no turn, a dropped prompt, a kind newer than the mod")
    settle(send({"kind": "model"}, Expect(True)))
    settle(send({"kind": "effort"}, Expect(True)))
    settle(send({"kind": "effort", "effort": "turbo"}, Expect(False, "unknown effort")))
    settle(send({"kind": "abort"}, Expect(False, "no turn is running")))
    settle(send({"kind": "prompt", "text": "drop:a plugin dropped it"}, Expect(False, "a plugin dropped it")))
    settle(send({"kind": "rewind", "to": "t1"}, Expect(False, "unknown kind")))

    say("== left running for lich-mod-status: an override, a turn, a slash command behind it")
    mark = lines.count
    settle(send({"kind": "model", "model": "sim-sonnet"}, Expect(True)))
    settle(send({"kind": "prompt", "text": "summarise the day"}, Expect(True)))
    demo.queue({"kind": "command", "name": "cost"})
    demo.check("/cost waits behind the turn", bool(lines.wait_for(r"command waits for turn t\d+ to end", 2, mark)))


def run_demo(say: Say) -> int:
    demo = Demo(DEMO_TIMINGS, say)
    try:
        say(f"lich-stub on 127.0.0.1:{demo.lich.port}; daemon pid {demo.daemon.pid} on the simulated session {SESSION!r}")
        if not demo.wait_polling():
            say("✗ the daemon never polled")
            return 1
        walk(demo)
        say("== lich-mod-status")
        sys.stdout.write(demo.status())
        say(f"== lich-mod-status {SESSION}")
        sys.stdout.write(demo.status(SESSION))
    finally:
        demo.close()
    if demo.mismatches:
        say(f"demo FAILED: {len(demo.mismatches)} outcome(s) not as they should be:")
        for what in demo.mismatches:
            say(f"  {what}")
        return 1
    say("demo passed: every outcome was as it should be; everything is stopped and removed")
    return 0


def by_hand(run_dir: str) -> List[str]:
    """The lines to drive the daemon with from another terminal, in any
    folder, whatever `python3` is there: the tools run with this interpreter,
    the one the project is installed in."""
    python = shlex.quote(os.path.relpath(sys.executable, ROOT))
    return [
        f"cd {shlex.quote(ROOT)}",
        f"export LICH_CONTROL_RUN_DIR={shlex.quote(run_dir)}",
        f"{python} tests/lich-stub control {SESSION} prompt run the tests",
        f"{python} tests/lich-stub control {SESSION} abort",
        f"{python} tests/lich-stub ask {SESSION} what are you doing",
        f"{python} bin/lich-mod-status {SESSION}",
    ]


def run_by_hand(say: Say) -> int:
    timings = {k: os.environ.get(k, v) for k, v in RUN_TIMINGS.items()}
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: stop.set())
    demo = Demo(timings, say, on_daemon_exit=stop.set)
    try:
        write_runtime(demo.runtime_file, demo.lich.port, demo.lich.token)
        if not demo.wait_polling():
            say("the daemon never polled; stopping")
            return 1
        print(
            f"\nlich-stub on 127.0.0.1:{demo.lich.port}, daemon pid {demo.daemon.pid} on the simulated session {SESSION!r}.\n"
            "In another terminal:\n" + "".join(f"  {line}\n" for line in by_hand(demo.run_dir)) +
            "Ctrl-C here stops everything.\n",
            flush=True,
        )
        stop.wait()
        return 0 if demo.daemon.poll() is None else 1
    finally:
        say("stopping")
        demo.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="lich-demo", description=__doc__.split("\n")[0])
    parser.add_argument("--run", action="store_true", help="keep the lich and the daemon up until Ctrl-C")
    args = parser.parse_args(argv)
    say = Say()
    return run_by_hand(say) if args.run else run_demo(say)


if __name__ == "__main__":
    sys.exit(main())
