"""The daemon: the gate, the threads wired together, and the way out.

    python -m lich_control.daemon [--host claude-code|opencode]

A tool that simulates a session runs the same daemon with its own engine:
`main(simulated=factory)` (the checkout's `python -m lich_dev.sim`). The
daemon imports no tool.

The threads and what each owns: docs/architecture.md.
"""
import gc
import os

# The imports below are most of the start (docs/performance.md), and what
# they build lives as long as the process: run as the daemon, the collector
# is off while they load, and their objects are then left out of every
# collection (gc.freeze), not walked again at the first ones.
AS_DAEMON = __name__ == "__main__"
if AS_DAEMON:
    gc.disable()

# Read before the imports below, which take most of the start: a parent that
# dies while they run leaves us a reaper's pid, and this one to compare with.
# A spawner that names itself (LICH_CONTROL_PARENT_PID) closes the window
# before it too. Never asked on Windows: the relay names itself there, and
# under Wine os.getppid aborts the process (3.12 and later).
STARTED_BY = None if os.name == "nt" else os.getppid()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import ctypes  # noqa: E402
import logging  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import stat  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from typing import Callable, Optional  # noqa: E402

from . import __version__, run_folder  # noqa: E402
from .acks import Acks  # noqa: E402
from .activity import Activity  # noqa: E402
from .bridge import Bridge, Turns  # noqa: E402
from .config import ADDRESS, WINDOWS, BadConfig, Config, NotInLich, expected_parent, lock_wait  # noqa: E402
from .lich import LichClient  # noqa: E402
from .logs import Logs, Redactor, escape  # noqa: E402
from .poller import Poller  # noqa: E402
from .bridge_server import BridgeServer, Routes, listener_at  # noqa: E402
from .worker import Asks, Worker  # noqa: E402

if AS_DAEMON:
    gc.freeze()
    gc.enable()

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
# Windows has none: its Lifeline waits on the parent's process handle.
PARENT_DEATH_SIGNAL = getattr(signal, "SIGUSR2", None)
# Those this system has (Windows: SIGBREAK is Ctrl-Break, and no SIGHUP).
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGHUP", "SIGBREAK") if hasattr(signal, name))
# A parent may pass these down blocked; blocked, none of them would ever end the daemon.
OUR_SIGNALS = {*STOP_SIGNALS, getattr(signal, "SIGALRM", None), PARENT_DEATH_SIGNAL} - {None}
PR_SET_PDEATHSIG = 1
PARENT_CHECK_SECONDS = 1.0
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x40, 0x80, 0x100, 0x200, 0x400, 0x800  # <sys/inotify.h>
# The exit code of a daemon the Windows deadline ended (POSIX: killed by SIGALRM).
EXIT_DEADLINE_CODE = 3
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
        # lock: a signal that lands just before a lock wait begins runs its
        # handler only once the wait ends, which is never. The interpreter
        # writes each signal's number here (set_wakeup_fd), request_stop a
        # byte. Sockets, not a pipe: Windows selects and wakes on sockets only.
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
        """Start polling, unless a stop was asked for already (the relay
        gone at the hello, a signal, the parent found gone)."""
        if self.stop_reason is not None:
            return
        self._started = True
        self.poller.start()
        log.info("polling lich on port %d for session %s", self.config.port, self.config.session_id)

    def request_stop(self, reason: str) -> None:
        """Any thread, or a signal handler: record why, and wake the main
        thread, which does the stopping."""
        if self.stop_reason is None:
            self.stop_reason = reason
        try:
            self._wake_w.send(b"s")
        except BlockingIOError:
            pass  # full of wake-ups already

    def wait(self) -> None:
        """The main thread's sleep until a stop is asked for; a signal's
        handler runs as select returns."""
        while self.stop_reason is None:
            select.select([self._wake_r], [], [])
            self._wake_r.recv(512)

    def shutdown(self, grace: float = STOP_GRACE) -> None:
        """Stop polling first (a parked poll is cut, never left to take
        commands nobody will apply), and start nothing new; then fail every
        call still waiting on the session, so that its command is acked with
        why, and let the work under way finish within `grace`. A thread
        that overran it is said in the log. Threads never started are left alone."""
        log.info("stopping: %s", self.stop_reason)
        deadline = time.monotonic() + grace  # one budget for all, so the exit stays within 2 s

        def within_grace(name: str, stop: Callable[[float], bool]) -> None:
            if not stop(max(0.0, deadline - time.monotonic())):
                log.warning("%s did not stop within the %g s grace; the exit cuts it short", name, grace)

        if self._started:
            within_grace("the poller", self.poller.stop)
            # From here nothing new starts: what is still queued is acked
            # as never applied, in the grace.
            self.worker.stop(0, self.stop_reason)
            self.asks.stop(0, self.stop_reason)
        # Every call still waiting on the session fails now, so that its
        # command is acked with why (the acks thread sends it in the grace).
        self.engine.close(f"the daemon stopped before the session answered ({self.stop_reason})")
        if self._started:
            for name, stop in (("the worker", self.worker.stop), ("the asks", self.asks.stop), ("the acks", self.acks.stop)):
                within_grace(name, stop)

    def crashed(self, reason: str) -> None:
        """Stop with exit 1: the relay starts another daemon (not once stopping: the shutdown removes the socket)."""
        if self.stop_reason is None:
            self.exit_code = 1
        self.request_stop(reason)


