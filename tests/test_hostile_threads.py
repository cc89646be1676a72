"""Issue 15, the threads: faults injected where a command is in hand, asks
whose forks never answer, and a daemon whose pipes nobody reads.

Each fault costs at most the command in hand: the loop goes on, the next
ordered command is applied and acked, and no id gets a second ack.
"""
import gc
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import weakref
from concurrent.futures import Future

import pytest

from lich_control.asks import POOL_SIZE, Asks, Deadlines
from lich_control.bridge import Bridge
from lich_dev import procs
from lich_dev.faults import AckAnswer
from lich_control.engine import Turns
from lich_control.activity import Activity

from fakes import FakeEngine, ScriptedClient, StdoutCalls
from test_worker import Rig

EXIT_WITHIN = 2.0  # the contract's bound on the exit after SIGTERM
WAIT = 10.0


def acked_ids(rig):
    return [a.id for a in rig.client.acks]


# -- the worker and the acker never die, and no id is acked twice ----------


def failing_activity(method, when):
    """An Activity whose `method` raises whenever `when(*args)` holds."""

    class Failing(Activity):
        pass

    original = getattr(Activity, method)

    def broken(self, *args, **kwargs):
        if when(*args):
            raise RuntimeError(f"{method} failed on purpose")
        return original(self, *args, **kwargs)

    setattr(Failing, method, broken)
    return Failing


def test_a_status_that_fails_at_each_ack_costs_no_later_command():
    # Its own catch-all's ack met the same failure: that ended the thread.
    rig = Rig(activity=failing_activity("waiting", lambda cid, on: cid == "m12"))
    try:
        rig.send({"id": "m12", "kind": "rewind"}, {"id": "m13", "kind": "rewind"})
        assert rig.acks(2) == [("m12", False, "unknown kind"), ("m13", False, "unknown kind")]
    finally:
        rig.close()


def test_a_failure_after_an_ack_went_out_sends_no_second_ack():
    # m3's ack said ok: true; recording it failed, and the catch-all sent ok: false.
    rig = Rig(activity=failing_activity("acked", lambda cid, *rest: cid == "m3"))
    try:
        rig.send({"id": "m3", "kind": "model", "model": "opus"}, {"id": "m4", "kind": "rewind"})
        rig.engine.wait_calls(1)
        rig.engine.settle(0)
        assert rig.acks(2) == [("m3", True, None), ("m4", False, "unknown kind")]
        assert rig.worker.stop(5) and rig.acker.stop(5)
        assert acked_ids(rig) == ["m3", "m4"]
    finally:
        rig.close()


def test_the_acker_lives_through_a_failure_around_one_ack():
    rig = Rig(activity=failing_activity("acked", lambda cid, *rest: cid == "m1"))
    try:
        rig.send({"id": "m1", "kind": "prompt", "text": "one"}, {"id": "m2", "kind": "prompt", "text": "two"})
        rig.engine.wait_calls(2)
        rig.engine.settle(0, {"text": "one"})
        rig.engine.settle(1, {"text": "two"})
        assert rig.acks(2) == [("m1", True, None), ("m2", True, None)]
        assert rig.acker.stop(5)
        assert acked_ids(rig) == ["m1", "m2"]
    finally:
        rig.close()


class RaisingEngine(FakeEngine):
    """Its prompt call raises; its abort's future settles with an exception."""

    def submit_prompt(self, text, as_user=False):
        raise RuntimeError("the engine failed on purpose")

    def abort_turn(self, turn_id):
        future = Future()
        future.set_exception(RuntimeError("the future failed on purpose"))
        return future


def test_an_engine_that_raises_or_whose_future_raises_fails_that_command_once():
    rig = Rig(engine=RaisingEngine)
    rig.turns.started("t1")
    try:
        rig.send({"id": "m1", "kind": "prompt", "text": "x"}, {"id": "m2", "kind": "abort"}, {"id": "m3", "kind": "rewind"})
        failed = "the daemon failed to apply it (see its log)"
        assert rig.acks(3) == [("m1", False, failed), ("m2", False, failed), ("m3", False, "unknown kind")]
        assert rig.worker.stop(5)
        assert acked_ids(rig) == ["m1", "m2", "m3"]
    finally:
        rig.close()


def test_a_prompt_whose_future_raises_is_acked_failed_once():
    rig = Rig()
    try:
        rig.send({"id": "m1", "kind": "prompt", "text": "x"}, {"id": "m2", "kind": "rewind"})
        rig.engine.wait_calls(1)[0][2].set_exception(RuntimeError("on purpose"))
        acks = rig.acks(2)
        assert sorted(acks) == [("m1", False, "the daemon could not read the session's answer (see its log)"), ("m2", False, "unknown kind")]
    finally:
        rig.close()


# -- asks whose forks never answer starve no other ask ----------------------


def test_forks_that_never_answer_hold_back_no_later_ask():
    rig = Rig()
    rig.asks.stop()
    rig.asks = Asks(rig.engine, lambda: rig.client, rig.activity, "s1")  # POOL_SIZE threads
    try:
        hanging = POOL_SIZE + 8
        rig.send(*[{"id": f"h{i}", "kind": "ask", "question": f"hang {i}?"} for i in range(hanging)])
        rig.send({"id": "a1", "kind": "ask", "question": "quick?"})
        calls = rig.engine.wait_calls(hanging + 1)
        quick = next(i for i, call in enumerate(calls) if call[1][0].endswith("quick?"))
        rig.engine.settle(quick, {"isAnswered": True, "text": "at once"})
        (ack,) = rig.client.wait_acks(1)
        assert (ack.id, ack.ok, ack.answer) == ("a1", True, "at once")
        # One thread keeps every deadline, however many forks hang.
        assert sum(t.name == "lich-ask-deadlines" for t in threading.enumerate()) == 1
    finally:
        rig.close()


