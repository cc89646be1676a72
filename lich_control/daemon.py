"""The daemon: the gate, the threads wired together, and the way out.

`python -m lich_control` (__main__.py) calls `main`; a tool that simulates
a session passes its own engine (`main(simulated=factory)`). The threads and
what each owns: docs/architecture.md.
"""
import argparse
import contextlib
import logging
import os
import select
import signal
import socket
import sys
import time
from typing import Callable, Optional

from . import __version__, run_folder
from .acks import Acks
from .activity import Activity
from .bridge import Bridge, Turns
from .config import ADDRESS, BadConfig, Config, NotInLich, expected_parent, lock_wait
from .lich import LichClient
from .logs import Logs, Redactor, escape
from .poller import Poller
from .bridge_server import BridgeServer, Routes, listener_at
from .system import native
from .worker import Asks, Worker

log = logging.getLogger("lich_control.daemon")

# What the work under way may take at shutdown: short, so the daemon exits
# well within the 2 s the relay is promised.
STOP_GRACE = 1.0
# The last resort, armed as shutdown begins: whatever still holds the process
# then (a write to a pipe nobody reads, C code keeping the interpreter) is cut.
EXIT_DEADLINE = 1.8
REFUSED = 2  # the relay does not restart a daemon that exits with it (bridge.md)
# Another daemon still holds the session's lock: the relay starts this one
# again after a pause, for as long as that lasts (EX_TEMPFAIL).
LOCK_HELD = 75


class Daemon:
    """Everything one session's daemon runs, started and stopped as one."""

    def __init__(self, config: Config, engine, turns: Turns, activity: Activity):
        self.config = config
        self.engine = engine
        self._started = False
        # The main thread sleeps in select() on this socket pair, never on a
        # lock, whose wait a signal's handler could not interrupt. The
        # interpreter writes each signal here (set_wakeup_fd), request_stop a
        # byte. Sockets, not a pipe: Windows selects on sockets only.
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self.wake_fd = self._wake_w.fileno()
        self.stop_reason: Optional[str] = None  # set once: a stop was asked for
        self.exit_code = 0
        self.acks = Acks(lambda: LichClient(config), activity)  # a client per sending thread
        self.worker = Worker(engine, turns, self.acks, activity, config.session_id)
        self.asks = Asks(engine, self.acks, activity, config.session_id)
        self.poller = Poller(LichClient(config), self.worker.submit, self.asks.submit, activity, on_crash=self.crashed)

    def start(self) -> None:
        """Start polling, unless a stop was asked for already."""
        if self.stop_reason is not None:
            return
        self._started = True
        self.poller.start()
        log.info("polling lich on port %d for session %s", self.config.port, self.config.session_id)

    def request_stop(self, reason: str) -> None:
        """Any thread, or a signal handler: record why, and wake the main thread, which stops."""
        if self.stop_reason is None:
            self.stop_reason = reason
        try:
            self._wake_w.send(b"s")
        except BlockingIOError:
            pass  # full of wake-ups already

    def wait(self) -> None:
        """The main thread's sleep until a stop is asked for."""
        while self.stop_reason is None:
            select.select([self._wake_r], [], [])
            self._wake_r.recv(512)

    def shutdown(self, grace: float = STOP_GRACE) -> None:
        """The one way down: stop polling (a parked poll is cut), start
        nothing new, fail every call still waiting on the session so that its
        command is acked with why, and let the work under way finish within
        `grace`; a thread that overran it is named in the log."""
        log.info("stopping: %s", self.stop_reason)
        deadline = time.monotonic() + grace  # one budget for all, so the exit stays within 2 s

        def within_grace(name: str, stop: Callable[[float], bool]) -> None:
            if not stop(max(0.0, deadline - time.monotonic())):
                log.warning("%s did not stop within the %g s grace; the exit cuts it short", name, grace)

        if self._started:
            within_grace("the poller", self.poller.stop)
            # What is still queued is acked as never applied, in the grace.
            self.worker.stop(0, self.stop_reason)
            self.asks.stop(0, self.stop_reason)
        self.engine.close(f"the daemon stopped before the session answered ({self.stop_reason})")
        if self._started:
            for name, stop in (("the worker", self.worker.stop), ("the asks", self.asks.stop), ("the acks", self.acks.stop)):
                within_grace(name, stop)

    def crashed(self, reason: str) -> None:
        """Stop with exit 1: the relay starts another daemon (not once stopping: the shutdown removes the socket)."""
        if self.stop_reason is None:
            self.exit_code = 1
        self.request_stop(reason)


