"""What the daemon and the plugin's setup ask of Windows itself, under the
names posix.py answers too (docs/architecture.md, "The platform seam: POSIX
and Windows").
Windows' own calls (msvcrt, ctypes' wintypes and DLLs) are made inside the
functions that need them, so that this file imports anywhere and its plain
parts are tested on every system. The setup loads this file by its path
before the package is installed: the standard library only.
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import stat
import struct
import threading
import time
from typing import Callable, Mapping, Optional, Tuple

# No Unix sockets: the bridge listens on loopback TCP behind a per-daemon
# secret, and its address is a file naming port and secret.
BRIDGE = "loopback"
ADDRESS = "address"
USER_KIND = "SID"
PRIVATE = 0o600
PARENT_CHECK_SECONDS = 1.0
# SIGBREAK is Ctrl-Break; there is no SIGHUP. Looked up by name: this file imports on every system.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGINT", "SIGBREAK") if hasattr(signal, name))
# The exit code of a daemon the exit timer ended (POSIX: killed by SIGALRM).
EXIT_DEADLINE_CODE = 3

TCP_TABLE_OWNER_PID_CONNECTIONS = 4
ERROR_INSUFFICIENT_BUFFER = 122
SYNCHRONIZE = 0x00100000
PROCESS_QUERY_LIMITED_INFORMATION = 0x1000
TOKEN_QUERY = 0x0008
TOKEN_USER = 1
WAIT_TIMEOUT = 0x102
PIPE_NOWAIT = 1
FILE_TYPE_PIPE = 3
# MIB_TCPROW_OWNER_PID: state, local address, local port, remote address,
# remote port, owning pid. Addresses and ports in network order, each port
# in the low two bytes of its DWORD.
ROW = struct.Struct("<I4sI4sII")


def _dlls():
    from ctypes import wintypes

    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    advapi32 = ctypes.WinDLL("advapi32", use_last_error=True)
    iphlpapi = ctypes.WinDLL("iphlpapi", use_last_error=True)
    kernel32.OpenProcess.restype = wintypes.HANDLE
    kernel32.OpenProcess.argtypes = [wintypes.DWORD, wintypes.BOOL, wintypes.DWORD]
    kernel32.GetCurrentProcess.restype = wintypes.HANDLE
    kernel32.CloseHandle.argtypes = [wintypes.HANDLE]
    kernel32.WaitForSingleObject.argtypes = [wintypes.HANDLE, wintypes.DWORD]
    kernel32.WaitForSingleObject.restype = wintypes.DWORD
    kernel32.GetFileType.argtypes = [wintypes.HANDLE]
    kernel32.SetNamedPipeHandleState.argtypes = [wintypes.HANDLE, ctypes.POINTER(wintypes.DWORD), ctypes.c_void_p, ctypes.c_void_p]
    advapi32.OpenProcessToken.argtypes = [wintypes.HANDLE, wintypes.DWORD, ctypes.POINTER(wintypes.HANDLE)]
    advapi32.GetTokenInformation.argtypes = [wintypes.HANDLE, ctypes.c_int, ctypes.c_void_p, wintypes.DWORD, ctypes.POINTER(wintypes.DWORD)]
    advapi32.ConvertSidToStringSidW.argtypes = [ctypes.c_void_p, ctypes.POINTER(wintypes.LPWSTR)]
    kernel32.LocalFree.argtypes = [ctypes.c_void_p]
    return kernel32, advapi32, iphlpapi


class Refused(Exception):
    """A file or folder of the daemon's is not what it must be; the text says what."""


# -- the run folder -------------------------------------------------------------
# In the user's profile, whose ACL keeps it theirs; `os.stat` gives no owner
# or mode there (st_uid 0, mode 0777 for all), so neither is checked.


def started_by() -> Optional[int]:
    """Never asked: the relay names itself (LICH_CONTROL_PARENT_PID), and
    under Wine os.getppid aborts the process (3.12 and later)."""
    return None


def run_dir(env: Mapping[str, str]) -> str:
    """Not %TEMP%, which Storage Sense and Disk Cleanup empty."""
    local = env.get("LOCALAPPDATA") or os.path.join(os.path.expanduser("~"), "AppData", "Local")
    return os.path.join(local, "lich-control", "run")