def main(argv=None, simulated=None) -> int:
    """`simulated`, given by a tool: a factory `(turns) -> engine` that
    stands in for the relay (no hello, nothing on stdout)."""
    if hasattr(signal, "pthread_sigmask"):  # no signal masks on Windows
        signal.pthread_sigmask(signal.SIG_UNBLOCK, OUR_SIGNALS)  # before any thread, which inherits the mask
    parser = argparse.ArgumentParser(prog="lich-mod-daemon", description="The lich mod-control client for one session.")
    # Only recorded, for the status document: the bridge is the same in both.
    parser.add_argument("--host", choices=("claude-code", "opencode"), default="claude-code", help="the program the relay runs in (default: claude-code)")
    parser.add_argument("--version", action="version", version=__version__)
    args = parser.parse_args(argv)
    try:
        config = Config.from_env(os.environ)
        parent = expected_parent(os.environ, STARTED_BY)
    except NotInLich:
        return 0  # outside lich: never poll, say nothing
    except BadConfig as exc:
        return _refused(exc)
    return run(config, parent, None if simulated else args.host, simulated)


def run(config: Config, parent: Optional[int], host: Optional[str] = None, simulated=None) -> int:
    """The daemon's one way through: what it opens is closed by the
    ExitStack in the reverse order, however it ends; every refusal is one
    line and exit 2."""
    turns = Turns()
    socket_path = config.path(ADDRESS)
    listener = listener_at(socket_path)
    activity = Activity(
        config.session_id, "sim" if simulated else "relay", turns,
        files={"socket": socket_path, "log_file": config.path("log")}, host=host,
        redactor=Redactor(config.token, listener.secret), stderr_dropped=lambda: logs.stderr.dropped,
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
            logs = Logs(config.token, os.environ.get("LICH_CONTROL_LOG_LEVEL"), config.path("log"), listener.secret)
            held.callback(logs.close)
            held.enter_context(run_folder.session_lock(config.path("lock"), config.session_id, lock_wait(os.environ)))
            # Once the lock is ours (a daemon waiting for it still dies of
            # a SIGTERM at once), before the socket: from here a signal only
            # records a stop, and the way out below takes it.
            catch_signals(daemon, parent)
            server = held.enter_context(BridgeServer(listener, routes))
        except BadConfig as exc:
            return _refused(exc)
        except run_folder.LockHeld as exc:
            return _refused(exc, LOCK_HELD)
        held.callback(lambda: log.info("stopped: %s", daemon.stop_reason))

        watch = lifeline(parent, daemon.request_stop, server, on_lost=daemon.crashed)
        if not simulated:
            engine.hello(listener.address.hello())
        watch.start()
        daemon.start()
        daemon.wait()
        arm_exit_deadline(EXIT_DEADLINE)
        daemon.shutdown()
    # Threads still parked (a fork that will never answer, a lock waiter)
    # must not hold the exit: everything worth finishing has finished.
    os._exit(daemon.exit_code)


def catch_signals(daemon: Daemon, parent: int) -> None:
    """Each of our signals only records why the daemon stops, and wakes the main thread."""
    signal.set_wakeup_fd(daemon.wake_fd, warn_on_full_buffer=False)
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: daemon.request_stop(f"got {signal.Signals(signum).name}"))
    if PARENT_DEATH_SIGNAL is None:
        return

    def parent_died(signum, frame) -> None:
        # Linux sends this when the *thread* that started us exits, too: only
        # a changed parent pid means the session is gone.
        if os.getppid() != parent:
            daemon.request_stop("the process that started the daemon is gone")

    signal.signal(PARENT_DEATH_SIGNAL, parent_died)


def arm_exit_deadline(seconds: float) -> None:
    """End the process `seconds` from now, whatever its threads are doing.

    SIGALRM at its default action is carried out by the kernel: no Python
    code, no lock, no interpreter needed. Set to the default here, since a
    parent may have passed it down ignored. Windows has no SIGALRM: there a
    timer thread calls os._exit, which needs the interpreter lock for a
    moment; C code holding it past the deadline holds the exit too."""
    if not hasattr(signal, "setitimer"):
        timer = threading.Timer(seconds, os._exit, (EXIT_DEADLINE_CODE,))
        timer.daemon = True
        timer.start()
        return
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _refused(exc: Exception, code: int = REFUSED) -> int:
    """A start the daemon refuses: its one line, and `code`."""
    try:
        print(f"lich-control: {escape(str(exc), 1000)}", file=sys.stderr, flush=True)
    except OSError:
        pass  # a stderr that takes nothing: the exit code says it
    return code


def _no_relay(doc) -> None:
    log.info("a relay message reached a daemon on the simulated session; ignored")


# -- the parent ---------------------------------------------------------------


