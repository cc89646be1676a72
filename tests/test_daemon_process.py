"""The daemon as a process: its start, its files, its streams and its exit,
over the real bridge and real loopback HTTP. (Moved whole from the files
named by history; the daemon's lifetime tests are to hold them.)"""
import json
import logging
import os
import select
import signal
import socket
import stat
import subprocess
import sys
from urllib.parse import quote

import pytest

from lich_control import __version__
from lich_control.stderr_lines import StderrLines, one_write
from lich_dev import procs
from lich_dev.faults import AckAnswer

from fakes import RawAnswer

EXIT_WITHIN = 2.0  # the contract's bound on the exit after SIGTERM
WAIT = 10.0


def started(relay, lich, **kw):
    r = relay(**kw)
    r.wait_hello()
    assert lich.wait_polled("s1", WAIT, parked=True)
    return r


def send(lich, *commands):
    lich.queue_all("s1", list(commands))


def test_the_hello_line_comes_once_the_socket_listens(relay, run_dir):
    r = relay()
    hello = r.wait_hello()
    assert hello["protocol"] == 1 and hello["version"] == __version__
    assert hello["pid"] == r.proc.pid
    assert hello["socket"] == os.path.join(run_dir, "s1.sock")
    assert stat.S_ISSOCK(os.stat(hello["socket"]).st_mode)
    assert r.status()["daemon"]["session_id"] == "s1"


@pytest.mark.parametrize("args, host", [((), "claude-code"), (("--host", "opencode"), "opencode")])
def test_the_status_names_the_program_the_relay_runs_in(relay, args, host):
    r = relay(args=args)
    r.wait_hello()
    assert r.status()["daemon"]["host"] == host


def test_the_run_folder_is_0700_and_the_socket_0600(relay, tmp_path):
    folder = tmp_path / "made-by-daemon"
    r = relay(env={"LICH_CONTROL_RUN_DIR": str(folder)})
    hello = r.wait_hello()
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(hello["socket"]).st_mode) == 0o600


