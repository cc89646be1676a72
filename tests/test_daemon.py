"""The daemon from outside: how it starts, what it refuses, and how it ends.

Each exit is observed from outside: the process's exit status, EOF on a pipe
only the daemon still holds, its socket gone, and no poll after it ended.
"""
import contextlib
import ctypes
import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time

import pytest

from lich_control import __version__
from lich_control.bridge_server import read_address
from lich_dev import procs
from lich_dev.lich import NotPolling

from relay import started

EXIT_WITHIN = 2.0
WAIT = 10.0
ROOT = procs.ROOT


WINDOWS = os.name == "nt"
# What cannot apply on Windows, each for its reason.
POSIX_SIGNALS = pytest.mark.skipif(WINDOWS, reason="Windows: a signal sent to another process is TerminateProcess, nothing a daemon can catch (the relay kills its child outright)")
POSIX_STDIN = pytest.mark.skipif(WINDOWS, reason="Windows: the daemon does not watch stdin (a spawn's is closed from the start); it waits on the parent's process handle")
POSIX_FDS = pytest.mark.skipif(WINDOWS, reason="the test hands descriptors to a child with pass_fds, which Windows lacks")
POSIX_DEATH = pytest.mark.skipif(WINDOWS, reason="Linux's parent-death signal and SIGALRM: Windows has neither (its Lifeline and exit timer are threads)")


DAEMON = [sys.executable, "-m", "lich_control"]


def lines(stderr):
    """stderr's lines (Windows' text mode ends each with \\r\\n)."""
    return stderr.decode().splitlines()


def env_for(daemon_env, **extra):
    return procs.daemon_env(**dict(daemon_env, **extra))


@contextlib.contextmanager
def spawned(daemon_env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, **popen):
    """A daemon started with no relay, the test holding its pipes; stopped
    and its pipes closed as the test ends."""
    proc = subprocess.Popen(DAEMON, cwd=ROOT, env=env_for(daemon_env), stdin=stdin, stdout=stdout, stderr=stderr, **popen)
    try:
        yield proc
    finally:
        procs.stop(proc)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream:
                stream.close()


def daemon(daemon_env, **env):
    """A daemon run to its end with no relay: its exit code, stdout and stderr."""
    return subprocess.run(DAEMON, cwd=ROOT, env=env_for(daemon_env, **env), stdin=subprocess.DEVNULL, capture_output=True, timeout=30)


def left_behind(run_dir):
    """What a daemon that ended leaves: its lock file (kept), and nothing else of a session's."""
    return sorted(n for n in os.listdir(run_dir) if not n.endswith((".log", ".lock")))


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


def _block_our_signals():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGALRM, signal.SIGUSR2})


@POSIX_SIGNALS
def test_sigterm_even_blocked_by_the_parent_cuts_the_parked_poll_removes_the_socket_and_exits_0(relay, lich):
    # Blocked in the mask it inherits, SIGTERM, the exit deadline and the
    # parent-death signal would never reach the daemon: it unblocks them first.
    r = relay(preexec_fn=_block_our_signals)
    socket_path = r.wait_hello()["socket"]
    parked(lich)
    began = time.monotonic()
    r.proc.send_signal(signal.SIGTERM)
    assert r.wait_exit(WAIT) == 0
    assert time.monotonic() - began < WAIT  # lich holds a poll 25 s: the parked poll was cut, not drained
    assert not os.path.exists(socket_path)
    assert len(lich.record.polls) == 1


@POSIX_SIGNALS
def test_at_sigterm_a_call_waiting_on_the_session_and_the_command_queued_behind_it_are_each_acked_with_why(relay, lich):
    r = started(relay, lich)
    lich.queue_all("s1", [{"id": "m1", "kind": "model", "model": "claude-opus-4-1"}, {"id": "m2", "kind": "prompt", "text": "next"}])
    assert r.next_call()["method"] == "overrides.set"  # awaited: the prompt waits behind it
    r.proc.send_signal(signal.SIGTERM)
    assert r.wait_exit(WAIT) == 0
    assert lich.record.ack_for("m1", WAIT)["error"] == "the daemon stopped before the session answered (got SIGTERM)"
    assert lich.record.ack_for("m2", WAIT) == {
        "session_id": "s1", "id": "m2", "kind": "prompt", "ok": False, "error": "the daemon stopped before applying it (got SIGTERM)",
    }