def lifeline(parent: Optional[int], on_gone: Callable[[str], None], server: BridgeServer, on_lost: Callable[[str], None]):
    """The platform's watch on the parent and the daemon's address."""
    if WINDOWS:
        return WindowsLifeline(parent, on_gone, server, on_lost)
    return Lifeline(parent, on_gone, set_parent_death_signal(PARENT_DEATH_SIGNAL), server, on_lost)


class WindowsLifeline:
    """Calls `on_gone` once when the parent (the pid the relay named) ends,
    seen by waiting on its process handle, or `on_lost` once the address
    file is removed, looked for once a second. Windows only: no
    parent-death signal, no inotify, and a spawn's stdin is closed from the
    start, so it tells nothing. Without a named parent only the file is watched."""

    def __init__(self, parent_pid: Optional[int], on_gone: Callable[[str], None], server: BridgeServer, on_lost: Callable[[str], None]):
        from . import windows

        self._parent = windows.Process(parent_pid) if parent_pid is not None else None
        self._on_gone, self._on_lost = on_gone, on_lost
        self._server = server
        self._thread = threading.Thread(target=self._run, name="lich-lifeline", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            if self._parent is not None and self._parent.ended(PARENT_CHECK_SECONDS):
                return self._on_gone("the process that started the daemon is gone")
            if self._parent is None:
                time.sleep(PARENT_CHECK_SECONDS)  # the file alone: nothing to wait on
            if self._server.removed():
                return self._on_lost("its address file was removed (the run folder deleted under it?); starting again on a new one")


def set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send `sig` when our parent dies (Linux only), and
    say in the log where it cannot: the parent is then checked once a second."""
    try:
        # The interpreter's own symbols include libc's: no library search.
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0:
            return True
        why = os.strerror(ctypes.get_errno())
    except (OSError, AttributeError):
        why = "no prctl on this system"
    log.info("no parent-death signal here (%s): the daemon checks its parent once a second", why)
    return False


class Lifeline:
    """Calls `on_gone` once when the parent dies or closes our stdin or
    stdout, or `on_lost` once the socket the hello named is removed or
    another put in its place (the run folder deleted under the daemon:
    systemd-logind removes $XDG_RUNTIME_DIR at the user's last logout).

    Its thread blocks in poll() on the pipes and an inotify watch of the run
    folder; the parent's death is Linux's parent-death signal's. Only where
    either is missing does it also wake once a second, to look."""

    def __init__(self, parent_pid: int, on_gone: Callable[[str], None], has_death_signal: bool, server: BridgeServer, on_lost: Callable[[str], None]):
        self._parent_pid = parent_pid
        self._on_gone, self._on_lost = on_gone, on_lost
        self._server = server
        self._watch = watch_folder(os.path.dirname(server.listener.path))
        self._timeout_ms = None if has_death_signal and self._watch is not None else int(PARENT_CHECK_SECONDS * 1000)
        self._thread = threading.Thread(target=self._run, name="lich-lifeline", daemon=True)

    def start(self) -> None:
        # After the death signal is asked for: a parent gone before then is
        # seen here, one gone after it by the signal.
        if os.getppid() != self._parent_pid:
            self._on_gone("the process that started the daemon is gone")
            return
        self._thread.start()

    def _run(self) -> None:
        poller = select.poll()
        # A stdin closed from the start (a spawn given no input) says
        # nothing about the parent; only one closed later does.
        if _is_pipe(0) and not _at_end(0):
            poller.register(0, select.POLLIN)
        if _is_pipe(1):
            poller.register(1, 0)  # POLLHUP and POLLERR are always reported
        if self._watch is not None:
            poller.register(self._watch, select.POLLIN)
        while True:
            ready = poller.poll(self._timeout_ms)
            if os.getppid() != self._parent_pid:
                return self._on_gone("the process that started the daemon is gone")
            for fd, event in ready:
                if fd == self._watch:
                    os.read(fd, 65536)  # a name in the folder changed: ours is looked for below
                elif fd == 1:
                    return self._on_gone("the parent closed its end of the daemon's stdout")
                elif event != select.POLLIN or not os.read(0, 65536):  # the relay sends nothing on stdin: what comes is ignored
                    return self._on_gone("the parent closed the daemon's stdin")
            if self._server.removed():
                return self._on_lost("its socket was removed (the run folder deleted under it?); starting again on a new one")


def watch_folder(folder: str) -> Optional[int]:
    """An inotify descriptor that turns readable when a name in `folder`
    is removed, moved away, or created or moved in (over ours, it replaces
    it), the folder itself removed or moved too, or its file system
    unmounted (Linux); None where there is no inotify."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, AttributeError):
        return None
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(folder), IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF) < 0:
        os.close(fd)
        return None
    return fd


def _at_end(fd: int) -> bool:
    """True when fd is already at its end: hung up, or readable with nothing to read."""
    probe = select.poll()
    probe.register(fd, select.POLLIN)
    ready = probe.poll(0)
    return bool(ready) and (ready[0][1] != select.POLLIN or not os.read(fd, 65536))


def _is_pipe(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


if __name__ == "__main__":
    sys.exit(main())