def test_setting_deadlines_does_not_wake_their_thread():
    looked = []
    first_look = threading.Event()

    def clock():  # the thread reads it each time it wakes to look at the deadlines
        if threading.current_thread().name == "lich-ask-deadlines":
            looked.append(1)
            first_look.set()
        return 0.0

    deadlines = Deadlines(1000.0, clock=clock)
    fired = []
    try:
        deadlines.add(lambda: fired.append("first"))
        assert first_look.wait(WAIT)
        for n in range(50):
            deadlines.add(lambda: fired.append(n)).cancel()
        assert len(looked) == 1 and fired == []
    finally:
        deadlines.stop()


@pytest.fixture
def bridged():
    """Asks over a real Bridge with a tiny fork deadline."""
    calls = StdoutCalls(WAIT)
    bridge = Bridge(calls, Turns(), on_broken=lambda why: None)
    client = ScriptedClient()
    asks = Asks(bridge, lambda: client, Activity("s1", "relay", Turns()), "s1", deadline=0.05)
    yield bridge, calls, asks, client
    asks.stop()


def ask(command_id, question):
    from lich_control.commands import parse_batch

    (command,) = parse_batch([{"id": command_id, "kind": "ask", "question": question}])
    return command


def test_a_fork_past_its_deadline_is_acked_failed_once_and_forgotten(bridged, caplog):
    bridge, calls, asks, client = bridged
    asks.submit(ask("a1", "hang?"))
    (ack,) = client.wait_acks(1)
    assert (ack.id, ack.ok, ack.error) == ("a1", False, "the fork did not answer within 0.05 s")
    # The bridge forgot the call: its late answer settles nothing and acks nothing.
    with caplog.at_level(logging.INFO, logger="lich_control.bridge"):
        bridge.result({"id": calls.wait(1)["id"], "ok": True, "value": {"isAnswered": True, "text": "late"}})
    assert "which is no call waiting here; ignored" in caplog.text
    assert bridge._pending == {}  # nothing left behind
    asks.submit(ask("a2", "quick?"))  # a later fork still runs
    bridge.result({"id": calls.wait(2)["id"], "ok": True, "value": {"isAnswered": True, "text": "on time"}})
    assert [(a.id, a.ok) for a in client.wait_acks(2)] == [("a1", False), ("a2", True)]
    asks.stop()
    assert [a.id for a in client.acks] == ["a1", "a2"]


# -- the bridge never makes a reader wait on a writer ------------------------


class StuckOut:
    """A stdout nobody reads: each write blocks until released."""

    def __init__(self):
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, data):
        self.entered.set()
        self.release.wait(WAIT)

    def flush(self):
        pass


def test_a_stdout_nobody_reads_blocks_neither_close_nor_a_result():
    out = StuckOut()
    bridge = Bridge(out, Turns(), on_broken=lambda why: None)
    writer = threading.Thread(target=bridge.submit_prompt, args=("x",), daemon=True)
    writer.start()
    assert out.entered.wait(WAIT)
    closer = threading.Thread(target=bridge.close, args=("the daemon is stopping",), daemon=True)
    closer.start()
    closer.join(WAIT)
    try:
        assert not closer.is_alive()
    finally:
        out.release.set()
        writer.join(WAIT)


def test_a_call_its_caller_gave_up_is_forgotten():
    bridge = Bridge(io.BytesIO(), Turns(), on_broken=lambda why: None)
    given_up, kept = bridge.fork("a"), bridge.fork("b")
    assert given_up.cancel()
    bridge.result({"id": "c1", "ok": True, "value": None})  # no InvalidStateError
    bridge.close("the daemon is stopping")
    assert kept.result(timeout=1).error == "the daemon is stopping"


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


# -- the daemon exits within 2 s whatever its pipes do ----------------------


def start_daemon(daemon_env, stdout, stderr, **extra):
    env = procs.daemon_env(**daemon_env, **extra)
    return subprocess.Popen([sys.executable, "-m", "lich_control.daemon"], cwd=procs.ROOT, env=env, stdin=subprocess.PIPE, stdout=stdout, stderr=stderr)


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


# -- an answered ask is let go at once, not at its deadline -------------------------


def test_an_answered_ask_is_let_go_at_once_not_kept_until_its_deadline():
    # Its deadline (300 s) stayed queued, and with it the ask and the fork's
    # answer: a lich sending large asks that forks answer at once held
    # 300 s of them in memory.
    from lich_control.commands import parse_batch

    stdout = StdoutCalls(WAIT)
    bridge = Bridge(stdout, Turns(), on_broken=lambda why: None)
    client = ScriptedClient()
    asks = Asks(bridge, lambda: client, Activity("s1", "relay", Turns()), "s1")
    try:
        hanging, command = parse_batch([{"id": "h1", "kind": "ask", "question": "hang?"}, {"id": "a1", "kind": "ask", "question": "x" * 100_000}])
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
        gc.collect()
        assert kept() is None
    finally:
        asks.stop()
