"""Seams found by the review of the merged issue-15 work: each a way the
pieces, sound alone, failed together."""
import fcntl
import gc
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import weakref

from lich_control import logs
from lich_control.acks import Acks
from lich_control.bridge import Bridge, Turns
from lich_control.commands import Command
from lich_dev import procs
from lich_control.status import Activity
from lich_control.worker import Asks

from fakes import ScriptedClient, StdoutCalls

WAIT = 10.0
F_SETPIPE_SZ = 1031  # Linux's fcntl: the smallest pipe is one page


def _tiny_files():
    # Room for the lock's pid, not for the log's second line: every later
    # write of the log fails (EFBIG; Python ignores SIGXFSZ).
    resource.setrlimit(resource.RLIMIT_FSIZE, (200, 200))


def test_a_log_file_that_cannot_be_written_never_blocks_the_daemon_on_an_unread_stderr(daemon_env, lich, run_dir):
    # logging's own handleError printed a traceback per failed line to
    # stderr with a blocking write: with the relay not reading it, the
    # worker blocked in its ack's log line and every later command waited.
    err_r, err_w = os.pipe()
    fcntl.fcntl(err_w, F_SETPIPE_SZ, 4096)
    proc = subprocess.Popen(
        [sys.executable, "-m", "lich_control.daemon"],
        cwd=procs.ROOT,
        env=procs.daemon_env(**daemon_env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=err_w,
        preexec_fn=_tiny_files,
    )
    os.close(err_w)
    try:
        assert lich.wait_polled("s1", WAIT)
        for _ in range(12):  # each logs a line at INFO; three tracebacks filled the pipe
            outcome = lich.send("s1", {"kind": "abort"}, timeout=WAIT)
            assert outcome.state == "acked" and outcome.error == "no turn is running", outcome
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT) == 0  # closing the log file that cannot be flushed is no crash
        os.set_blocking(err_r, False)
        err = os.read(err_r, 65536).decode("utf-8", "replace")
    finally:
        procs.stop(proc)
        os.close(err_r)
    assert "Traceback" not in err, err
    assert err.count("writing the log file") == 1 and "(EFBIG)" in err, err


def test_a_rotation_refused_is_said_outside_the_files_lock(tmp_path):
    # The stderr handler notes its drops in the log file while holding its
    # own lock; the file said its refusal on stderr while holding its own:
    # two threads doing each at once would wait on each other for ever.
    path = tmp_path / "s1.log"
    handler = logs.PrivateRotatingFile(str(path), maxBytes=100, backupCount=1, encoding="utf-8")

    def rotate_then_plant(source, dest):
        os.rename(source, dest)
        os.symlink(tmp_path / "elsewhere", source)

    handler.rotator = rotate_then_plant
    held = []

    class Probe(logging.Handler):
        def emit(self, record):
            if "no more log file" in record.getMessage():
                held.append(handler.lock._is_owned())

    root = logging.getLogger("lich_control")
    probe = Probe()
    root.addHandler(handler)
    root.addHandler(probe)
    try:
        for i in range(10):
            logging.getLogger("lich_control.review").warning("line %d, long enough to rotate soon", i)
    finally:
        root.removeHandler(handler)
        root.removeHandler(probe)
        handler.close()
    assert handler.given_up
    assert held == [False]


# -- an answered ask is let go at once, not at its deadline -------------------------


def test_an_answered_ask_is_let_go_at_once_not_kept_until_its_deadline():
    # Its deadline (300 s) stayed queued, and with it the ask and the fork's
    # answer: a lich sending large asks that forks answer at once held
    # 300 s of them in memory.
    stdout = StdoutCalls(WAIT)
    bridge = Bridge(stdout, Turns(), on_broken=lambda why: None)
    client = ScriptedClient()
    activity = Activity("s1", "relay", Turns())
    acks = Acks(lambda: client, activity)
    asks = Asks(bridge, acks, activity, "s1")
    try:
        hanging, command = map(Command.from_json, [{"id": "h1", "kind": "ask", "question": "hang?"}, {"id": "a1", "kind": "ask", "question": "x" * 100_000}])
        asks.submit(hanging)  # its deadline first in line, the answered one's behind it
        stdout.wait(1)
        kept = weakref.ref(command)
        asks.submit(command)
        del command
        call = stdout.wait(2)
        bridge.result({"id": call["id"], "ok": True, "value": {"isAnswered": True, "text": "at once"}})
        (ack,) = client.wait_acks(1)
        assert (ack.id, ack.ok) == ("a1", True)
        asks._pool.shutdown(wait=True)  # the ack's job is over: nothing of it on a thread's stack
        acks._pool.shutdown(wait=True)
        gc.collect()
        assert kept() is None
    finally:
        asks.stop()


# -- a run folder whose path is not UTF-8 ---------------------------------------------


def test_a_run_folder_that_is_not_utf8_is_a_bad_configuration(lich, tmp_path):
    # The hello named its socket as "...\udcff...": the relay reads that as
    # U+FFFD, reaches no socket, and every result it posts is lost.
    folder = os.fsencode(str(tmp_path)) + b"/run-\xff"
    env = {os.fsencode(k): os.fsencode(v) for k, v in procs.daemon_env().items()}
    env.update({b"LICH_PORT": str(lich.port).encode(), b"LICH_TOKEN": b"tok", b"LICH_SESSION_ID": b"s1", b"LICH_CONTROL_RUN_DIR": folder})
    proc = subprocess.Popen([sys.executable, "-m", "lich_control.daemon"], cwd=procs.ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=WAIT)
    finally:
        procs.stop(proc)
    assert proc.returncode == 2 and out == b""
    assert err.count(b"\n") == 1 and b"is not valid UTF-8, so the relay could not reach the socket there" in err, err
    assert not os.path.exists(folder)
