import gc
import io
import json
import logging
import os
import threading
import weakref

import pytest

from lich_control import __version__
from lich_control.bridge import BadMessage, Bridge, CallResult, PendingCalls, Turns

WAIT = 5.0


class Out(io.BytesIO):
    def lines(self):
        return [json.loads(line) for line in self.getvalue().splitlines()]


class BrokenOut:
    def write(self, data):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass


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


class Clock:
    """The deadline thread's time, set by the test; counts that thread's looks."""

    def __init__(self):
        self.now = 0.0
        self.looks = 0
        self.looked = threading.Event()

    def __call__(self):
        if threading.current_thread().name == "lich-call-deadlines":
            self.looks += 1
            self.looked.set()
        return self.now


@pytest.fixture
def wire():
    out, turns, broken = Out(), Turns(), []
    bridge = Bridge(out, turns, on_broken=broken.append)
    yield bridge, out, turns, broken
    bridge.close("the test is over")


def test_the_hello_and_each_call_are_one_json_line_in_the_bridge_shape(wire):
    bridge, out, _, _ = wire
    bridge.hello({"socket": "/run/x/s1.sock"})
    bridge.call("prompt.submit", {"text": "run the tests"}, None)
    bridge.call("turn.abort", {"turnId": "t1"}, 10)
    hello, *calls = out.lines()
    assert (hello["op"], hello["protocol"], hello["socket"]) == ("hello", 1, "/run/x/s1.sock")
    assert set(hello) == {"op", "protocol", "pid", "socket", "version"}
    assert calls == [
        {"op": "call", "id": "c1", "method": "prompt.submit", "args": {"text": "run the tests"}},
        {"op": "call", "id": "c2", "method": "turn.abort", "args": {"turnId": "t1"}},
    ]


def test_a_loopback_hello_names_port_and_secret_instead_of_a_socket(wire):
    bridge, out, _, _ = wire
    bridge.hello({"port": 50123, "secret": "s3cret"})
    (hello,) = out.lines()
    assert hello == {"op": "hello", "protocol": 1, "pid": os.getpid(), "port": 50123, "secret": "s3cret", "version": __version__}


def test_a_result_settles_the_call_it_names_in_any_order(wire):
    bridge, _, _, _ = wire
    first, second = bridge.call("prompt.submit", {"text": "a"}, None), bridge.call("model.fork", {"prompt": "b"}, 300)
    bridge.result({"id": "c2", "ok": True, "value": {"isAnswered": True, "text": "x"}})
    assert second.done() and not first.done()
    bridge.result({"id": "c1", "ok": False, "error": "dropped"})
    assert first.result() == CallResult.failed("dropped")
    assert second.result() == CallResult.answered({"isAnswered": True, "text": "x"})
    third = bridge.call("turn.abort", {"turnId": "t1"}, 10)
    bridge.result({"id": "c3", "ok": True})
    assert third.result() == CallResult.answered(None)  # no value is null


@pytest.mark.parametrize(
    "doc, reason",
    [
        ([], "the body must be a JSON object"),
        ({"ok": True}, "id must be a string"),
        ({"id": 1, "ok": True}, "id must be a string"),
        ({"id": "c1"}, "ok must be a boolean"),
        ({"id": "c1", "ok": "true"}, "ok must be a boolean"),
        ({"id": "c1", "ok": False}, "error must be a string when ok is false"),
    ],
)
def test_a_result_of_the_wrong_shape_is_refused_with_a_reason(wire, doc, reason):
    bridge, _, _, _ = wire
    with pytest.raises(BadMessage, match=reason):
        bridge.result(doc)


def test_a_result_for_no_call_waiting_a_late_one_included_is_ignored(wire, caplog):
    bridge, _, _, _ = wire
    waiting = bridge.call("prompt.submit", {"text": "x"}, None)
    fork = bridge.call("model.fork", {"prompt": "q"}, 0)
    assert fork.result(WAIT) == CallResult.failed("model.fork did not answer within 0 s")
    with caplog.at_level(logging.INFO, logger="lich_control.bridge"):
        bridge.result({"id": "c404", "ok": True, "value": None})
        bridge.result({"id": "c2", "ok": True, "value": "late"})
    assert not waiting.done() and fork.result() == CallResult.failed("model.fork did not answer within 0 s")
    assert "a result for c404, which is no call waiting here; ignored" in caplog.text
    assert "a result for c2, which is no call waiting here; ignored" in caplog.text


def test_events_move_the_recorded_turn_and_an_unknown_one_is_ignored(wire):
    bridge, _, turns, _ = wire
    bridge.event({"event": "turn.start", "turnId": "t1"})
    bridge.event({"event": "turn.complete", "turnId": "sub-1"})
    bridge.event({"event": "turn.pause", "turnId": "t1"})
    assert turns.current == "t1"
    bridge.event({"event": "turn.complete", "turnId": "t1"})
    assert turns.current is None


@pytest.mark.parametrize(
    "doc, reason",
    [
        ("x", "the body must be a JSON object"),
        ({"turnId": "t1"}, "event must be a string"),
        ({"event": "turn.start"}, "turnId must be a non-empty string"),
        ({"event": "turn.complete", "turnId": 5}, "turnId must be a non-empty string"),
    ],
)
def test_an_event_of_the_wrong_shape_is_refused(wire, doc, reason):
    bridge, _, _, _ = wire
    with pytest.raises(BadMessage, match=reason):
        bridge.event(doc)


