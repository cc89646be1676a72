"""The simulated session keeps a real session's rules where the daemon can see them.

Turns that must stay open are made long (60 s) and ended by an abort, so
nothing here depends on how fast the machine is; turns that must finish
are made instant. Every wait is a future's or a condition's, with a deadline.
"""
import threading
import time

import pytest

from lich_control.engine import Overrides, Turns
from lich_dev.sim import DEFAULT_EFFORT, DEFAULT_MODEL, FORK_FAILURES, SimEngine

LONG = 60.0
WAIT = 5.0


class Lines:
    """The session's report lines, with a condition to wait for one."""

    def __init__(self):
        self.cond = threading.Condition()
        self.lines = []

    def __call__(self, line):
        with self.cond:
            self.lines.append(line)
            self.cond.notify_all()

    def wait_for(self, text, timeout=WAIT):
        deadline = time.monotonic() + timeout
        with self.cond:
            while not any(text in line for line in self.lines):
                left = deadline - time.monotonic()
                assert left > 0, f"no line with {text!r} in {self.lines}"
                self.cond.wait(left)

    def index(self, text):
        with self.cond:
            return next(i for i, line in enumerate(self.lines) if text in line)


@pytest.fixture
def make():
    engines = []

    def build(turn_seconds=LONG, steps=2, fork_seconds=0.0):
        lines, turns = Lines(), Turns()
        engine = SimEngine(turns, report=lines, turn_seconds=turn_seconds, steps=steps, fork_seconds=fork_seconds)
        engines.append(engine)
        return engine, turns, lines

    yield build
    for engine in engines:
        engine.close("the test is over")


def test_a_prompt_starts_its_turn_at_once_when_idle(make):
    engine, turns, lines = make()
    result = engine.submit_prompt("run the tests").result(WAIT)
    assert result.ok and result.value == {"text": "run the tests"}
    assert turns.current == "t1"


def test_a_second_prompt_starts_only_once_the_running_turn_ends(make):
    engine, turns, lines = make()
    engine.submit_prompt("first").result(WAIT)
    second = engine.submit_prompt("second")
    lines.wait_for("prompt waits for turn t1 to end")
    assert not second.done()
    assert engine.abort_turn("t1").result(WAIT).ok
    assert second.result(WAIT).ok
    assert turns.current == "t2"
    assert lines.index("turn t1 aborted") < lines.index("turn t2 started")


def test_a_slash_command_runs_only_once_the_session_is_idle(make):
    engine, turns, lines = make()
    engine.submit_prompt("busy").result(WAIT)
    command = engine.run_command("compact", "keep the plan")
    lines.wait_for("command waits for turn t1 to end")
    assert not command.done()
    engine.abort_turn("t1").result(WAIT)
    assert command.result(WAIT).ok
    assert lines.index("turn t1 aborted") < lines.index("ran /compact keep the plan")


def test_a_slash_command_named_fail_is_rejected(make):
    engine, _, _ = make()
    result = engine.run_command("fail", None).result(WAIT)
    assert not result.ok and result.error == "unknown command /fail"


def test_an_abort_naming_another_turn_is_rejected_and_leaves_the_turn_running(make):
    engine, turns, _ = make()
    engine.submit_prompt("busy").result(WAIT)
    result = engine.abort_turn("t9").result(WAIT)
    assert not result.ok and "t9 is not the running turn" in result.error
    assert turns.current == "t1"


def test_an_abort_with_no_turn_is_rejected(make):
    engine, _, _ = make()
    result = engine.abort_turn("t1").result(WAIT)
    assert not result.ok and "running: none" in result.error


def test_an_abort_settles_when_the_turn_has_ended(make):
    engine, turns, lines = make()
    engine.submit_prompt("busy").result(WAIT)
    assert engine.abort_turn("t1").result(WAIT).ok
    assert turns.current is None
    lines.wait_for("turn t1 aborted")


def test_a_prompt_starting_drop_is_dropped_with_its_reason(make):
    engine, turns, _ = make()
    result = engine.submit_prompt("drop: a plugin said no").result(WAIT)
    assert result.ok and result.value == {"drop": "a plugin said no"}
    assert turns.current is None


def test_a_notification_prompt_is_reported_as_the_users(make):
    engine, _, lines = make()
    engine.submit_prompt("<task-notification>…", as_user=True).result(WAIT)
    lines.wait_for("as the user, a task notification")


def test_every_request_is_recorded_with_the_overrides_in_force(make):
    engine, _, lines = make(turn_seconds=0.0, steps=3)
    engine.set_overrides(Overrides(model="m-x", effort="high")).result(WAIT)
    engine.submit_prompt("one").result(WAIT)
    lines.wait_for("turn t1 answered")
    engine.set_overrides(Overrides()).result(WAIT)
    engine.submit_prompt("two").result(WAIT)
    lines.wait_for("turn t2 answered")
    assert engine.steps_sent == [
        {"turn": "t1", "index": 0, "model": "m-x", "effort": "high"},
        {"turn": "t1", "index": 1, "model": "m-x", "effort": "high"},
        {"turn": "t1", "index": 2, "model": "m-x", "effort": "high"},
        {"turn": "t2", "index": 0, "model": DEFAULT_MODEL, "effort": DEFAULT_EFFORT},
        {"turn": "t2", "index": 1, "model": DEFAULT_MODEL, "effort": DEFAULT_EFFORT},
        {"turn": "t2", "index": 2, "model": DEFAULT_MODEL, "effort": DEFAULT_EFFORT},
    ]


def test_a_fork_answers_beside_the_running_turn(make):
    engine, turns, _ = make()
    engine.submit_prompt("write the changelog").result(WAIT)
    result = engine.fork("preamble\n\nQuestion: what now?").result(WAIT)
    assert result.ok and result.value["isAnswered"] is True
    assert "turn t1" in result.value["text"]
    assert turns.current == "t1"  # the turn was not disturbed


@pytest.mark.parametrize("reason", sorted(FORK_FAILURES))
def test_a_fork_told_to_fail_fails_with_that_reason(make, reason):
    engine, _, _ = make()
    result = engine.fork(f"Question: please fail:{reason}").result(WAIT)
    assert result.ok and result.value["isAnswered"] is False
    assert result.value["reason"] == reason


def test_close_fails_what_waits_and_what_comes_after(make):
    engine, _, _ = make()
    engine.submit_prompt("busy").result(WAIT)
    waiting = engine.submit_prompt("behind it")
    engine.close("the daemon is stopping")
    assert waiting.result(WAIT).error == "the daemon is stopping"
    assert engine.run_command("clear", None).result(WAIT).error == "the daemon is stopping"



def test_a_closed_session_fails_every_call_at_once():
    from lich_control.engine import Overrides, Turns
    from lich_dev.sim import SimEngine

    engine = SimEngine(Turns(), turn_seconds=0.1, steps=1, fork_seconds=0.01)
    engine.close("the daemon is stopping")
    futures = [engine.abort_turn("t1"), engine.fork("q"), engine.set_overrides(Overrides("m", None)), engine.submit_prompt("p"), engine.run_command("c", None)]
    assert [f.result(timeout=1).error for f in futures] == ["the daemon is stopping"] * 5
