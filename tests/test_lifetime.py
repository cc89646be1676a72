"""How a daemon ends: signals, the parent going away, and a second daemon for the session.

Each exit is observed from outside: the process's exit status, EOF on a pipe
only the daemon still holds, its socket gone, and no poll after it ended.
"""
import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from lich_dev import procs
from lich_dev.lich import NotPolling

EXIT_WITHIN = 2.0
WAIT = 10.0
ROOT = procs.ROOT


def env_for(daemon_env, **extra):
    return procs.daemon_env(**daemon_env, **extra)


def parked(lich):
    """Wait until the daemon holds a poll at lich."""
    assert lich.wait_polled("s1", WAIT, parked=True)


def read_until_eof(fd, timeout):
    """Everything on fd until EOF; raises if EOF does not come in time."""
    deadline = time.monotonic() + timeout
    data = b""
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([fd], [], [], max(0.0, left))
        if not ready:
            raise AssertionError(f"no EOF within {timeout} s; read so far: {data!r}")
        chunk = os.read(fd, 65536)
        if not chunk:
            return data
        data += chunk


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_polling_removes_the_socket_and_exits_0(relay, lich, sig):
    r = relay()
    socket_path = r.wait_hello()["socket"]
    parked(lich)
    began = time.monotonic()
    r.proc.send_signal(sig)
    assert r.wait_exit(5) == 0
    assert time.monotonic() - began < EXIT_WITHIN  # the parked poll was cut, not drained
    assert not os.path.exists(socket_path)
    assert len(lich.record.polls) == 1


def test_an_ack_already_being_sent_finishes_within_the_grace(relay, lich):
    r = relay()
    r.wait_hello()
    parked(lich)
    lich.faults.hold_acks()
    lich.queue("s1", {"id": "m12", "kind": "rewind"})
    lich.record.wait_acks(1)
    r.proc.send_signal(signal.SIGTERM)
    lich.faults.release_acks()
    assert r.wait_exit(5) == 0
    assert [(a.id, a.answer) for a in lich.record.acks] == [("m12", 204)]


def test_closing_stdin_is_the_parent_going_away(relay, lich):
    r = relay()
    socket_path = r.wait_hello()["socket"]
    parked(lich)
    r.proc.stdin.close()
    assert r.wait_exit(EXIT_WITHIN) == 0
    assert not os.path.exists(socket_path)


def test_closing_the_read_end_of_stdout_stops_the_daemon(daemon_env, lich):
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "lich_control.daemon"], cwd=ROOT, env=env_for(daemon_env), stdin=subprocess.DEVNULL, stdout=write_fd, stderr=subprocess.DEVNULL)
    os.close(write_fd)
    try:
        hello = json.loads(os.read(read_fd, 65536))
        parked(lich)
        os.close(read_fd)
        assert proc.wait(EXIT_WITHIN) == 0
        assert not os.path.exists(hello["socket"])
    finally:
        procs.stop(proc)


PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-m", "lich_control.daemon"], stdin=subprocess.DEVNULL, stdout=int(sys.argv[1]), pass_fds=[int(sys.argv[1])])
print(child.pid, flush=True)
sys.stdin.read()
"""


def test_a_daemon_whose_parent_is_killed_exits_within_2_s_and_polls_no_more(daemon_env, lich):
    # The daemon's stdin is /dev/null and the test holds its stdout open:
    # only the parent's death can tell it the session is gone.
    read_fd, write_fd = os.pipe()
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(write_fd)], cwd=ROOT, env=env_for(daemon_env), stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=[write_fd])
    daemon_pid = int(parent.stdout.readline())
    os.close(write_fd)
    hello = json.loads(os.read(read_fd, 65536))
    assert hello["pid"] == daemon_pid
    parked(lich)
    parent.kill()
    parent.wait(5)
    killed = time.monotonic()
    read_until_eof(read_fd, EXIT_WITHIN)  # EOF: the daemon has exited
    assert time.monotonic() - killed < EXIT_WITHIN
    os.close(read_fd)
    assert not os.path.exists(hello["socket"])
    # EOF: the daemon is gone, and lich saw its held poll hang up with it:
    # there is no mod left to take a command.
    assert lich.wait_until("s1", lambda info: info.hung_up and not info.parked, WAIT)
    with pytest.raises(NotPolling, match="hung up its last poll"):
        lich.queue("s1", {"id": "m12", "kind": "rewind"})
    assert lich.polled("s1").polls == 1 and lich.record.acks == []
    parent.stdin.close()
    parent.stdout.close()


def test_a_second_daemon_for_the_session_gives_up_with_one_clear_line(relay, lich, daemon_env):
    first = relay()
    first.wait_hello()
    parked(lich)
    second = subprocess.run([sys.executable, "-m", "lich_control.daemon"], cwd=ROOT, env=env_for(daemon_env, LICH_CONTROL_LOCK_WAIT="0.5"), stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    assert second.returncode == 1 and second.stdout == b""
    lines = second.stderr.decode().splitlines()
    assert lines == ["lich-control: another daemon is still polling for session s1; exiting"]
    assert len(lich.record.polls) == 1  # only the first one ever polled
    assert first.proc.poll() is None and first.status()["daemon"]["pid"] == first.proc.pid


def test_a_second_daemon_takes_over_once_the_first_has_gone(relay, lich):
    first = relay()
    first.wait_hello()
    parked(lich)
    second = relay(env={"LICH_CONTROL_LOCK_WAIT": "20"})
    polls_before = len(lich.record.polls)
    first.proc.terminate()
    assert first.wait_exit(5) == 0
    hello = second.wait_hello()  # only now: it waited for the lock
    assert hello["pid"] == second.proc.pid
    lich.record.wait_polls(polls_before + 1)
    assert second.status()["daemon"]["pid"] == second.proc.pid


PARENT_THREAD = """
import subprocess, sys, threading
box, go = {}, threading.Event()
def spawn():
    box["child"] = subprocess.Popen([sys.executable, "-m", "lich_control.daemon"], stdin=subprocess.DEVNULL, stdout=int(sys.argv[1]), pass_fds=[int(sys.argv[1])])
    print(box["child"].pid, flush=True)
    go.wait()
thread = threading.Thread(target=spawn)
thread.start()
sys.stdin.readline()
go.set()
thread.join()  # the spawning thread is gone; the process lives on
print("thread gone", flush=True)
sys.stdin.read()
"""


def test_the_exit_of_the_thread_that_spawned_the_daemon_is_not_the_parent_dying(daemon_env, lich):
    read_fd, write_fd = os.pipe()
    parent = subprocess.Popen([sys.executable, "-c", PARENT_THREAD, str(write_fd)], cwd=ROOT, env=env_for(daemon_env), stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=[write_fd])
    try:
        int(parent.stdout.readline())
        os.close(write_fd)
        json.loads(os.read(read_fd, 65536))  # hello: the daemon has asked for the death signal
        parked(lich)
        parent.stdin.write(b"go\n")
        parent.stdin.flush()
        assert parent.stdout.readline() == b"thread gone\n"
        lich.queue("s1", {"id": "m12", "kind": "rewind"})
        assert lich.record.ack_for("m12")["error"] == "unknown kind"  # still alive and working
        parent.kill()
        parent.wait(5)
        killed = time.monotonic()
        read_until_eof(read_fd, EXIT_WITHIN)
        assert time.monotonic() - killed < EXIT_WITHIN
    finally:
        os.close(read_fd)
        parent.stdin.close()
        parent.stdout.close()


def test_a_stdin_closed_from_the_start_is_not_taken_for_the_parent_leaving(daemon_env, lich):
    read_fd, write_fd = os.pipe()
    os.close(write_fd)  # the spawn gave the daemon a pipe with nothing behind it
    proc = subprocess.Popen([sys.executable, "-m", "lich_control.daemon"], cwd=ROOT, env=env_for(daemon_env), stdin=read_fd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    os.close(read_fd)
    try:
        json.loads(proc.stdout.readline())  # hello
        parked(lich)
        lich.queue("s1", {"id": "m12", "kind": "rewind"})
        assert lich.record.ack_for("m12")["error"] == "unknown kind"
        assert proc.poll() is None
    finally:
        procs.stop(proc)
        proc.stdout.close()