@POSIX_SIGNALS
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


def test_a_run_folder_removed_under_the_daemon_ends_it_with_1_and_what_was_in_flight_is_acked_with_why(relay, lich, run_dir):
    # systemd-logind removes $XDG_RUNTIME_DIR at the last logout; lich runs on in tmux.
    r = started(relay, lich)
    lich.queue_all("s1", [{"id": "m1", "kind": "prompt", "text": "run the tests"}, {"id": "a1", "kind": "ask", "question": "what now?"}])
    calls = {r.next_call()["method"], r.next_call()["method"]}
    assert calls == {"prompt.submit", "model.fork"}  # both in flight: the session has not answered
    if WINDOWS:  # the open log and lock keep the folder: its address file goes
        os.remove(os.path.join(run_dir, "s1.address"))
    else:
        shutil.rmtree(run_dir)
    assert r.wait_exit(WAIT) == 1  # not 0: the relay starts another, on a socket that exists
    gone = "its address file" if WINDOWS else "its socket"
    said = f"the daemon stopped before the session answered ({gone} was removed (the run folder deleted under it?); starting again on a new one)"
    for cid, kind in (("m1", "prompt"), ("a1", "ask")):
        assert lich.record.ack_for(cid, WAIT) == {"session_id": "s1", "id": cid, "kind": kind, "ok": False, "error": said}


@pytest.mark.skipif(WINDOWS, reason="a Unix socket renamed over the daemon's; Windows' address file is looked for once a second")
def test_a_socket_renamed_over_the_daemons_from_another_folder_ends_it_with_1(relay, lich, run_dir, tmp_path_factory):
    # The relay connects by path: once another socket is there, the daemon
    # serves no one. No name leaves the run folder, so only a watch on what
    # arrives there sees it.
    r = relay()
    socket_path = r.wait_hello()["socket"]
    parked(lich)
    other = os.path.join(str(tmp_path_factory.mktemp("other")), "s")
    with socket.socket(socket.AF_UNIX) as impostor:
        impostor.bind(other)
        os.rename(other, socket_path)
        assert r.wait_exit(WAIT) == 1  # not 0: the relay starts another, on a socket of its own
    with open(os.path.join(run_dir, "s1.log")) as log:
        assert "its socket was removed" in log.read()


@POSIX_SIGNALS
def test_the_shutdown_says_which_thread_overran_its_grace(relay, lich, run_dir):
    r = started(relay, lich)
    lich.faults.hold_acks()
    lich.queue("s1", {"id": "m12", "kind": "rewind"})
    lich.record.wait_acks(1)
    r.proc.send_signal(signal.SIGTERM)
    try:
        assert r.wait_exit(WAIT) == 0
    finally:
        lich.faults.release_acks()
    with open(os.path.join(run_dir, "s1.log")) as log:
        assert "the worker did not stop within the 1 s grace; the exit cuts it short" in log.read()


@pytest.mark.skipif(not WINDOWS, reason="Windows' parent watch (POSIX: the parent-death tests below)")
def test_on_windows_the_end_of_the_named_parent_ends_the_daemon_within_2_s_acking_what_was_in_flight(relay, lich):
    # The relay names CLAUDE_PID; here a stand-in process the test ends.
    parent = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        r = started(relay, lich, env={"LICH_CONTROL_PARENT_PID": str(parent.pid)})
        lich.queue("s1", {"id": "m1", "kind": "prompt", "text": "hi"})
        r.next_call()  # in flight: the session never answers
        parent.kill()
        parent.wait(5)
        ended = time.monotonic()
        assert r.wait_exit(EXIT_WITHIN + 1) == 0
        assert time.monotonic() - ended < EXIT_WITHIN + 1  # a one-second wait, then the shutdown's 2 s
        assert "the process that started the daemon is gone" in lich.record.ack_for("m1")["error"]
        assert not os.path.exists(r.hello and os.path.join(r.run_dir, "s1.address"))
    finally:
        parent.kill()
        parent.wait(5)


