"""What the daemon asks of Windows itself, through ctypes: whether a process
still runs, who owns the other end of a loopback connection, a pipe that
never makes a write wait, and a file's lock. Imported only on Windows, except
the TCP table's parsing, which is plain bytes and tested everywhere.

The plugin's setup imports this file by its path, with whatever Python runs
it, before the package is installed: it imports the standard library only,
never the package.
"""
from __future__ import annotations

import ctypes
import os
import socket
import struct
from typing import Iterator, Optional, Tuple

AF_INET = 2
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


# -- a process's end ------------------------------------------------------------


class Process:
    """A handle on a running process that can be waited on; `gone` at once
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
    for _state, local, local_port, remote, remote_port, pid in _rows(table):
        if (local, local_port & 0xFFFF, remote, remote_port & 0xFFFF) == wanted:
            return pid or None
    return None


def _rows(table: bytes) -> Iterator[tuple]:
    (count,) = struct.unpack_from("<I", table)
    count = min(count, (len(table) - 4) // ROW.size)
    for n in range(count):
        yield ROW.unpack_from(table, 4 + n * ROW.size)


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
        error = iphlpapi.GetExtendedTcpTable(buffer, ctypes.byref(size), False, AF_INET, TCP_TABLE_OWNER_PID_CONNECTIONS, 0)
        if error == 0:
            return buffer.raw
        if error != ERROR_INSUFFICIENT_BUFFER:
            break
    raise OSError(error, "GetExtendedTcpTable failed")


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


# -- a pipe that never waits --------------------------------------------------------


def nonblocking_pipe(fd: int, wait: bool = False) -> bool:
    """Put the pipe behind `fd` in PIPE_NOWAIT mode (PIPE_WAIT if `wait`): a
    write then takes what fits and returns. False (left as it is) when `fd`
    is not a pipe."""
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
