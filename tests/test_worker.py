import pytest

from lich_control.acker import Acker
from lich_control.activity import Activity
from lich_control.asks import Asks, fork_ack
from lich_control.commands import Command, parse_batch
from lich_control.engine import CallResult, Overrides, Turns
from lich_control.worker import Worker

from fakes import FakeEngine, ScriptedClient, Timeline, refused


class Rig:
    def __init__(self, ack_errors=(), quick_timeout=5.0, activity=Activity, engine=FakeEngine):
        self.timeline = Timeline()  # the engine's calls and the acks, in one order
        self.engine = engine(self.timeline)
        self.client = ScriptedClient(ack_errors=ack_errors, timeline=self.timeline)
        self.turns = Turns()
        self.activity = activity("s1", "fake", self.turns)
        factory = lambda: self.client  # noqa: E731
        self.acker = Acker(factory, self.activity)
        self.worker = Worker(self.engine, self.turns, self.acker, factory, self.activity, "s1", quick_timeout=quick_timeout)
        self.asks = Asks(self.engine, factory, self.activity, "s1", size=4)
        self.acker.start()
        self.worker.start()

    def send(self, *items):
        for command in parse_batch(list(items)):
            self.activity.received(command.id, command.kind)
            (self.asks.submit if command.kind == "ask" and command.problem is None else self.worker.submit)(command)

    def acks(self, n):
        return [(a.id, a.ok, a.error) for a in self.client.wait_acks(n)]

    def close(self):
        for _, _, future in self.engine.calls:  # pool threads are joined at exit
            if not future.done():
                future.set_result(CallResult.failed("the test is over"))
        self.asks.stop()
        assert self.worker.stop(5) and self.acker.stop(5)


@pytest.fixture
def rig():
    r = Rig()
    yield r
    r.close()


def test_a_prompt_is_submitted_and_acked_when_its_turn_starts(rig):
    rig.send({"id": "m1", "kind": "prompt", "text": "run the tests"})
    (call,) = rig.engine.wait_calls(1)
    assert call[:2] == ("prompt.submit", ("run the tests", False))
    assert rig.client.acks == []  # not before the session answers
    rig.engine.settle(0, {"text": "run the tests"})
    assert rig.acks(1) == [("m1", True, None)]


def test_a_notification_prompt_goes_as_the_user_in_the_task_notification_shape(rig):
    rig.send({"id": "m11", "kind": "prompt", "text": "t", "notification": {"status": "waiting", "summary": "a<b"}})
    (call,) = rig.engine.wait_calls(1)
    text, as_user = call[1]
    assert as_user is True
    assert text == "<task-notification>\n<status>waiting</status>\n<summary>a&lt;b</summary>\n<result>t</result>\n</task-notification>"


def test_a_dropped_prompt_acks_the_drop_reason(rig):
    rig.send({"id": "m1", "kind": "prompt", "text": "x"})
    rig.engine.wait_calls(1)
    rig.engine.settle(0, {"drop": "a plugin dropped it"})
    assert rig.acks(1) == [("m1", False, "a plugin dropped it")]


def test_a_rejected_call_acks_its_message_as_given(rig):
    rig.send({"id": "m7", "kind": "command", "name": "compact", "args": "keep it"})
    (call,) = rig.engine.wait_calls(1)
    assert call[:2] == ("command.run", ("compact", "keep it"))
    rig.engine.settle(0, error="no such command: compact")
    assert rig.acks(1) == [("m7", False, "no such command: compact")]


def test_nothing_waits_on_a_prompt_or_slash_command(rig):
    rig.turns.started("t1")
    rig.send(
        {"id": "m1", "kind": "prompt", "text": "x"},
        {"id": "m7", "kind": "command", "name": "compact"},
        {"id": "m2", "kind": "abort"},
    )
    calls = rig.engine.wait_calls(3)
    assert [c[0] for c in calls] == ["prompt.submit", "command.run", "turn.abort"]
    assert calls[2][1] == ("t1",)  # the running turn, not the prompt's
    rig.engine.settle(2)
    assert rig.acks(1) == [("m2", True, None)]  # acked while the prompt still waits