@POSIX_STDIN
def test_closing_stdin_is_the_parent_going_away(relay, lich):
    r = relay()
    socket_path = r.wait_hello()["socket"]
    parked(lich)
    r.proc.stdin.close()
    assert r.wait_exit(WAIT) == 0
    assert not os.path.exists(socket_path)


@pytest.mark.skipif(WINDOWS, reason="Windows: a closed stdout is met at the next write; the relay lives in the parent, whose end is watched")
def test_closing_the_read_end_of_stdout_stops_the_daemon(daemon_env, lich):
    read_fd, write_fd = os.pipe()
    with spawned(daemon_env, stdin=subprocess.DEVNULL, stdout=write_fd) as proc:
        os.close(write_fd)
        hello = json.loads(os.read(read_fd, 65536))
        parked(lich)
        os.close(read_fd)
        assert proc.wait(WAIT) == 0
        assert not os.path.exists(hello["socket"])


def test_a_second_daemon_for_the_session_exits_75_to_be_started_again_and_polls_once_the_first_is_gone(relay, lich, daemon_env):
    first = relay()
    first.wait_hello()
    parked(lich)
    second = daemon(daemon_env, LICH_CONTROL_LOCK_WAIT="0.5")
    # 75, not 2: the relay starts it again (bridge.js), where 2 would end polling for the session.
    assert second.returncode == 75 and second.stdout == b""
    lines = second.stderr.decode().splitlines()
    assert lines == ["lich-control: another daemon is still polling for session s1; exiting, to be started again once it is gone"]
    assert len(lich.record.polls) == 1  # only the first one ever polled
    assert first.proc.poll() is None and first.status()["daemon"]["pid"] == first.proc.pid
    first.stop()  # what docs/troubleshooting.md has a person do: kill the old daemon
    again = relay()
    again.wait_hello()
    assert lich.wait_polled("s1", WAIT, more_than=1, parked=True)


