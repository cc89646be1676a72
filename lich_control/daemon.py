"""The daemon: the gate, the threads wired together, and the way out.

    python -m lich_control.daemon [--host claude-code|opencode]

A tool that simulates a session runs the same daemon with its own engine:
`main(simulated=factory)` (the checkout's `python -m lich_dev.sim`). The
daemon imports no tool.

Threads, each owning its own state:
  main         waits for a reason to stop (a signal, stdout broken, the
               parent gone, the poller crashed) and runs the shutdown;
  lich-poller  the long poll and its backoff (Poller);
  lich-worker  the ordered commands and the overrides (Worker);
  lich-acker   acks of prompts and slash commands as they settle (Acker);
  lich-ask-N   start forks and send their acks, up to the pool's size (Asks);
  lich-ask-deadlines  fails the forks that outlive their deadline (Asks);
  lich-socket  accepts the relay's connections, a thread per connection
               (64 at most: Connections);
  lich-lifeline  watches the pipes to the parent (ParentWatch).
"""
from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import sys
import threading
import time
from typing import Optional

from . import __version__, logs
from .acks import Acks
from .status import Activity
from .bridge import BadMessage, Bridge, Turns
from .config import BadConfig, Config, NotInLich, ensure_run_dir, socket_too_long
from .lich import LichClient
from .lifeline import LOCK_WAIT_SECONDS, ParentWatch, SessionLock, set_parent_death_signal
from .poller import Poller
from .safe_text import Scrub
from .unix_socket import Routes, UnixHttpServer
from .worker import Asks, Worker

log = logging.getLogger("lich_control.daemon")

# How long an ack already on its way may take to finish at shutdown: short,
# so a daemon whose session is gone exits well within 2 s.
STOP_GRACE = 1.0
# The last resort, armed as shutdown begins: whatever still holds the
# process then (a write to a pipe nobody reads, a lock, C code keeping the
# interpreter), the kernel ends it this many seconds later, inside the 2 s
# the relay is promised. Whatever is not written by then is dropped.
EXIT_DEADLINE = 1.8
# Its own signal, not SIGTERM, so the handler can tell a parent's death from
# the exit of the parent's thread that spawned us (which sends it as well).
PARENT_DEATH_SIGNAL = signal.SIGUSR2


