"""What the daemon and the plugin's setup ask of a POSIX system itself,
under the names windows.py answers too (docs/architecture.md, "The platform
seam: POSIX and Windows"). The setup loads this file by its path before the package is
installed: the standard library only. A refusal is `Refused`, which the
package words.
"""
from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import stat
import struct
import threading
from typing import Callable, Mapping, Optional, Tuple

# The bridge is a Unix socket, 0600, in the run folder: the file's mode is the guard.
BRIDGE = "unix"
ADDRESS = "sock"
USER_KIND = "uid"
PRIVATE = 0o600
# Never follow a link; never pass a descriptor to a child.
NO_FOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
# sockaddr_un.sun_path is 108 bytes on Linux, 104 on macOS; keep under both.
MAX_SOCKET_PATH = 100
# Where Linux lists its TCP sockets with their owners.
TCP_TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
# Its own signal, not SIGTERM, so the handler can tell a parent's death from
# the exit of the parent's thread that spawned us (which sends it as well).
PARENT_DEATH_SIGNAL = signal.SIGUSR2
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PR_SET_PDEATHSIG = 1
PARENT_CHECK_SECONDS = 1.0
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE, IN_DELETE_SELF, IN_MOVE_SELF = 0x40, 0x80, 0x100, 0x200, 0x400, 0x800  # <sys/inotify.h>


class Refused(Exception):
    """A file or folder of the daemon's is not what it must be; the text says what."""


# -- the file lock ------------------------------------------------------------


def try_lock(fd: int, shared: bool = False) -> bool:
    """Take flock's lock on `fd` if no other open file holds it: whether it
    did. The kernel releases it however the process ends."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def wait_lock(fd: int) -> None:
    """Take the exclusive lock on `fd`, waiting as long as another holds it."""
    fcntl.flock(fd, fcntl.LOCK_EX)


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)


# -- the run folder -----------------------------------------------------------


def started_by() -> Optional[int]:
    """The parent's pid as the daemon begins, to compare with later."""
    return os.getppid()


def run_dir(env: Mapping[str, str]) -> str:
    """The run folder when LICH_CONTROL_RUN_DIR names none (docs/architecture.md,
    "Files"). A relative XDG_RUNTIME_DIR is invalid (the XDG spec); one that is
    gone (logind removes it at the last logout; only root makes it again) is
    passed over. Not the temporary folder, which lich's macOS profile lets no
    session write: ~/.cache is the same inside and outside, and short enough."""
    xdg = env.get("XDG_RUNTIME_DIR") or ""
    if os.path.isabs(xdg) and os.path.isdir(xdg):
        return os.path.join(xdg, "lich-control")
    home = env.get("HOME") or os.path.expanduser("~")
    return os.path.join(home, ".cache", "lich-control", "run")


def address_too_long(path: str) -> bool:
    return len(os.fsencode(path)) > MAX_SOCKET_PATH


def check_folder(path: str, created: bool) -> None:
    """Refused unless the folder is a real one (not a link), ours, and
    writable by no one else; one just `created` is made 0700."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | NO_FOLLOW)
    except OSError as exc:
        if os.path.islink(path):
            raise Refused("is a symbolic link") from exc
        if exc.errno == errno.ENOTDIR:
            raise Refused("is not a folder") from exc
        raise Refused(f"cannot be used: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise Refused("belongs to another user")
        if created:
            os.fchmod(fd, 0o700)  # the umask may have taken more than group and others' bits, or fewer
        elif info.st_mode & 0o022:
            raise Refused(f"is writable by other users (mode {stat.S_IMODE(info.st_mode):o})")
    finally:
        os.close(fd)


def open_private(path: str, flags: int) -> int:
    """A descriptor on the plain file of ours at `path`, never through a link,
    created 0600 if `flags` say so, else made 0600 through the descriptor."""
    try:
        fd = os.open(path, flags | NO_FOLLOW, PRIVATE)
    except OSError as exc:
        raise Refused("is a symbolic link" if os.path.islink(path) else f"cannot be opened ({exc.strerror})") from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise Refused("is not a plain file of ours")
    if stat.S_IMODE(info.st_mode) != PRIVATE:
        os.fchmod(fd, PRIVATE)
    return fd


# -- who owns lich's end ------------------------------------------------------


def our_user() -> Optional[int]:
    """Who lich must run as: our uid."""
    return os.getuid()


def listener_owner(sock) -> Optional[int]:
    """The uid owning the far end of `sock`, a connected loopback TCP socket
    (while lich is down, any local user can listen on its port), or None
    where it cannot be told (not Linux, /proc unreadable, no row). The socket
    that accepted our connection has its listener's uid and our address as
    its remote end, whichever listener (127.0.0.1, 0.0.0.0, ::) took it."""
    try:
        ours, theirs = sock.getsockname(), sock.getpeername()
    except OSError:
        return None
    # In either table: an IPv4 connection a dual-stack listener took is in tcp6.
    wanted = {(_row_address(theirs, v6), _row_address(ours, v6)) for v6 in (False, True)}
    for table in TCP_TABLES:
        try:
            with open(table, encoding="ascii", errors="replace") as rows:
                next(rows, None)  # the column names
                for row in rows:
                    fields = row.split()
                    # A row in TIME_WAIT (timer 03) has no owner left and shows
                    # uid 0: an earlier connection's, not the one we made.
                    if len(fields) > 7 and (fields[1], fields[2]) in wanted and not fields[5].startswith("03:") and fields[7].isdigit():
                        return int(fields[7])
        except OSError:
            continue
    return None


def _row_address(address: Tuple[str, int], v6: bool) -> str:
    """An IPv4 `address` (the client connects to 127.0.0.1) as the kernel
    prints it in tcp, or in tcp6 as ::ffff:a.b.c.d: the address as 32-bit
    words in the machine's byte order, each in hex, then the port in hex."""
    import ipaddress

    host, port = address
    packed = ipaddress.IPv6Address(f"::ffff:{host}").packed if v6 else ipaddress.IPv4Address(host).packed
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{word:08X}" for word in words) + f":{port:04X}"