PARENT_THREAD = """
import subprocess, sys, threading
box, go = {}, threading.Event()
def spawn():
    box["child"] = subprocess.Popen([sys.executable, "-m", "lich_control"], stdin=subprocess.DEVNULL, stdout=int(sys.argv[1]), pass_fds=[int(sys.argv[1])])
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


@POSIX_FDS
def test_the_parents_death_ends_the_daemon_within_2_s_and_the_exit_of_its_spawning_thread_does_not(daemon_env, lich):
    # The daemon's stdin is /dev/null and the test holds its stdout open:
    # only the parent's death can tell it the session is gone.
    read_fd, write_fd = os.pipe()
    parent = subprocess.Popen([sys.executable, "-c", PARENT_THREAD, str(write_fd)], cwd=ROOT, env=env_for(daemon_env), stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=[write_fd])
    try:
        daemon_pid = int(parent.stdout.readline())
        os.close(write_fd)
        hello = json.loads(os.read(read_fd, 65536))  # the daemon has asked for the death signal
        assert hello["pid"] == daemon_pid
        parked(lich)
        parent.stdin.write(b"go\n")
        parent.stdin.flush()
        assert parent.stdout.readline() == b"thread gone\n"
        lich.queue("s1", {"id": "m12", "kind": "rewind"})
        assert lich.record.ack_for("m12")["error"] == "unknown kind"  # still alive and working
        parent.kill()
        parent.wait(5)
        killed = time.monotonic()
        read_until_eof(read_fd, EXIT_WITHIN)  # EOF: the daemon has exited
        assert time.monotonic() - killed < EXIT_WITHIN
        assert not os.path.exists(hello["socket"])
        # lich saw its held poll hang up with it: no mod is left to take a command.
        assert lich.wait_until("s1", lambda info: info.hung_up and not info.parked, WAIT)
        with pytest.raises(NotPolling, match="hung up its last poll"):
            lich.queue("s1", {"id": "m13", "kind": "rewind"})
    finally:
        parent.kill()
        parent.wait(5)
        os.close(read_fd)
        parent.stdin.close()
        parent.stdout.close()


def test_a_stdin_closed_from_the_start_is_not_taken_for_the_parent_leaving(daemon_env, lich):
    read_fd, write_fd = os.pipe()
    os.close(write_fd)  # the spawn gave the daemon a pipe with nothing behind it
    with spawned(daemon_env, stdin=read_fd) as proc:
        os.close(read_fd)
        json.loads(proc.stdout.readline())  # hello
        parked(lich)
        lich.queue("s1", {"id": "m12", "kind": "rewind"})
        assert lich.record.ack_for("m12")["error"] == "unknown kind"
        assert proc.poll() is None


# -- a stop asked for before the threads start -----------------------------------------


@POSIX_FDS
def test_a_relay_gone_before_the_hello_ends_the_daemon_with_0_and_nothing_left(daemon_env, lich, run_dir):
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # the hello's write fails: nobody will ever read the bridge
    with spawned(daemon_env, stdin=subprocess.DEVNULL, stdout=write_fd, stderr=subprocess.PIPE) as proc:
        os.close(write_fd)
        _, err = proc.communicate(timeout=WAIT)
    assert (proc.returncode, err) == (0, b"lich-control: writing to stdout failed (BrokenPipeError): the relay is gone\n")
    assert left_behind(run_dir) == [] and lich.record.polls == []


PARENT_GONE_AT_ONCE = """
import os, subprocess, sys
env = dict(os.environ, LICH_CONTROL_PARENT_PID=str(os.getpid()))
out = int(sys.argv[1])
subprocess.Popen([sys.executable, "-m", "lich_control"], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, pass_fds=[out])
"""


@POSIX_FDS
def test_a_daemon_whose_parent_died_before_it_ran_stops_without_polling(daemon_env, lich, run_dir):
    # stdin /dev/null and a stdout the test reads to its end: only the
    # parent's pid can tell the session is gone, and a reaper has its place by then.
    read_fd, write_fd = os.pipe()
    subprocess.run([sys.executable, "-c", PARENT_GONE_AT_ONCE, str(write_fd)], cwd=ROOT, env=env_for(daemon_env), pass_fds=[write_fd], timeout=30)
    os.close(write_fd)
    out = read_until_eof(read_fd, WAIT)  # EOF: the daemon has exited
    os.close(read_fd)
    assert lich.record.polls == [] and left_behind(run_dir) == []
    assert b"Traceback" not in out, out


# -- what it refuses: one line on stderr and exit 2, nothing left ---------------------------


def test_a_refusal_once_the_log_and_the_lock_are_open_is_one_line_exit_2_and_no_poll(daemon_env, run_dir, lich, tmp_path):
    # The socket's (or address file's) name is the last one checked: the log and the lock, open
    # by then, are closed on the way out. Each file's own check is its module's test.
    planted = os.path.join(run_dir, "s1.address" if WINDOWS else "s1.sock")
    os.mkdir(planted)
    done = daemon(daemon_env)
    assert (done.returncode, done.stdout) == (2, b"")
    problem = "cannot be opened (File exists)" if WINDOWS else "is not a socket"
    assert lines(done.stderr) == [f"lich-control: {planted} {problem}, not a file the daemon made: it will not write through it; remove it"]
    assert os.path.isdir(planted)
    assert lich.record.polls == []


# -- the start: the hello, the files, what the environment decides --------------------


def test_the_hello_line_comes_once_the_socket_listens(relay, run_dir):
    r = relay()
    hello = r.wait_hello()
    assert hello["protocol"] == 1 and hello["version"] == __version__
    assert hello["pid"] == r.proc.pid
    if WINDOWS:
        assert (hello["port"], hello["secret"]) == (r.address.port, r.address.secret) and "socket" not in hello
        assert read_address(os.path.join(run_dir, "s1.address")) == r.address
    else:
        assert hello["socket"] == os.path.join(run_dir, "s1.sock")
        assert stat.S_ISSOCK(os.stat(hello["socket"]).st_mode)
    assert r.status()["daemon"]["session_id"] == "s1"


@pytest.mark.parametrize("args, host", [((), "claude-code"), (("--host", "opencode"), "opencode")])
def test_the_status_names_the_program_the_relay_runs_in(relay, args, host):
    r = relay(args=args)
    r.wait_hello()
    assert r.status()["daemon"]["host"] == host


def test_outside_lich_it_exits_0_silently_and_never_polls(daemon_env, lich):
    done = daemon(daemon_env, LICH_TOKEN="")  # each variable's part: test_config.py
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert lich.record.polls == []


def test_a_default_run_folder_that_cannot_be_made_is_one_line_exit_2_naming_the_variable(daemon_env, lich, tmp_path_factory):
    # As in lich's macOS profile with no ~/.cache to write: never a traceback.
    # A short home (tmp_path's names grow with the test's), so the socket's
    # path is not the first thing found too long.
    home = os.path.join(str(tmp_path_factory.mktemp("h")), "home")
    with open(home, "w") as f:
        f.write("a file where the home should be")
    done = daemon(daemon_env, LICH_CONTROL_RUN_DIR="", XDG_RUNTIME_DIR="", HOME=home, LOCALAPPDATA=home)
    assert (done.returncode, done.stdout) == (2, b"")
    [line] = lines(done.stderr)
    assert line.startswith("lich-control: cannot create the run folder ") and "set LICH_CONTROL_RUN_DIR" in line, line
    assert lich.record.polls == []


def test_a_bad_environment_exits_2_with_one_line_and_no_request(daemon_env, lich, run_dir):
    done = daemon(daemon_env, LICH_PORT="http")  # each refusal's text: test_config.py
    assert (done.returncode, done.stdout) == (2, b"")
    assert lines(done.stderr) == ["lich-control: LICH_PORT must be a port number from 1 to 65535, not 'http'"]
    assert lich.record.polls == [] and os.listdir(run_dir) == []


def parent_death_signal_allowed():
    """Whether a process may ask for a parent-death signal here
    (.ci/daemon-fallbacks runs this file where it may not)."""
    libc = ctypes.CDLL(None, use_errno=True)
    current = ctypes.c_int()
    libc.prctl(2, ctypes.byref(current), 0, 0, 0)  # PR_GET_PDEATHSIG
    return libc.prctl(1, current.value, 0, 0, 0) == 0  # PR_SET_PDEATHSIG, to what it was


@POSIX_DEATH
def test_the_log_says_so_when_the_parent_is_watched_without_a_death_signal(relay, run_dir):
    relay().wait_hello()  # said before the hello
    with open(os.path.join(run_dir, "s1.log")) as f:
        said = "no parent-death signal here (Invalid argument): the daemon checks its parent once a second" in f.read()
    assert said == (not parent_death_signal_allowed())


@pytest.mark.parametrize("level, written", [("INFO", True), ("WARNING", False)])
def test_the_log_level_comes_from_the_environment(relay, lich, run_dir, level, written):
    started(relay, lich, env={"LICH_CONTROL_LOG_LEVEL": level}).stop()
    with open(os.path.join(run_dir, "s1.log")) as f:
        assert ("polling lich on port" in f.read()) == written


# -- the daemon exits within 2 s whatever its pipes do ----------------------


@POSIX_SIGNALS
def test_sigterm_ends_a_daemon_whose_stdout_nobody_reads(daemon_env, lich):
    read_fd, write_fd = os.pipe()
    with spawned(daemon_env, stdout=write_fd) as proc:
        json.loads(os.read(read_fd, 65536))  # hello
        parked(lich)
        # A call four times the pipe's size: once it has begun, the rest
        # cannot fit, and the worker is stuck in the write for good.
        lich.queue("s1", {"id": "m1", "kind": "prompt", "text": "x" * (256 * 1024)})
        assert os.read(read_fd, 12) == b'{"op":"call"'
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(EXIT_WITHIN) == 0
    os.close(read_fd)
    os.close(write_fd)
