import threading

import pytest

from lich_control.acks import Acks
from lich_control.bridge import CallResult, Overrides, Turns
from lich_control.commands import Command, Notification
from lich_control.activity import Activity
from lich_control.worker import ASK_THREADS, QUICK_TIMEOUT, Asks, Worker, fork_ack

from fakes import FakeEngine, ScriptedClient, Timeline, refused

WAIT = 5.0


class Rig:
    def __init__(self, ack_errors=(), activity=Activity):
        self.timeline = Timeline()  # the engine's calls and the acks, in one order
        self.engine = FakeEngine(self.timeline)
        self.client = ScriptedClient(ack_errors=ack_errors, timeline=self.timeline)
        self.turns = Turns()
        self.activity = activity("s1", "fake", self.turns)
        self.acks = Acks(lambda: self.client, self.activity)
        self.worker = Worker(self.engine, self.turns, self.acks, self.activity, "s1")
        self.asks = Asks(self.engine, self.acks, self.activity, "s1")

    def send(self, *commands):
        for command in commands:
            self.activity.received(command.id, command.kind)
            (self.asks.submit if command.kind == "ask" and command.problem is None else self.worker.submit)(command)

    def acks_sent(self, n):
        return [(a.id, a.ok, a.error) for a in self.client.wait_acks(n)]

    def close(self):
        assert self.asks.stop(WAIT)
        self.engine.close("the test is over")  # an awaited call left unanswered ends here
        assert self.worker.stop(WAIT)
        assert self.acks.stop(WAIT)


@pytest.fixture
def make_rig():
    rigs = []
    yield lambda **kw: rigs.append(Rig(**kw)) or rigs[-1]
    for r in rigs:
        r.close()


@pytest.fixture
def rig(make_rig):
    return make_rig()


def prompt(cid="m1", text="run the tests", **kw):
    return Command(id=cid, kind="prompt", text=text, **kw)


def rewind(cid):
    return Command(id=cid, kind="rewind", problem="unknown kind")


# -- the ordered commands ----------------------------------------------------------


def test_a_prompt_is_submitted_and_acked_from_the_pool_once_its_turn_starts(rig):
    rig.send(prompt())
    assert rig.engine.wait_calls(1) == [("prompt.submit", {"text": "run the tests"}, None)]  # no deadline
    assert rig.client.acks == []  # not before the session answers
    rig.engine.settle(0, {"text": "run the tests"})
    assert rig.acks_sent(1) == [("m1", True, None)]
    assert rig.timeline.entries[-1][0].startswith("lich-ack")


def test_a_notification_prompt_goes_as_the_user_in_the_task_notification_shape(rig):
    rig.send(prompt("m11", "t", notification=Notification(status="waiting", summary="a<b")))
    (call,) = rig.engine.wait_calls(1)
    assert call[1] == {"text": "<task-notification>\n<status>waiting</status>\n<summary>a&lt;b</summary>\n<result>t</result>\n</task-notification>", "asUser": True}


def test_a_dropped_prompt_acks_the_drop_reason(rig):
    rig.send(prompt())
    rig.engine.wait_calls(1)
    rig.engine.settle(0, {"drop": "a plugin dropped it"})
    assert rig.acks_sent(1) == [("m1", False, "a plugin dropped it")]


def test_a_slash_command_passes_args_only_when_given_and_a_rejection_acks_its_message(rig):
    rig.send(Command(id="m7", kind="command", name="compact", args="keep it"), Command(id="m8", kind="command", name="clear"))
    calls = rig.engine.wait_calls(2)
    assert [c[1] for c in calls] == [{"command": "compact", "args": "keep it"}, {"command": "clear"}]
    rig.engine.settle(0, error="no such command: compact")
    assert rig.acks_sent(1) == [("m7", False, "no such command: compact")]


def test_nothing_waits_on_a_prompt_or_slash_command(rig):
    rig.turns.started("t1")
    rig.send(prompt(), Command(id="m7", kind="command", name="compact"), Command(id="m2", kind="abort"))
    calls = rig.engine.wait_calls(3)
    assert calls[2] == ("turn.abort", {"turnId": "t1"}, QUICK_TIMEOUT)  # the running turn, not the prompt's
    rig.engine.settle(2)
    assert rig.acks_sent(1) == [("m2", True, None)]  # acked while the prompt still waits