# -- stderr -------------------------------------------------------------------


def nonblocking(fd: int) -> None:
    """Make writes to `fd` fail at once rather than wait, without making
    anyone else's writes do so: O_NONBLOCK belongs to the open file
    description, which `2>&1`, a terminal, or a parent's stderr may share.
    On Linux fd gets a description of its own (reopened through /proc);
    elsewhere it is flipped only if stdin and stdout are other files."""
    if stat.S_ISREG(os.fstat(fd).st_mode):
        return  # a file takes every write at once
    try:
        # O_NONBLOCK here too: opening a pipe nobody reads would wait for a reader.
        own = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError:  # a socket (it cannot be reopened), no /proc, or no reader
        if any(_same_file(fd, other) for other in (0, 1)):
            return
    else:
        os.dup2(own, fd)
        os.close(own)
    os.set_blocking(fd, False)


def _same_file(fd: int, other: int) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.fstat(other))
    except OSError:
        return False


# -- signals and the exit -----------------------------------------------------


def unblock() -> None:
    """A parent may pass signals down blocked; blocked, none of ours would
    ever end the daemon. Before any thread, which inherits the mask."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {*STOP_SIGNALS, signal.SIGALRM, PARENT_DEATH_SIGNAL})


def arm_exit_deadline(seconds: float) -> None:
    """End the process `seconds` from now, whatever its threads are doing:
    SIGALRM at its default action (a parent may pass it down ignored) is
    carried out by the kernel, with no Python code, lock or interpreter."""
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, seconds)


# -- the parent and the run folder --------------------------------------------


def parent_death_signal() -> bool:
    """Ask the kernel for PARENT_DEATH_SIGNAL when our parent dies (Linux
    only), or log that the parent is checked once a second instead. Imports
    here: the plugin's setup loads this file for the lock alone."""
    import ctypes
    import logging

    try:
        # The interpreter's own symbols include libc's: no library search.
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0) == 0:
            return True
        why = os.strerror(ctypes.get_errno())
    except (OSError, AttributeError):
        why = "no prctl on this system"
    logging.getLogger("lich_control.daemon").info("no parent-death signal here (%s): the daemon checks its parent once a second", why)
    return False


class Lifeline:
    """Calls `on_gone` once when the parent dies or closes our stdin or
    stdout, or `on_lost` once `removed()` says the hello's socket is gone or
    replaced (docs/architecture.md, "The way out"). Its thread blocks in
    poll() on the pipes and an inotify watch of the run folder, the parent's
    death told by the parent-death signal; only where either is missing does
    it wake once a second to look. Made after the daemon's signal handlers:
    its own records a stop as theirs do, with `on_gone`."""

    def __init__(self, parent_pid: int, on_gone: Callable[[str], None], folder: str, removed: Callable[[], bool], on_lost: Callable[[str], None]):
        self._parent_pid = parent_pid
        self._on_gone, self._removed, self._on_lost = on_gone, removed, on_lost

        def parent_died(signum, frame) -> None:
            # Linux sends this when the *thread* that started us exits, too: only
            # a changed parent pid means the session is gone.
            if os.getppid() != parent_pid:
                on_gone("the process that started the daemon is gone")

        signal.signal(PARENT_DEATH_SIGNAL, parent_died)
        has_death_signal = parent_death_signal()
        self._watch = watch_folder(folder)
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
            if self._removed():
                return self._on_lost("its socket was removed (the run folder deleted under it?); starting again on a new one")


def watch_folder(folder: str) -> Optional[int]:
    """An inotify descriptor readable once a name in `folder` goes or comes
    (one created or moved in over ours replaces it), or the folder itself
    goes or is unmounted (Linux); None where there is no inotify."""
    import ctypes

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