def test_an_abort_with_no_turn_running_says_so(rig):
    rig.send({"id": "m2", "kind": "abort"})
    assert rig.acks(1) == [("m2", False, "no turn is running")]
    assert rig.engine.calls == []


def test_the_next_command_waits_for_the_abort_to_be_acked(rig):
    rig.turns.started("t1")
    rig.send({"id": "m2", "kind": "abort"}, {"id": "m3", "kind": "model", "model": "opus"})
    rig.engine.wait_calls(1)
    rig.engine.settle(0)
    rig.engine.wait_calls(2)
    # One thread, in this order: m3's call could not start before m2's ack had
    # returned, whatever the timing. An ack sent from elsewhere, or after the
    # next call, would show here.
    assert rig.timeline.entries == [("lich-worker", "call turn.abort"), ("lich-worker", "acked m2"), ("lich-worker", "call overrides.set")]


def test_model_and_effort_replace_one_override_each_and_absent_drops_it(rig):
    rig.send(
        {"id": "m3", "kind": "model", "model": "claude-opus-4-1"},
        {"id": "m5", "kind": "effort", "effort": "high"},
        {"id": "m4", "kind": "model"},
        {"id": "m6", "kind": "effort"},
    )
    for i in range(4):
        rig.engine.wait_calls(i + 1)
        rig.engine.settle(i)
    sent = [c[1][0] for c in rig.engine.wait_calls(4)]
    assert sent == [
        Overrides("claude-opus-4-1", None),
        Overrides("claude-opus-4-1", "high"),
        Overrides(None, "high"),
        Overrides(None, None),
    ]
    assert [a[1] for a in rig.acks(4)] == [True] * 4
    assert rig.worker.overrides == Overrides()


def test_an_override_the_relay_rejects_is_not_remembered(rig):
    rig.send({"id": "m3", "kind": "model", "model": "opus"})
    rig.engine.wait_calls(1)
    rig.engine.settle(0, error="relay says no")
    assert rig.acks(1) == [("m3", False, "relay says no")]
    assert rig.worker.overrides == Overrides()


def test_an_unknown_effort_is_refused_without_a_call(rig):
    rig.send({"id": "m5", "kind": "effort", "effort": "extreme"})
    assert rig.acks(1) == [("m5", False, "unknown effort")]
    assert rig.engine.calls == []


def test_an_unknown_kind_is_acked_with_its_kind_echoed(rig):
    rig.send({"id": "m12", "kind": "rewind"})
    (ack,) = rig.client.wait_acks(1)
    assert (ack.kind, ack.ok, ack.error) == ("rewind", False, "unknown kind")


def test_an_ack_that_cannot_be_sent_is_dropped_and_the_next_command_runs():
    rig = Rig(ack_errors=[refused("400 bad"), None])
    try:
        rig.send({"id": "m12", "kind": "rewind"}, {"id": "m13", "kind": "rewind"})
        assert rig.acks(1) == [("m13", False, "unknown kind")]
        counts = rig.activity.snapshot()["counts"]["rewind"]
        assert counts == {"ok": 0, "failed": 2, "unsent": 1}
    finally:
        rig.close()


def test_an_ack_that_fails_unexpectedly_is_not_sent_twice_and_the_worker_lives():
    rig = Rig(ack_errors=[RuntimeError("a bug in the client"), RuntimeError("and again")])
    try:
        rig.send({"id": "m12", "kind": "rewind"}, {"id": "m13", "kind": "rewind"}, {"id": "m14", "kind": "rewind"})
        assert rig.acks(1) == [("m14", False, "unknown kind")]
        acks = [what for _, what in rig.timeline.entries if what.startswith("ack")]
        assert acks == ["ack failed m12", "ack failed m13", "acked m14"]  # one attempt each
        assert rig.activity.snapshot()["counts"]["rewind"]["unsent"] == 2
    finally:
        rig.close()


