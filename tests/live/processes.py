"""The processes of a live test: looking at another process's state until
it holds, watching every process the test started (and what they started)
with its argv, and ending whatever is left.
"""
from __future__ import annotations

import os
import select
import signal
import threading
import time
from typing import Callable, Collection, Dict, List, Optional

import attrs

POLL_INTERVAL = 0.1  # between two looks at state another process owns
ENDED = ("Z", "X")  # /proc/PID/stat's states of a process that has ended: zombie, dead


def wait_until(look: Callable[[], object], timeout: float, what: str, holds: Callable[[object], object] = bool,
               explain: Optional[Callable[[object], str]] = None, interval: float = POLL_INTERVAL):
    """Look at another process's state until `holds(look())`; what it saw.
    On failure, `explain(last)` says what the last look saw.

    Only for state no event reaches us from (a file, a status document):
    each look is a real observation, and the deadline fails the test."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        last = look()
        if holds(last):
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s" + (f"; {explain(last)}" if explain else ""))
        pause.wait(interval)


class Closing:
    """`with` closes it on the way out."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@attrs.frozen
class Seen:
    """One process as the watch saw it."""

    pid: int
    start: int  # its start time in clock ticks: with the pid, who it is
    argv: tuple


class ProcessWatch:
    """Every process the test started, and everything they started: by
    session id, so a daemon whose parent died is still ours. Records each
    one's argv while it runs, and ends whatever is left at the end.

    Threads: owns one (`process-watch`) that looks at /proc every
    POLL_INTERVAL; `seen` and `sessions` sit behind its lock.
    """

    def __init__(self):
        self._lock = threading.Lock()
        # Each watched session id, with its leader's start time: the kernel
        # gives a session's id to a new process only once the session has no
        # process left, so a leader of that pid with another start time is a
        # stranger's session, which the watch must neither record nor kill.
        self._sessions: Dict[int, Optional[int]] = {}
        self._seen: Dict[tuple, Seen] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="process-watch", daemon=True)

    def __enter__(self) -> "ProcessWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def track(self, pid: int) -> None:
        """Watch the session `pid` leads (a process started with a session of its own)."""
        with self._lock:
            self._sessions[pid] = _start_time(pid)
        self.look()

    @property
    def seen(self) -> List[Seen]:
        with self._lock:
            return list(self._seen.values())

    def alive(self) -> List[Seen]:
        """The watched processes running now (a zombie, or one dead and not yet gone from /proc, has ended)."""
        return [Seen(pid, start, argv) for pid, state, start, argv in self._ours(_processes()) if state not in ENDED]

    def wait_ended(self, what: str, timeout: float, but: Collection[int] = ()) -> None:
        """Wait until no watched process runs but those in `but`. One that is
        ending runs for a moment more with its argv already empty, before it
        turns a zombie: a look then is no verdict, only the deadline is."""
        wait_until(lambda: [p for p in self.alive() if p.pid not in but], timeout, what,
                   holds=lambda left: not left, explain=lambda left: f"still running: {left}")

    def look(self) -> None:
        for pid, state, start, argv in self._ours(_processes()):
            with self._lock:
                self._seen.setdefault((pid, start, argv), Seen(pid, start, argv))

    def close(self) -> None:
        """Stop watching, and SIGKILL whatever of ours still runs."""
        self._stop.set()
        self._thread.join(timeout=5)
        for _ in range(3):
            left = self.alive()
            if not left:
                return
            for proc in left:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.wait_ended("the processes of the live test to end", timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(POLL_INTERVAL):
            self.look()

    def _ours(self, table):
        """The rows of our sessions, and of anything our processes started
        in a session of its own (whose session then becomes ours too)."""
        with self._lock:
            sessions = self._sessions
            for pid, _, _, sid, start, _ in table:
                if pid == sid and sessions.get(sid) not in (None, start):
                    del sessions[sid]  # ours ended, and its id went to a stranger
            ours = {row[0] for row in table if row[3] in sessions}
            grew = True
            while grew:
                grew = False
                for pid, _, ppid, sid, start, _ in table:
                    if ppid in ours and pid not in ours:
                        ours.add(pid)
                        if sid not in sessions:
                            sessions[sid] = start if pid == sid else None
                        grew = True
        return [(pid, state, start, argv) for pid, state, _, _, start, argv in table if pid in ours]


def _processes():
    """(pid, state, parent pid, session id, start time, argv) of every process on the machine."""
    table = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            argv = tuple(argv_of(int(name)))
        except OSError:
            continue  # gone meanwhile
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        fields = stat[stat.rindex(")") + 2:].split()
        table.append((int(name), fields[0], int(fields[1]), int(fields[3]), int(fields[19]), argv))
    return table


def _start_time(pid: int) -> Optional[int]:
    """A process's start time in clock ticks; None once it has ended."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2:].split()[19])


def argv_of(pid: int) -> List[str]:
    """A running process's argv."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [arg.decode("utf-8", "replace") for arg in f.read().split(b"\0") if arg]


def pid_ended(pid: int, timeout: float) -> bool:
    """Wait up to `timeout` s for a process (not necessarily our child) to end."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        ready, _, _ = select.select([fd], [], [], timeout)
        return bool(ready)
    finally:
        os.close(fd)