def address_too_long(path: str) -> bool:
    return False  # a file, not a socket: no sun_path to fit in


def check_folder(path: str, created: bool) -> None:
    if os.path.islink(path):
        raise Refused("is a symbolic link")
    if not os.path.isdir(path):
        raise Refused("is not a folder")


def open_private(path: str, flags: int) -> int:
    """A descriptor on the plain file at `path`, never through a link (no
    descriptor is inherited unless asked)."""
    if os.path.islink(path):
        raise Refused("is a symbolic link")
    try:
        fd = os.open(path, flags, PRIVATE)
    except OSError as exc:
        raise Refused(f"cannot be opened ({exc.strerror})") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Refused("is not a plain file of ours")
    return fd


# -- a process's end ------------------------------------------------------------


class Process:
    """A handle on a running process that can be waited on; `ended` at once
    when there is no such process (it ended before we looked)."""

    def __init__(self, pid: int):
        self._kernel32 = _dlls()[0]
        self._handle = self._kernel32.OpenProcess(SYNCHRONIZE, False, pid)

    def ended(self, seconds: float) -> bool:
        """True once the process has ended, waiting at most `seconds` to see it."""
        if not self._handle:
            return True
        return self._kernel32.WaitForSingleObject(self._handle, int(seconds * 1000)) != WAIT_TIMEOUT


# -- who owns lich's end ----------------------------------------------------------