def test_the_next_command_waits_for_the_abort_to_be_acked(rig):
    rig.turns.started("t1")
    rig.send(Command(id="m2", kind="abort"), Command(id="m3", kind="model", model="opus"))
    rig.engine.wait_calls(1)
    rig.engine.settle(0)
    rig.engine.wait_calls(2)
    # One thread, in this order: m3's call could not start before m2's ack had
    # returned, whatever the timing. An ack sent from elsewhere, or after the
    # next call, would show here.
    assert rig.timeline.entries == [("lich-worker", "call turn.abort"), ("lich-worker", "acked m2"), ("lich-worker", "call overrides.set")]


def test_model_and_effort_replace_one_override_each_and_absent_drops_it(rig):
    rig.send(
        Command(id="m3", kind="model", model="claude-opus-4-1"),
        Command(id="m5", kind="effort", effort="high"),
        Command(id="m4", kind="model"),
        Command(id="m6", kind="effort"),
    )
    for i in range(4):
        rig.engine.wait_calls(i + 1)
        rig.engine.settle(i)
    assert [c[1:] for c in rig.engine.calls] == [
        ({"model": "claude-opus-4-1", "effort": None}, QUICK_TIMEOUT),
        ({"model": "claude-opus-4-1", "effort": "high"}, QUICK_TIMEOUT),
        ({"model": None, "effort": "high"}, QUICK_TIMEOUT),
        ({"model": None, "effort": None}, QUICK_TIMEOUT),
    ]
    assert [a[1] for a in rig.acks_sent(4)] == [True] * 4
    assert rig.worker.overrides == Overrides()


def test_an_override_the_relay_rejects_is_not_remembered(rig):
    rig.send(Command(id="m3", kind="model", model="opus"))
    rig.engine.wait_calls(1)
    rig.engine.settle(0, error="relay says no")
    assert rig.acks_sent(1) == [("m3", False, "relay says no")]
    assert rig.worker.overrides == Overrides()


def test_a_command_that_cannot_be_applied_is_acked_with_its_problem_and_its_kind_without_a_call(rig):
    rig.send(Command(id="m5", kind="effort", problem="unknown effort"), rewind("m12"), Command(id="m2", kind="abort"))
    acks = rig.client.wait_acks(3)
    assert [(a.kind, a.ok, a.error) for a in acks] == [("effort", False, "unknown effort"), ("rewind", False, "unknown kind"), ("abort", False, "no turn is running")]
    assert rig.engine.calls == []


def test_an_ack_that_cannot_be_sent_is_dropped_and_the_next_command_runs(make_rig):
    rig = make_rig(ack_errors=[refused("400 bad"), None])
    rig.send(rewind("m12"), rewind("m13"))
    assert rig.acks_sent(1) == [("m13", False, "unknown kind")]
    assert [what for _, what in rig.timeline.entries] == ["ack failed m12", "acked m13"]  # one attempt each


class Failing(Activity):
    """Fails on purpose where m12's ack is sent and where a1's fork is asked."""

    def waiting(self, cid, on):
        if (cid, on) in {("m12", "ack"), ("a1", "fork")}:
            raise RuntimeError("on purpose")
        super().waiting(cid, on)


def test_a_command_that_fails_unexpectedly_costs_itself_alone(make_rig, caplog):
    rig = make_rig(activity=Failing)
    rig.send(rewind("m12"), rewind("m13"))
    assert rig.acks_sent(1) == [("m13", False, "unknown kind")]
    assert "m12 (rewind) was lost" in caplog.text and "RuntimeError: on purpose" in caplog.text


def test_stop_lets_the_ack_under_way_finish_and_acks_what_was_queued_as_never_applied(rig):
    rig.turns.started("t1")
    rig.send(Command(id="m2", kind="abort"), Command(id="m3", kind="model", model="x"))
    rig.engine.wait_calls(1)
    assert rig.worker.stop(0, "got SIGTERM") is False  # stop arrives while the abort is applied
    rig.engine.settle(0)
    assert rig.worker.stop(WAIT)
    assert [c[0] for c in rig.engine.calls] == ["turn.abort"]
    assert rig.acks_sent(2) == [("m2", True, None), ("m3", False, "the daemon stopped before applying it (got SIGTERM)")]