@pytest.mark.parametrize("missing", ["LICH_PORT", "LICH_TOKEN", "LICH_SESSION_ID"])
def test_outside_lich_it_exits_0_silently_and_never_polls(daemon_env, lich, missing):
    env = procs.daemon_env(**dict(daemon_env, **{missing: ""}))
    done = subprocess.run([sys.executable, "-m", "lich_control.daemon"], cwd=procs.ROOT, env=env, capture_output=True, timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert lich.record.polls == []


@pytest.mark.parametrize("port", ["0", "65536", "http", "-1", "80 80"])
def test_a_bad_port_exits_2_with_one_line_and_no_request(daemon_env, lich, port):
    env = procs.daemon_env(**dict(daemon_env, LICH_PORT=port))
    done = subprocess.run([sys.executable, "-m", "lich_control.daemon"], cwd=procs.ROOT, env=env, capture_output=True, timeout=30)
    assert done.returncode == 2 and done.stdout == b""
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and "LICH_PORT must be a port number from 1 to 65535" in lines[0]
    assert lich.record.polls == []


def test_the_log_file_is_private_and_holds_each_ack(relay, lich, run_dir):
    r = started(relay, lich)
    send(lich, {"id": "m12", "kind": "rewind"})
    lich.record.wait_acks(1)
    r.stop()
    path = os.path.join(run_dir, "s1.log")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as f:
        text = f.read()
    assert "acked m12 (rewind): failed: unknown kind" in text


def test_the_log_level_is_settable(relay, lich, run_dir):
    r = started(relay, lich, env={"LICH_CONTROL_LOG_LEVEL": "WARNING"})
    send(lich, {"id": "m12", "kind": "rewind"})
    lich.record.wait_acks(1)
    r.stop()
    with open(os.path.join(run_dir, "s1.log")) as f:
        assert "acked m12" not in f.read()


def test_urllib3s_warning_about_a_malformed_answer_reaches_the_log_without_the_token(relay, lich, run_dir):
    # urllib3 logs a header it cannot parse with the request's URL, token and all.
    raw = RawAnswer(b"HTTP/1.1 200 OK\r\nthis is no header\r\n\r\n[]")
    try:
        r = relay({"LICH_PORT": str(raw.port)})
        r.wait_hello()
        raw.wait(2)  # the first answer was read (an empty batch) and the poll went out again
        r.proc.terminate()
        assert r.wait_exit(5) == 0  # the log is flushed on the way out
    finally:
        raw.close()
    with open(os.path.join(run_dir, "s1.log"), encoding="utf-8") as f:
        log = f.read()
    assert "Failed to parse headers" in log and "token=[token]" in log
    assert lich.token not in log and quote(lich.token, safe="") not in log
    assert lich.token not in "".join(r.stderr_lines) and quote(lich.token, safe="") not in "".join(r.stderr_lines)


# -- stderr never blocks a thread for long -----------------------------------


def full_pipe():
    """A pipe whose buffer is full: the next blocking write would wait."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    try:
        while True:
            os.write(write_fd, b"x" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(write_fd, True)  # the writer under test sees a plain, blocking pipe
    return read_fd, write_fd


def drain(fd):
    os.set_blocking(fd, False)
    try:
        while os.read(fd, 1 << 16):
            pass
    except BlockingIOError:
        pass
    os.set_blocking(fd, True)


@pytest.fixture
def stderr_logger():
    read_fd, write_fd = full_pipe()
    handler = StderrLines(write_fd, wait=0.01)
    handler.setFormatter(logging.Formatter("lich-control: %(message)s"))
    notes = []
    file_like = logging.Handler()
    file_like.emit = lambda record: notes.append(record.getMessage())
    root = logging.getLogger("lich_control")
    logger = logging.getLogger("lich_control.test")
    saved = root.handlers[:], root.level, root.propagate
    root.handlers[:] = [handler, file_like]
    root.setLevel(logging.WARNING)
    root.propagate = False
    yield logger, handler, read_fd, notes
    root.handlers[:], root.level, root.propagate = saved
    os.close(read_fd)
    os.close(write_fd)


def test_a_full_stderr_drops_lines_counts_them_and_says_so_once_it_drains(stderr_logger):
    logger, handler, read_fd, notes = stderr_logger
    for n in range(3):
        logger.warning("line %d", n)  # returns: the pipe is full
    assert handler.dropped == 3
    drain(read_fd)
    logger.warning("line 3")
    said = os.read(read_fd, 1 << 16).decode()
    assert said == (
        "lich-control: 3 warning lines could not be written to stderr (it was full); the log file has them\n"
        "lich-control: line 3\n"
    )
    # The log file has every line, and what stderr lost.
    assert notes == [
        "stderr takes no more lines (nobody reads it?): warnings are dropped there until it does",
        "line 0",
        "line 1",
        "line 2",
        "3 warning lines could not be written to stderr (it was full)",
        "line 3",
    ]


def test_a_line_goes_out_in_one_write_a_pipe_takes_whole():
    assert one_write("short") == b"short\n"
    long = one_write("字" * 10000)
    assert len(long) <= select.PIPE_BUF and long.endswith(b"...\n")
    long.decode("utf-8")  # never cut inside a character


# -- the daemon exits within 2 s whatever its pipes do ----------------------


def start_daemon(daemon_env, stdout, stderr, **extra):
    env = procs.daemon_env(**daemon_env, **extra)
    return subprocess.Popen([sys.executable, "-m", "lich_control.daemon"], cwd=procs.ROOT, env=env, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr)


def test_a_stderr_nobody_reads_holds_back_no_command(daemon_env, lich):
    read_fd, write_fd = full_pipe()
    proc = start_daemon(daemon_env, subprocess.PIPE, write_fd)
    try:
        json.loads(proc.stdout.readline())  # hello
        assert lich.wait_polled("s1", WAIT, parked=True)
        lich.faults.script_acks(AckAnswer(status=400), AckAnswer(status=400))  # each a warning line
        lich.queue_all("s1", [{"id": "m1", "kind": "rewind"}, {"id": "m2", "kind": "rewind"}, {"id": "m3", "kind": "rewind"}])
        assert lich.record.ack_for("m3")["error"] == "unknown kind"
        drain(read_fd)
        lich.faults.script_acks(AckAnswer(status=400))
        lich.queue("s1", {"id": "m4", "kind": "rewind"})
        lich.record.ack_for("m4")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT) == 0
        os.close(write_fd)
        said = b""
        while chunk := os.read(read_fd, 1 << 16):  # to EOF: the daemon is gone
            said += chunk
        assert b"2 warning lines could not be written to stderr (it was full); the log file has them\n" in said
        assert b"refused the ack for m4" in said
        with open(os.path.join(daemon_env["LICH_CONTROL_RUN_DIR"], "s1.log")) as f:
            logged = f.read()
        assert "refused the ack for m1" in logged and "2 warning lines could not be written to stderr" in logged
    finally:
        procs.stop(proc)
        proc.stdin.close()
        proc.stdout.close()
        os.close(read_fd)


def test_sigterm_ends_a_daemon_whose_stdout_nobody_reads(daemon_env, lich):
    read_fd, write_fd = os.pipe()
    proc = start_daemon(daemon_env, write_fd, subprocess.DEVNULL)
    try:
        json.loads(os.read(read_fd, 65536))  # hello
        assert lich.wait_polled("s1", WAIT, parked=True)
        # A call four times the pipe's size: once it has begun, the rest
        # cannot fit, and the worker is stuck in the write for good.
        lich.queue("s1", {"id": "m1", "kind": "prompt", "text": "x" * (256 * 1024)})
        assert os.read(read_fd, 12) == b'{"op":"call"'
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(EXIT_WITHIN) == 0
    finally:
        procs.stop(proc)
        proc.stdin.close()
        os.close(read_fd)
        os.close(write_fd)


def test_sigterm_ends_a_daemon_whose_stderr_is_full_with_relay_connections_open(daemon_env, lich):
    read_fd, write_fd = full_pipe()
    proc = start_daemon(daemon_env, subprocess.PIPE, write_fd, LICH_CONTROL_LOG_LEVEL="DEBUG")
    conns = []
    try:
        hello = json.loads(proc.stdout.readline())
        for _ in range(5):
            conn = socket.socket(socket.AF_UNIX)
            conn.connect(hello["socket"])
            conns.append(conn)
        assert lich.wait_polled("s1", WAIT, parked=True)
        lich.faults.script_acks(*[AckAnswer(status=400)] * 20)
        lich.queue_all("s1", [{"id": f"m{i}", "kind": "rewind"} for i in range(20)])
        lich.record.ack_for("m19")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(EXIT_WITHIN) == 0
    finally:
        for conn in conns:
            conn.close()
        procs.stop(proc)
        proc.stdin.close()
        proc.stdout.close()
        os.close(read_fd)
        os.close(write_fd)


HELD = """
import signal, threading
from lich_control.daemon import arm_exit_deadline
signal.signal(signal.SIGALRM, signal.SIG_IGN)  # as a careless parent might pass it down
arm_exit_deadline(0.2)
lock = threading.Lock()
lock.acquire()
lock.acquire()  # held for ever: only the kernel ends this
"""


def test_the_exit_deadline_ends_a_process_whatever_holds_it():
    proc = subprocess.run([sys.executable, "-c", HELD], cwd=procs.ROOT, env=procs.daemon_env(), timeout=WAIT)
    assert proc.returncode == -signal.SIGALRM
