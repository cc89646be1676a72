"""What the daemon asks Windows: the TCP table's rows read (a table built
here, on every system), and on Windows the calls themselves: our own SID,
a process's end, a pipe that never waits."""
import os
import socket
import struct
import subprocess
import sys

import pytest

from lich_control import windows

on_windows = pytest.mark.skipif(os.name != "nt", reason="calls Windows itself")
LICH, US = ("127.0.0.1", 40001), ("127.0.0.1", 53211)
ESTABLISHED = 5


def table(*rows):
    """A TCP_TABLE_OWNER_PID as GetExtendedTcpTable fills it: a count, then
    rows with addresses and ports in network order, each port in a DWORD."""
    packed = b"".join(
        windows.ROW.pack(ESTABLISHED, socket.inet_aton(local[0]), socket.htons(local[1]), socket.inet_aton(remote[0]), socket.htons(remote[1]), pid)
        for local, remote, pid in rows
    )
    return struct.pack("<I", len(rows)) + packed


def test_the_row_whose_local_end_is_lichs_and_remote_end_ours_names_the_owner():
    rows = table((US, LICH, 11), (LICH, ("127.0.0.1", 53212), 22), (LICH, US, 33))
    assert windows.owner_pid(rows, US, LICH) == 33


def test_no_such_row_or_a_pid_of_0_cannot_be_told():
    assert windows.owner_pid(table((US, LICH, 11)), US, LICH) is None
    assert windows.owner_pid(table((LICH, US, 0)), US, LICH) is None  # Wine never fills it in


def test_a_count_past_the_rows_given_reads_only_those_given():
    rows = table((LICH, US, 33))
    assert windows.owner_pid(struct.pack("<I", 1000) + rows[4:], US, LICH) == 33


@on_windows
def test_our_own_sid_is_told_and_is_a_childs_too():
    ours = windows.process_user()
    assert ours.startswith("S-1-")
    child = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
    try:
        assert windows.process_user(child.pid) == ours
    finally:
        child.communicate(b"\n", timeout=30)


@on_windows
def test_a_process_is_seen_to_end():
    child = subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
    watched = windows.Process(child.pid)
    assert not watched.ended(0)
    child.communicate(b"\n", timeout=30)
    assert watched.ended(10)


@on_windows
def test_a_pipe_made_non_waiting_takes_what_fits_and_never_blocks():
    read_fd, write_fd = os.pipe()
    assert windows.nonblocking(write_fd)
    written = 0
    with pytest.raises(OSError):  # full: a write fails (or takes nothing) at once, never waits
        for _ in range(1000):  # far more than any pipe buffer
            took = os.write(write_fd, b"x" * 4096)
            if took < 4096:
                raise OSError("took only part")
            written += took
    assert written < 4096 * 1000
    os.close(read_fd)
    os.close(write_fd)