def test_a_command_or_an_ask_that_comes_once_they_have_stopped_is_acked_as_never_applied(rig):
    rig.worker.stop(WAIT, "lich answered 404")
    rig.asks.stop(WAIT, "lich answered 404")
    rig.send(Command(id="m4", kind="model", model="x"), ask("a1", "still there?"))
    said = "the daemon stopped before applying it (lich answered 404)"
    assert rig.acks_sent(2) == [("m4", False, said), ("a1", False, said)]
    assert rig.engine.calls == []


# -- asks ----------------------------------------------------------------------------


def ask(cid, question):
    return Command(id=cid, kind="ask", question=question)


def test_asks_start_at_once_beyond_the_pool_and_each_is_acked_when_it_answers(rig):
    rig.send(*[ask(f"h{i}", f"hang {i}?") for i in range(10)], ask("a1", "quick?"), rewind("m12"))
    assert rig.acks_sent(1) == [("m12", False, "unknown kind")]  # not held back by the asks
    calls = rig.engine.wait_calls(11)  # a fork in flight holds no thread: all started, none answered
    assert {c[0] for c in calls} == {"model.fork"} and {c[2] for c in calls} == {300}
    quick = next(i for i, c in enumerate(calls) if c[1]["prompt"].endswith("quick?"))
    rig.engine.settle(quick, {"isAnswered": True, "text": "at once"})
    ack = rig.client.wait_acks(2)[1]
    assert (ack.id, ack.ok, ack.answer) == ("a1", True, "at once")


class Held(FakeEngine):
    """A relay that does not read stdout: each call's write blocks until released."""

    def __init__(self, timeline):
        super().__init__(timeline)
        self.release = threading.Event()

    def call(self, method, args, timeout):
        future = super().call(method, args, timeout)
        self.release.wait(WAIT)
        return future


def test_asks_start_on_the_bounded_named_pool_and_those_not_started_at_a_stop_are_acked_as_never_asked(rig):
    rig.engine = Held(rig.timeline)
    rig.asks = Asks(rig.engine, rig.acks, rig.activity, "s1")
    rig.send(*[ask(f"a{i}", f"q{i}?") for i in range(ASK_THREADS + 3)])
    rig.engine.wait_calls(ASK_THREADS)  # every pool thread is held in its write
    assert {name for name, what in rig.timeline.entries if what == "call model.fork"} == {f"lich-ask_{i}" for i in range(ASK_THREADS)}
    assert rig.asks.stop(0.05, "got SIGTERM") is False  # the held writes overrun
    said = "the daemon stopped before applying it (got SIGTERM)"
    assert sorted(rig.acks_sent(3)) == [(f"a{i}", False, said) for i in range(ASK_THREADS, ASK_THREADS + 3)]
    rig.engine.release.set()
    assert rig.asks.stop(WAIT)
    assert len(rig.engine.calls) == ASK_THREADS


def test_an_ask_that_fails_unexpectedly_is_said_and_costs_no_other(make_rig, caplog):
    rig = make_rig(activity=Failing)
    rig.send(ask("a1", "first?"), ask("a2", "second?"))
    (call,) = rig.engine.wait_calls(1)
    assert call[1]["prompt"].endswith("second?")
    assert "the ask a1 was lost" in caplog.text and "RuntimeError: on purpose" in caplog.text


@pytest.mark.parametrize(
    "result, ok, error, answer",
    [
        (CallResult.answered({"isAnswered": True, "text": "yes"}), True, None, "yes"),
        (CallResult.answered({"isAnswered": False, "reason": "nothing-to-fork"}), False, "nothing-to-fork", None),
        (CallResult.answered({"isAnswered": False, "reason": "api-error", "status": 529, "error": "overloaded"}), False, "api-error 529 overloaded", None),
        (CallResult.answered({"isAnswered": False, "reason": "api-error", "status": None, "error": "unknown"}), False, "api-error null unknown", None),
        (CallResult.answered({"isAnswered": False, "reason": "empty-reply"}), False, "empty-reply", None),
        (CallResult.answered({"isAnswered": False, "reason": "aborted"}), False, "aborted", None),
        (CallResult.failed("no prompt"), False, "no prompt", None),
    ],
)
def test_a_forks_result_makes_the_asks_ack(result, ok, error, answer):
    ack = fork_ack("s1", ask("m9", "q"), result)
    assert (ack.kind, ack.ok, ack.error, ack.answer) == ("ask", ok, error, answer)