def test_a_broken_stdout_fails_the_call_and_asks_the_daemon_to_stop():
    broken = []
    bridge = Bridge(BrokenOut(), Turns(), on_broken=broken.append)
    future = bridge.call("prompt.submit", {"text": "x"}, None)
    assert future.result(0) == CallResult.failed("the relay is gone (its end of the pipe closed)")
    assert broken == ["writing to stdout failed"]
    assert bridge.call("model.fork", {"prompt": "q"}, 300).result(0) == future.result()


def test_close_fails_every_waiting_call_and_every_later_one(wire):
    bridge, out, _, _ = wire
    waiting = [bridge.call("prompt.submit", {"text": "a"}, None), bridge.call("model.fork", {"prompt": "b"}, 300)]
    bridge.close("the daemon is stopping")
    later = bridge.call("command.run", {"command": "clear"}, None)
    assert [f.result(0).error for f in waiting + [later]] == ["the daemon is stopping"] * 3
    assert len(out.lines()) == 2  # the later call was never written


def test_a_stdout_nobody_reads_holds_back_neither_close_nor_a_deadline():
    out = StuckOut()
    bridge = Bridge(out, Turns(), on_broken=lambda why: None)
    box = []
    writer = threading.Thread(target=lambda: box.append(bridge.call("turn.abort", {"turnId": "t1"}, 0.01)), daemon=True)
    writer.start()
    try:
        assert out.entered.wait(WAIT)
        closer = threading.Thread(target=bridge.close, args=("the daemon is stopping",), daemon=True)
        closer.start()
        closer.join(WAIT)
        assert not closer.is_alive()
    finally:
        out.release.set()
        writer.join(WAIT)
    assert box[0].result(0).ok is False


def test_close_returns_only_once_a_settle_under_way_has_run_its_callbacks():
    # A settle in another thread (the relay's result) when the daemon stops:
    # its callback queues the command's ack, and the ack thread is stopped
    # right after close returns, so close must not pass it.
    calls = PendingCalls()
    call_id, future = calls.add("model.fork", None)
    entered, release, closed = threading.Event(), threading.Event(), threading.Event()
    future.add_done_callback(lambda done: entered.set() or release.wait(WAIT))
    settler = threading.Thread(target=calls.settle, args=(call_id, CallResult.answered({"isAnswered": True, "text": "a"})), daemon=True)
    settler.start()
    try:
        assert entered.wait(WAIT)
        closer = threading.Thread(target=lambda: calls.close("the daemon is stopping") or closed.set(), daemon=True)
        closer.start()
        assert not closed.wait(0.2)  # held by the callback under way
        release.set()
        assert closed.wait(WAIT)
    finally:
        release.set()
        settler.join(WAIT)
    assert future.result(0).ok


# -- the deadlines: PendingCalls ---------------------------------------------


def test_a_call_fails_at_its_deadline_and_not_before():
    clock = Clock()
    calls = PendingCalls(clock)
    _, abort = calls.add("turn.abort", 10)
    _, prompt = calls.add("prompt.submit", None)
    clock.now = 9.9
    _, barrier = calls.add("barrier", 0)  # now the earliest: it wakes the thread
    assert barrier.result(WAIT) == CallResult.failed("barrier did not answer within 0 s")
    assert not abort.done()
    clock.now = 10.0
    calls.add("barrier", 0)[1].result(WAIT)  # falls after the abort's
    assert abort.result(0) == CallResult.failed("turn.abort did not answer within 10 s")
    assert not prompt.done()  # no deadline
    calls.close("the test is over")


def test_a_result_racing_the_deadline_settles_the_call_once():
    calls = PendingCalls()
    done = []
    races = []
    for _ in range(300):
        call_id, future = calls.add("turn.abort", 0)  # due at once: the thread races the result
        future.add_done_callback(done.append)
        races.append((calls.settle(call_id, CallResult.answered(None)), future))
    # Due after all of them: it settles only if a second settle of one of
    # them (which would raise) has not ended the deadline thread.
    calls.add("barrier", 0)[1].result(WAIT)
    assert len(done) == 300
    assert all(won == future.result(0).ok for won, future in races)
    calls.close("the test is over")


def test_a_settled_call_is_let_go_at_once_though_its_deadline_is_still_to_come():
    # Were its deadline to hold it, a lich sending large asks that forks
    # answer at once would keep 300 s of them in memory.
    calls = PendingCalls()
    calls.add("model.fork", 300)  # the earliest deadline, never answered
    call_id, future = calls.add("model.fork", 300)
    kept = weakref.ref(future)
    assert calls.settle(call_id, CallResult.answered(None))
    del future
    gc.collect()
    assert kept() is None
    calls.close("the test is over")


def test_one_thread_keeps_every_deadline_and_only_the_earliest_wakes_it():
    clock = Clock()
    calls = PendingCalls(clock)
    threads = lambda: {t for t in threading.enumerate() if t.name == "lich-call-deadlines"}  # noqa: E731
    before = threads()  # other tests' may still be ending
    try:
        calls.add("model.fork", 300)
        assert clock.looked.wait(WAIT)
        for _ in range(50):  # later deadlines, some answered at once
            call_id, _ = calls.add("model.fork", 600)
            calls.settle(call_id, CallResult.answered(None))
        assert clock.looks == 1
        assert len(threads() - before) == 1
    finally:
        calls.close("the test is over")