def test_a_quick_call_that_never_answers_fails_with_a_clear_error():
    rig = Rig(quick_timeout=0.05)
    try:
        rig.send({"id": "m3", "kind": "model", "model": "opus"})
        assert rig.acks(1) == [("m3", False, "overrides.set did not answer within 0.05 s")]
    finally:
        rig.close()


def test_asks_start_at_once_and_are_acked_when_they_answer(rig):
    rig.turns.started("t1")
    rig.send({"id": "a1", "kind": "ask", "question": "one?"}, {"id": "a2", "kind": "ask", "question": "two?"})
    calls = rig.engine.wait_calls(2)
    assert {c[0] for c in calls} == {"model.fork"}
    assert all(c[1][0].endswith(("one?", "two?")) for c in calls)
    second = next(i for i, c in enumerate(calls) if c[1][0].endswith("two?"))
    rig.engine.settle(second, {"isAnswered": True, "text": "answer two"})
    (ack,) = rig.client.wait_acks(1)
    assert (ack.id, ack.ok, ack.answer) == ("a2", True, "answer two")


def test_an_ask_does_not_hold_back_the_ordered_commands(rig):
    rig.send({"id": "a1", "kind": "ask", "question": "q?"}, {"id": "m12", "kind": "rewind"})
    assert rig.acks(1) == [("m12", False, "unknown kind")]


@pytest.mark.parametrize(
    "value, error",
    [
        ({"isAnswered": False, "reason": "nothing-to-fork"}, "nothing-to-fork"),
        ({"isAnswered": False, "reason": "api-error", "status": 529, "error": "overloaded"}, "api-error 529 overloaded"),
        ({"isAnswered": False, "reason": "api-error", "status": None, "error": "unknown"}, "api-error null unknown"),
        ({"isAnswered": False, "reason": "empty-reply"}, "empty-reply"),
        ({"isAnswered": False, "reason": "aborted"}, "aborted"),
    ],
)
def test_a_fork_that_did_not_answer_acks_its_reason(value, error):
    command = Command(id="m9", kind="ask", question="q")
    ack = fork_ack("s1", command, CallResult.answered(value))
    assert (ack.ok, ack.error, ack.answer) == (False, error, None)


def test_a_rejected_fork_acks_the_rejection():
    ack = fork_ack("s1", Command(id="m9", kind="ask", question="q"), CallResult.failed("no prompt"))
    assert (ack.ok, ack.error) == (False, "no prompt")


def test_stop_starts_nothing_new(rig):
    rig.turns.started("t1")
    rig.send({"id": "m2", "kind": "abort"}, {"id": "m3", "kind": "model", "model": "x"})
    rig.engine.wait_calls(1)
    rig.worker._stopping.set()  # stop arrives while the abort is applied
    rig.engine.settle(0)
    assert rig.worker.stop(5)
    assert [c[0] for c in rig.engine.calls] == ["turn.abort"]
    assert [a.id for a in rig.client.acks] == ["m2"]  # the ack under way finished


def test_asks_beyond_the_pool_size_start_at_once_and_hold_nothing_back():
    rig = Rig()
    rig.asks.stop()
    rig.asks = Asks(rig.engine, lambda: rig.client, rig.activity, "s1", size=2)
    try:
        rig.send(
            {"id": "a1", "kind": "ask", "question": "one?"},
            {"id": "a2", "kind": "ask", "question": "two?"},
            {"id": "a3", "kind": "ask", "question": "three?"},
            {"id": "m12", "kind": "rewind"},
        )
        assert rig.acks(1) == [("m12", False, "unknown kind")]  # not held back by the asks
        # A fork in flight holds no pool thread: the third starts with none answered.
        calls = rig.engine.wait_calls(3)
        assert calls[2][1][0].endswith("three?")
        rig.engine.settle(2, {"isAnswered": True, "text": "third"})
        assert rig.acks(2)[1] == ("a3", True, None)
    finally:
        rig.close()