class Daemon:
    """Everything one session's daemon runs, started and stopped as one."""

    def __init__(self, config: Config, engine, turns: Turns, activity: Activity, client_factory=None):
        self.config = config
        self.engine = engine
        self.activity = activity
        self._stop = threading.Event()
        # The main thread sleeps in select() on this pipe, never on a lock: a
        # signal that lands just before a lock wait begins runs its handler
        # only once the wait ends, which is never. The interpreter writes
        # each signal's number here (set_wakeup_fd), request_stop a byte.
        self._wake_r, self.wake_fd = os.pipe()
        os.set_blocking(self.wake_fd, False)
        self.stop_reason: Optional[str] = None
        self.exit_code = 0
        factory = client_factory or (lambda: LichClient(config))
        self.acks = Acks(factory, activity)
        self.worker = Worker(engine, turns, self.acks, activity, config.session_id)
        self.asks = Asks(engine, self.acks, activity, config.session_id)
        self.poller = Poller(factory(), self.worker.submit, self.asks.submit, activity, on_crash=self._crashed)

    def start(self) -> None:
        self.worker.start()
        self.poller.start()
        log.info("polling lich on port %d for session %s", self.config.port, self.config.session_id)

    def request_stop(self, reason: str) -> None:
        """Any thread, or a signal handler: record why, and wake the main thread."""
        if self.stop_reason is None:
            self.stop_reason = reason
        self._stop.set()
        try:
            os.write(self.wake_fd, b"s")
        except BlockingIOError:
            pass  # the pipe is full of wake-ups already

    def wait(self, timeout: Optional[float] = None) -> bool:
        """The main thread's sleep: True once a stop was asked for, False if
        `timeout` ran out first. A signal's handler runs as select returns."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stop.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if select.select([self._wake_r], [], [], left)[0]:
                os.read(self._wake_r, 512)
        return True

    def shutdown(self, grace: float = STOP_GRACE) -> None:
        """Stop polling first (a parked poll is cut, never left to take
        commands nobody will apply), then let work already under way finish
        within `grace`; start nothing new."""
        log.info("stopping: %s", self.stop_reason or "asked to")
        deadline = time.monotonic() + grace  # one budget for all, so the exit stays within 2 s
        left = lambda: max(0.0, deadline - time.monotonic())  # noqa: E731
        self.poller.stop(timeout=left())
        self.asks.stop()
        self.worker.stop(timeout=left())
        self.acks.stop(timeout=left())
        self.engine.close("the daemon is stopping")

    def _crashed(self, reason: str) -> None:
        self.exit_code = 1
        self.request_stop(reason)


def main(argv=None, simulated=None) -> int:
    """`simulated`, given by a tool: a factory `(turns) -> engine` that
    stands in for the relay (no hello, nothing on stdout)."""
    parser = argparse.ArgumentParser(prog="lich-mod-daemon", description="The lich mod-control client for one session.")
    # Only recorded, for the status document: the bridge is the same in both.
    parser.add_argument("--host", choices=("claude-code", "opencode"), default="claude-code", help="the program the relay runs in (default: claude-code)")
    parser.add_argument("--version", action="version", version=__version__)
    args = parser.parse_args(argv)
    parent = os.getppid()
    try:
        config = Config.from_env(os.environ)
    except NotInLich:
        return 0  # outside lich: never poll, say nothing
    except BadConfig as exc:
        return _refused(exc)
    try:
        ensure_run_dir(config.run_dir)
        problem = socket_too_long(config.path("sock"))
        if problem:
            raise BadConfig(problem)
    except BadConfig as exc:
        return _refused(exc)
    return run(config, parent, None if simulated else args.host, simulated)


def run(config: Config, parent: int, host: Optional[str] = None, simulated=None) -> int:
    try:  # BadConfig here: something not ours at the log's, the lock's or the socket's name
        stop_logging = logs.setup(config.token, os.environ.get("LICH_CONTROL_LOG_LEVEL"), config.path("log"))
    except BadConfig as exc:
        return _refused(exc)
    lock = SessionLock(config.path("lock"))
    try:
        acquired = lock.acquire(_lock_wait())
    except BadConfig as exc:
        stop_logging()
        return _refused(exc)
    if not acquired:
        print(f"lich-control: another daemon is still polling for session {config.session_id}; exiting", file=sys.stderr)
        stop_logging()
        os._exit(1)

    turns = Turns()
    socket_path = config.path("sock")
    activity = Activity(config.session_id, "sim" if simulated else "relay", turns, files={"socket": socket_path, "log_file": config.path("log")}, host=host, clean=Scrub.of(config.token))

    def stop(reason: str) -> None:
        # Bound late: the bridge needs this before the daemon exists, and
        # nothing calls it before the hello, which comes after.
        daemon.request_stop(reason)

    if simulated:
        engine = simulated(turns)
        routes = Routes(_no_relay, _no_relay, activity.snapshot, BadMessage)
    else:
        engine = Bridge(sys.stdout.buffer, turns, on_broken=stop)
        routes = Routes(engine.result, engine.event, activity.snapshot, BadMessage)

    daemon = Daemon(config, engine, turns, activity)
    signal.set_wakeup_fd(daemon.wake_fd, warn_on_full_buffer=False)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        # The handler only records; the main thread does the stopping.
        signal.signal(sig, lambda signum, frame: daemon.request_stop(f"got {signal.Signals(signum).name}"))

    def parent_died(signum, frame) -> None:
        # Linux sends this when the *thread* that started us exits, too: only
        # a changed parent pid means the session is gone.
        if os.getppid() != parent:
            daemon.request_stop("the process that started the daemon is gone")

    signal.signal(PARENT_DEATH_SIGNAL, parent_died)
    watch = ParentWatch(parent, stop, has_death_signal=set_parent_death_signal(PARENT_DEATH_SIGNAL))

    server = UnixHttpServer(socket_path, routes)
    try:
        server.listen()
    except BadConfig as exc:
        lock.release()
        stop_logging()
        return _refused(exc)
    if not simulated:
        engine.hello(socket_path)
    watch.start()
    if not daemon.wait(0):
        daemon.start()
    daemon.wait()
    arm_exit_deadline(EXIT_DEADLINE)
    daemon.shutdown()
    server.close()
    lock.release()
    log.info("stopped: %s", daemon.stop_reason)
    stop_logging()
    # Threads still parked (a fork that will never answer, a lock waiter)
    # must not hold the exit: everything worth finishing has finished.
    os._exit(daemon.exit_code)


def arm_exit_deadline(seconds: float) -> None:
    """End the process `seconds` from now, whatever its threads are doing.

    SIGALRM at its default action is carried out by the kernel: no Python
    code, no lock, no interpreter needed. Set to the default here, since a
    parent may have passed it down ignored."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _refused(exc: BadConfig) -> int:
    """A configuration the daemon refuses: its one line, and exit 2 (the relay does not restart it)."""
    print(f"lich-control: {exc}", file=sys.stderr)
    return 2


def _lock_wait() -> float:
    try:
        return max(0.0, float(os.environ.get("LICH_CONTROL_LOCK_WAIT", LOCK_WAIT_SECONDS)))
    except ValueError:
        return LOCK_WAIT_SECONDS


def _no_relay(doc) -> None:
    log.info("a relay message reached a daemon on the simulated session; ignored")


if __name__ == "__main__":
    sys.exit(main())