def main(argv=None, simulated=None, started_by: Optional[int] = None) -> int:
    """`simulated`: a tool's factory `(turns) -> engine` standing in for the
    relay (no hello). `started_by`: the parent's pid as __main__ read it."""
    native.unblock()
    parser = argparse.ArgumentParser(prog="lich-mod-daemon", description="The lich mod-control client for one session.")
    # Only recorded, for the status document: the bridge is the same in both.
    parser.add_argument("--host", choices=("claude-code", "opencode"), default="claude-code", help="the program the relay runs in (default: claude-code)")
    parser.add_argument("--version", action="version", version=__version__)
    args = parser.parse_args(argv)
    try:
        config = Config.from_env(os.environ)
        parent = expected_parent(os.environ, native.started_by() if started_by is None else started_by)
    except NotInLich:
        return 0  # outside lich: never poll, say nothing
    except BadConfig as exc:
        return _refused(exc)
    return run(config, parent, None if simulated else args.host, simulated)


def run(config: Config, parent: Optional[int], host: Optional[str] = None, simulated=None) -> int:
    """The daemon's one way through: what it opens, the ExitStack closes
    however it ends; a refusal is one line and exit 2 (75: the lock is held)."""
    turns = Turns()
    socket_path = config.path(ADDRESS)
    listener = listener_at(socket_path)
    redactor = Redactor(config.token, listener.secret)  # the log's and the status document's alike
    activity = Activity(
        config.session_id, "sim" if simulated else "relay", turns,
        files={"socket": socket_path, "log_file": config.path("log")}, host=host,
        redactor=redactor, stderr_dropped=lambda: logs.stderr.dropped,
    )

    if simulated:
        engine = simulated(turns)
        routes = Routes(_no_relay, _no_relay, activity.snapshot)
    else:
        # Bound late: the bridge needs it before the daemon exists.
        engine = Bridge(sys.stdout.buffer, turns, on_broken=lambda reason: daemon.request_stop(reason))
        routes = Routes(engine.result, engine.event, activity.snapshot)
    daemon = Daemon(config, engine, turns, activity)

    with contextlib.ExitStack() as held:
        try:
            run_folder.ensure(config.run_dir)
            logs = Logs(redactor, os.environ.get("LICH_CONTROL_LOG_LEVEL"), config.path("log"))
            held.callback(logs.close)
            held.enter_context(run_folder.session_lock(config.path("lock"), config.session_id, lock_wait(os.environ)))
            # Once the lock is ours (one waiting for it dies of a SIGTERM at
            # once): from here a signal only records a stop.
            catch_signals(daemon)
            server = held.enter_context(BridgeServer(listener, routes))
        except BadConfig as exc:
            return _refused(exc)
        except run_folder.LockHeld as exc:
            return _refused(exc, LOCK_HELD)
        held.callback(lambda: log.info("stopped: %s", daemon.stop_reason))

        watch = native.Lifeline(parent, daemon.request_stop, os.path.dirname(socket_path), server.removed, on_lost=daemon.crashed)
        if not simulated:
            engine.hello(listener.address.hello())
        watch.start()
        daemon.start()
        daemon.wait()
        native.arm_exit_deadline(EXIT_DEADLINE)
        daemon.shutdown()
    # Threads still parked (a fork that will never answer, a lock waiter)
    # must not hold the exit: everything worth finishing has finished.
    os._exit(daemon.exit_code)


def catch_signals(daemon: Daemon) -> None:
    """Each of our signals only records why the daemon stops, and wakes the main thread."""
    signal.set_wakeup_fd(daemon.wake_fd, warn_on_full_buffer=False)
    for sig in native.STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: daemon.request_stop(f"got {signal.Signals(signum).name}"))


def _refused(exc: Exception, code: int = REFUSED) -> int:
    """A start the daemon refuses: its one line, and `code`."""
    try:
        print(f"lich-control: {escape(str(exc), 1000)}", file=sys.stderr, flush=True)
    except OSError:
        pass  # a stderr that takes nothing: the exit code says it
    return code


def _no_relay(doc) -> None:
    log.info("a relay message reached a daemon on the simulated session; ignored")