def owner_pid(table: bytes, ours: Tuple[str, int], theirs: Tuple[str, int]) -> Optional[int]:
    """The pid in a TCP_TABLE_OWNER_PID table (GetExtendedTcpTable, IPv4)
    of the connection whose local end is `theirs` and remote end `ours`: the
    socket lich's listener accepted for us. None without such a row, or when
    the row's pid is 0 (Wine never fills it in)."""
    wanted = (socket.inet_aton(theirs[0]), socket.htons(theirs[1]), socket.inet_aton(ours[0]), socket.htons(ours[1]))
    (count,) = struct.unpack_from("<I", table)
    given = min(count, (len(table) - 4) // ROW.size)  # no row past the bytes given
    for _state, local, local_port, remote, remote_port, pid in ROW.iter_unpack(table[4 : 4 + given * ROW.size]):
        if (local, local_port & 0xFFFF, remote, remote_port & 0xFFFF) == wanted:
            return pid or None
    return None


def listener_owner(sock: socket.socket) -> Optional[str]:
    """The SID of the user owning the far end of `sock`, a connected loopback
    IPv4 socket, or None where it cannot be told (no row, pid 0, access refused)."""
    try:
        ours, theirs = sock.getsockname(), sock.getpeername()
        pid = owner_pid(_tcp_table(), ours, theirs)
    except OSError:
        return None
    return process_user(pid) if pid is not None else None


def _tcp_table() -> bytes:
    from ctypes import wintypes

    iphlpapi = _dlls()[2]
    size = wintypes.DWORD(0)
    for _ in range(3):  # the table can grow between the size asked and the copy
        buffer = ctypes.create_string_buffer(max(size.value, 4))
        error = iphlpapi.GetExtendedTcpTable(buffer, ctypes.byref(size), False, socket.AF_INET, TCP_TABLE_OWNER_PID_CONNECTIONS, 0)
        if error == 0:
            return buffer.raw
        if error != ERROR_INSUFFICIENT_BUFFER:
            break
    raise OSError(error, "GetExtendedTcpTable failed")


def our_user() -> Optional[str]:
    """Who lich must run as: our SID (None if Windows will not say)."""
    return process_user()


def process_user(pid: Optional[int] = None) -> Optional[str]:
    """The string SID of the user `pid` runs as (ours for None), or None when Windows refuses to say."""
    from ctypes import wintypes

    kernel32, advapi32, _ = _dlls()
    process = kernel32.GetCurrentProcess() if pid is None else kernel32.OpenProcess(PROCESS_QUERY_LIMITED_INFORMATION, False, pid)
    if not process:
        return None
    token = wintypes.HANDLE()
    try:
        if not advapi32.OpenProcessToken(process, TOKEN_QUERY, ctypes.byref(token)):
            return None
        size = wintypes.DWORD(0)
        advapi32.GetTokenInformation(token, TOKEN_USER, None, 0, ctypes.byref(size))
        info = ctypes.create_string_buffer(size.value)
        if not advapi32.GetTokenInformation(token, TOKEN_USER, info, size, ctypes.byref(size)):
            return None
        sid = ctypes.cast(info, ctypes.POINTER(ctypes.c_void_p))[0]  # TOKEN_USER.User.Sid
        text = wintypes.LPWSTR()
        if not advapi32.ConvertSidToStringSidW(sid, ctypes.byref(text)):
            return None
        try:
            return text.value
        finally:
            kernel32.LocalFree(text)
    finally:
        if token:
            kernel32.CloseHandle(token)
        if pid is not None:
            kernel32.CloseHandle(process)


# -- the parent and the address file -----------------------------------------------


class Lifeline:
    """Calls `on_gone` once the named parent ends (its process handle waited
    on a second at a time), or `on_lost` once `removed()` says the address
    file is gone. No parent-death signal, no inotify, and a spawn's stdin is
    closed from the start, so it tells nothing."""

    def __init__(self, parent_pid: Optional[int], on_gone: Callable[[str], None], folder: str, removed: Callable[[], bool], on_lost: Callable[[str], None]):
        self._parent = Process(parent_pid) if parent_pid is not None else None
        self._on_gone, self._removed, self._on_lost = on_gone, removed, on_lost
        self._thread = threading.Thread(target=self._run, name="lich-lifeline", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while True:
            if self._parent is None:
                time.sleep(PARENT_CHECK_SECONDS)  # the file alone: nothing to wait on
            elif self._parent.ended(PARENT_CHECK_SECONDS):
                return self._on_gone("the process that started the daemon is gone")
            if self._removed():
                return self._on_lost("its address file was removed (the run folder deleted under it?); starting again on a new one")


def unblock() -> None:
    """No signal masks on Windows."""


def arm_exit_deadline(seconds: float) -> None:
    """End the process `seconds` from now. No SIGALRM here: a timer thread
    calls os._exit, which needs the interpreter lock for a moment; C code
    holding it past the deadline holds the exit too."""
    timer = threading.Timer(seconds, os._exit, (EXIT_DEADLINE_CODE,))
    timer.daemon = True
    timer.start()


# -- a pipe that never waits --------------------------------------------------------


def nonblocking(fd: int, wait: bool = False) -> bool:
    """Put the pipe behind `fd` in PIPE_NOWAIT mode (PIPE_WAIT if `wait`): a
    write then takes what fits and returns. The mode is that pipe's alone (a
    spawn gives stdout and stderr a pipe each). False when `fd` is no pipe."""
    import msvcrt
    from ctypes import wintypes

    kernel32 = _dlls()[0]
    try:
        handle = msvcrt.get_osfhandle(fd)
    except OSError:
        return False
    if kernel32.GetFileType(handle) != FILE_TYPE_PIPE:
        return False
    mode = wintypes.DWORD(0 if wait else PIPE_NOWAIT)
    return bool(kernel32.SetNamedPipeHandleState(handle, ctypes.byref(mode), None, None))


# A file's lock: msvcrt's lock of its first byte (LockFile; past the end is
# allowed), which no other process can take, and which Windows releases
# however the process ends. There is no shared lock.


def try_lock(fd: int, shared: bool = False) -> bool:
    """Take the lock on `fd` if no other process holds it: whether it did.
    msvcrt's only refusal of a byte on an open file is that another holds
    it, whatever errno it gives (Wine's is 0)."""
    import msvcrt

    os.lseek(fd, 0, os.SEEK_SET)
    try:
        msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
    except OSError:
        return False
    return True


def wait_lock(fd: int) -> None:
    """Take the lock on `fd`, waiting as long as another holds it."""
    import msvcrt

    while True:
        os.lseek(fd, 0, os.SEEK_SET)
        try:  # LK_LOCK tries once a second for ten seconds, then gives up
            msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
            return
        except OSError:
            continue


def unlock(fd: int) -> None:
    import msvcrt

    os.lseek(fd, 0, os.SEEK_SET)
    msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)
