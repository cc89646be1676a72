"""The simulated session keeps a real session's rules where the daemon can see them.

Turns that must stay open are made long (60 s) and ended by an abort, so
nothing here depends on how fast the machine is; turns that must finish
are made instant. Every wait is a future's or a condition's, with a deadline.
"""
import threading

import pytest

from lich_control.bridge import Turns
from lich_dev.sim import SimEngine

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

    def wait_for(self, text):
        with self.cond:
            assert self.cond.wait_for(lambda: any(text in line for line in self.lines), WAIT), self.lines

    def index(self, text):
        with self.cond:
            return next(i for i, line in enumerate(self.lines) if text in line)


def prompt(engine, text):
    return engine.call("prompt.submit", {"text": text}, None)


def abort(engine, turn_id):
    return engine.call("turn.abort", {"turnId": turn_id}, 10)


def command(engine, name, args=None):
    return engine.call("command.run", {"command": name} if args is None else {"command": name, "args": args}, None)


def overrides(engine, model=None, effort=None):
    return engine.call("overrides.set", {"model": model, "effort": effort}, 10)


def fork(engine, prompt_text):
    return engine.call("model.fork", {"prompt": prompt_text}, 300)


@pytest.fixture
def make():
    engines = []

    def build(turn_seconds=LONG, steps=2):
        lines, turns = Lines(), Turns()
        engine = SimEngine(turns, report=lines, turn_seconds=turn_seconds, steps=steps, fork_seconds=0.0)
        engines.append(engine)
        return engine, turns, lines

    yield build
    for engine in engines:
        engine.close("the test is over")


def test_a_prompt_starts_its_turn_at_once_when_idle_and_the_next_once_it_ends(make):
    engine, turns, lines = make()
    result = prompt(engine, "first").result(WAIT)
    assert result.ok and result.value == {"text": "first"} and turns.current == "t1"
    second = prompt(engine, "second")
    lines.wait_for("prompt waits for turn t1 to end")
    assert not second.done()
    assert abort(engine, "t1").result(WAIT).ok
    assert second.result(WAIT).ok and turns.current == "t2"
    assert lines.index("turn t1 aborted") < lines.index("turn t2 started")


def test_a_slash_command_runs_only_once_the_session_is_idle_and_fail_is_rejected(make):
    engine, turns, lines = make()
    prompt(engine, "busy").result(WAIT)
    waiting = command(engine, "compact", "keep the plan")
    lines.wait_for("command waits for turn t1 to end")
    assert not waiting.done()
    abort(engine, "t1").result(WAIT)
    assert turns.current is None  # the abort settles once the turn has ended
    assert waiting.result(WAIT).ok
    assert lines.index("turn t1 aborted") < lines.index("ran /compact keep the plan")
    assert command(engine, "fail").result(WAIT).error == "unknown command /fail"


def test_an_abort_naming_no_running_turn_is_rejected_and_leaves_the_turn_alone(make):
    engine, turns, _ = make()
    assert "running: none" in abort(engine, "t1").result(WAIT).error
    prompt(engine, "busy").result(WAIT)
    assert "t9 is not the running turn" in abort(engine, "t9").result(WAIT).error
    assert turns.current == "t1"


def test_a_fork_answers_beside_the_running_turn(make):
    engine, turns, _ = make()
    prompt(engine, "write the changelog").result(WAIT)
    result = fork(engine, "preamble\n\nQuestion: what now?").result(WAIT)
    assert result.ok and result.value["isAnswered"] is True and "turn t1" in result.value["text"]
    assert turns.current == "t1"  # the turn was not disturbed


def test_close_fails_what_waits_and_every_call_after(make):
    engine, _, _ = make()
    prompt(engine, "busy").result(WAIT)
    waiting = prompt(engine, "behind it")
    engine.close("the daemon is stopping")
    later = [abort(engine, "t1"), fork(engine, "q"), overrides(engine, "m"), prompt(engine, "p"), command(engine, "c")]
    assert [f.result(WAIT).error for f in [waiting] + later] == ["the daemon is stopping"] * 6


