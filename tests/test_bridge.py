import io
import json

import pytest

from lich_control.bridge import BadMessage, Bridge
from lich_control.engine import Overrides, Turns


class Out(io.BytesIO):
    def lines(self):
        return [json.loads(line) for line in self.getvalue().splitlines()]


class BrokenOut:
    def write(self, data):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass


@pytest.fixture
def wire():
    out, turns, broken = Out(), Turns(), []
    return Bridge(out, turns, on_broken=broken.append), out, turns, broken


def test_each_engine_call_is_one_json_line_in_the_bridge_shape(wire):
    bridge, out, _, _ = wire
    bridge.submit_prompt("run the tests")
    bridge.submit_prompt("<task-notification>…", as_user=True)
    bridge.abort_turn("t1")
    bridge.run_command("compact", "keep the test plan")
    bridge.run_command("clear", None)
    bridge.fork("<preamble>Question: q")
    bridge.set_overrides(Overrides("claude-opus-4-1", None))
    assert out.lines() == [
        {"op": "call", "id": "c1", "method": "prompt.submit", "args": {"text": "run the tests"}},
        {"op": "call", "id": "c2", "method": "prompt.submit", "args": {"text": "<task-notification>…", "asUser": True}},
        {"op": "call", "id": "c3", "method": "turn.abort", "args": {"turnId": "t1"}},
        {"op": "call", "id": "c4", "method": "command.run", "args": {"command": "compact", "args": "keep the test plan"}},
        {"op": "call", "id": "c5", "method": "command.run", "args": {"command": "clear"}},
        {"op": "call", "id": "c6", "method": "model.fork", "args": {"prompt": "<preamble>Question: q"}},
        {"op": "call", "id": "c7", "method": "overrides.set", "args": {"model": "claude-opus-4-1", "effort": None}},
    ]


def test_a_result_settles_the_call_it_names_in_any_order(wire):
    bridge, _, _, _ = wire
    first, second = bridge.submit_prompt("a"), bridge.fork("b")
    bridge.result({"id": "c2", "ok": True, "value": {"isAnswered": True, "text": "x"}})
    assert second.done() and not first.done()
    bridge.result({"id": "c1", "ok": False, "error": "dropped"})
    assert (first.result().ok, first.result().error) == (False, "dropped")
    assert second.result().value == {"isAnswered": True, "text": "x"}


def test_a_result_with_no_value_is_null(wire):
    bridge, _, _, _ = wire
    future = bridge.abort_turn("t1")
    bridge.result({"id": "c1", "ok": True})
    assert future.result().ok and future.result().value is None


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


def test_an_unknown_call_id_is_ignored(wire):
    bridge, _, _, _ = wire
    waiting = bridge.submit_prompt("x")  # c1
    bridge.result({"id": "c404", "ok": True, "value": None})
    assert not waiting.done()  # it settled nothing
    bridge.result({"id": "c1", "ok": True, "value": {"text": "x"}})
    assert waiting.result(0).value == {"text": "x"}


def test_events_move_the_recorded_turn(wire):
    bridge, _, turns, _ = wire
    bridge.event({"event": "turn.start", "turnId": "t1"})
    assert turns.current == "t1"
    bridge.event({"event": "turn.complete", "turnId": "sub-1"})
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


def test_an_unknown_event_is_ignored(wire):
    bridge, _, turns, _ = wire
    bridge.event({"event": "turn.pause", "turnId": "t1"})
    assert turns.current is None


def test_a_broken_stdout_fails_the_call_and_asks_the_daemon_to_stop():
    broken = []
    bridge = Bridge(BrokenOut(), Turns(), on_broken=broken.append)
    future = bridge.submit_prompt("x")
    assert future.result(timeout=1).ok is False
    assert "the relay is gone" in future.result().error
    assert broken == ["writing to stdout failed"]
    later = bridge.fork("q")
    assert later.result(timeout=1).error == future.result().error


def test_close_fails_every_waiting_call(wire):
    bridge, _, _, _ = wire
    waiting = [bridge.submit_prompt("a"), bridge.fork("b")]
    bridge.close("the daemon is stopping")
    assert [f.result(timeout=1).error for f in waiting] == ["the daemon is stopping"] * 2


def test_the_hello_line(wire):
    bridge, out, _, _ = wire
    bridge.hello("/run/x/s1.sock")
    (hello,) = out.lines()
    assert hello["op"] == "hello" and hello["protocol"] == 1 and hello["socket"] == "/run/x/s1.sock"
    assert set(hello) == {"op", "protocol", "pid", "socket", "version"}
