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

from relay import ROOT

EXIT_WITHIN = 2.0


def env_for(daemon_env, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LICH_")}
    env.update(daemon_env, PYTHONPATH=ROOT, **extra)
    return env


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
    lich.wait_parked()
    began = time.monotonic()
    r.proc.send_signal(sig)
    assert r.wait_exit(5) == 0
    assert time.monotonic() - began < EXIT_WITHIN  # the parked poll was cut, not drained
    assert not os.path.exists(socket_path)
    assert len(lich.polls) == 1


def test_an_ack_already_being_sent_finishes_within_the_grace(relay, lich):
    r = relay()
    r.wait_hello()
    lich.wait_parked()
    lich.ack_gate.clear()
    lich.send({"id": "m12", "kind": "rewind"})
    lich.wait_for(lambda: lich.acks_arrived == 1, what="the ack to arrive")
    r.proc.send_signal(signal.SIGTERM)
    lich.ack_gate.set()
    assert r.wait_exit(5) == 0
    assert [b["id"] for b in lich.ack_bodies()] == ["m12"]


def test_closing_stdin_is_the_parent_going_away(relay, lich):
    r = relay()
    socket_path = r.wait_hello()["socket"]
    lich.wait_parked()
    r.proc.stdin.close()
    assert r.wait_exit(EXIT_WITHIN) == 0
    assert not os.path.exists(socket_path)


def test_closing_the_read_end_of_stdout_stops_the_daemon(daemon_env, lich):
    read_fd, write_fd = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "lich_control.daemon"], cwd=ROOT, env=env_for(daemon_env), stdin=subprocess.DEVNULL, stdout=write_fd, stderr=subprocess.DEVNULL)
    os.close(write_fd)
    try:
        hello = json.loads(os.read(read_fd, 65536))
        lich.wait_parked()
        os.close(read_fd)
        assert proc.wait(EXIT_WITHIN) == 0
        assert not os.path.exists(hello["socket"])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


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
    lich.wait_parked()
    parent.kill()
    parent.wait(5)
    killed = time.monotonic()
    read_until_eof(read_fd, EXIT_WITHIN)  # EOF: the daemon has exited
    assert time.monotonic() - killed < EXIT_WITHIN
    os.close(read_fd)
    assert not os.path.exists(hello["socket"])
    polls = len(lich.polls)
    lich.send({"id": "m12", "kind": "rewind"})  # nobody must take this
    with pytest.raises(AssertionError):
        lich.wait_polls(polls + 1, timeout=1.0)
    assert lich.acks == []
    parent.stdin.close()
    parent.stdout.close()


def test_a_second_daemon_for_the_session_gives_up_with_one_clear_line(relay, lich, daemon_env):
    first = relay()
    first.wait_hello()
    lich.wait_parked()
    second = subprocess.run([sys.executable, "-m", "lich_control.daemon"], cwd=ROOT, env=env_for(daemon_env, LICH_CONTROL_LOCK_WAIT="0.5"), stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    assert second.returncode == 1 and second.stdout == b""
    lines = second.stderr.decode().splitlines()
    assert lines == ["lich-control: another daemon is still polling for session s1; exiting"]
    assert len(lich.polls) == 1  # only the first one ever polled
    assert first.proc.poll() is None and first.status()["daemon"]["pid"] == first.proc.pid


def test_a_second_daemon_takes_over_once_the_first_has_gone(relay, lich):
    first = relay()
    first.wait_hello()
    lich.wait_parked()
    second = relay(env={"LICH_CONTROL_LOCK_WAIT": "20"})
    polls_before = len(lich.polls)
    first.proc.terminate()
    assert first.wait_exit(5) == 0
    hello = second.wait_hello()  # only now: it waited for the lock
    assert hello["pid"] == second.proc.pid
    lich.wait_polls(polls_before + 1)
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
        lich.wait_parked()
        parent.stdin.write(b"go\n")
        parent.stdin.flush()
        assert parent.stdout.readline() == b"thread gone\n"
        lich.send({"id": "m12", "kind": "rewind"})
        assert lich.ack_for("m12")["error"] == "unknown kind"  # still alive and working
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
        lich.wait_parked()
        lich.send({"id": "m12", "kind": "rewind"})
        assert lich.ack_for("m12")["error"] == "unknown kind"
        assert proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(5)
        proc.stdout.close()
