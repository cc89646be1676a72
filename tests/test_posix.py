"""What the daemon asks of a POSIX system (posix.py): who owns lich's port,
a stderr that never makes a write wait, the exit timer. The lock is
test_run_folder.py's and test_runtime.py's; the lifeline and the parent-death
signal are test_daemon.py's, on a daemon."""
import os
import signal
import socket
import subprocess
import sys

import pytest

from lich_dev import procs

posix = pytest.importorskip("lich_control.posix", reason="POSIX's own calls (Windows': test_windows.py)")

ROOT = procs.ROOT
WAIT = 10


@pytest.mark.parametrize("host, family", [("127.0.0.1", socket.AF_INET), ("0.0.0.0", socket.AF_INET), ("::", socket.AF_INET6)])
def test_the_owner_is_found_whichever_listener_takes_the_connection(host, family):
    if family == socket.AF_INET6 and not socket.has_dualstack_ipv6():
        pytest.skip("no dual-stack IPv6 here")
    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("no /proc/net/tcp: the owner cannot be told here")
    with socket.create_server((host, 0), family=family, dualstack_ipv6=family == socket.AF_INET6) as listener:
        with socket.create_connection(("127.0.0.1", listener.getsockname()[1])) as conn:
            assert posix.listener_owner(conn) == os.getuid()


def test_a_row_in_time_wait_names_no_owner(tmp_path, monkeypatch):
    with socket.create_server(("127.0.0.1", 0)) as listener, socket.create_connection(listener.getsockname()) as conn:
        theirs, ours = posix._row_address(conn.getpeername(), False), posix._row_address(conn.getsockname(), False)
        head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        waiting = f"   0: {theirs} {ours} 06 00000000:00000000 03:00001770 00000000     0        0 0 3 0\n"
        live = f"   1: {theirs} {ours} 01 00000000:00000000 00:00000000 00000000  1234        0 99 1 0\n"
        table = tmp_path / "tcp"
        monkeypatch.setattr(posix, "TCP_TABLES", (str(table),))
        table.write_text(head + waiting)
        assert posix.listener_owner(conn) is None  # the kernel's uid 0 of a TIME_WAIT row is no owner
        table.write_text(head + waiting + live)
        assert posix.listener_owner(conn) == 1234


def test_making_stderr_non_blocking_leaves_a_stdout_that_shares_its_pipe_blocking():
    # O_NONBLOCK belongs to the open file description, which `2>&1` shares:
    # flipped on it, the bridge's writes to stdout would fail when full.
    read_fd, write_fd = os.pipe()
    shared = os.dup(write_fd)  # fd 2 and fd 1 of `2>&1`
    try:
        posix.nonblocking(shared)
        assert os.get_blocking(write_fd)
        assert not os.get_blocking(shared) or not sys.platform.startswith("linux")
    finally:
        for fd in (read_fd, write_fd, shared):
            os.close(fd)


HELD = """
import signal, threading
from lich_control.posix import arm_exit_deadline
signal.signal(signal.SIGALRM, signal.SIG_IGN)  # as a careless parent might pass it down
arm_exit_deadline(0.2)
lock = threading.Lock()
lock.acquire()
lock.acquire()  # held for ever: only the kernel ends this
"""


def test_the_exit_deadline_ends_a_process_whatever_holds_it():
    proc = subprocess.run([sys.executable, "-c", HELD], cwd=ROOT, env=procs.daemon_env(), timeout=WAIT)
    assert proc.returncode == -signal.SIGALRM
