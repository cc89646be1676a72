import json
import os

import pytest

from lich_control.commands import (
    ASK_PREAMBLE,
    Command,
    Discarded,
    MAX_ID_CHARS,
    Notification,
    ask_prompt,
    notification_text,
    parse_batch,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def fixture_commands():
    with open(os.path.join(FIXTURES, "commands.json")) as f:
        return json.load(f)


def test_every_fixture_command_parses_without_a_problem():
    parsed = parse_batch(fixture_commands())
    assert [c.id for c in parsed] == [f"m{i}" for i in range(1, 12)]
    assert all(isinstance(c, Command) and c.problem is None for c in parsed)


def test_fixture_fields_land_where_the_kind_uses_them():
    by_id = {c.id: c for c in parse_batch(fixture_commands())}
    assert by_id["m1"].text == "run the tests" and by_id["m1"].notification is None
    assert by_id["m3"].model == "claude-opus-4-1"
    assert by_id["m4"].model is None  # absent drops the override
    assert by_id["m5"].effort == "high" and by_id["m6"].effort is None
    assert (by_id["m7"].name, by_id["m7"].args) == ("compact", "keep the test plan")
    assert (by_id["m8"].name, by_id["m8"].args) == ("clear", None)
    assert by_id["m9"].question == "what are you working on?"
    assert by_id["m10"].notification == Notification("completed", 'session "docs" finished')


def test_notification_escapes_status_and_summary_but_not_the_text():
    command = parse_batch(fixture_commands())[9]  # m10
    text = notification_text(command.text, command.notification)
    assert text == (
        "<task-notification>\n"
        "<status>completed</status>\n"
        '<summary>session "docs" finished</summary>\n'
        '<result>Session "docs" finished the task (ticket t1). Its report:\n\n'
        "If a < b && c > d, see </result>.</result>\n"
        "</task-notification>"
    )


def test_notification_escapes_ampersand_and_angle_brackets_in_the_summary():
    text = notification_text("x", Notification("a&b<c>", 'session "a<b&c" is waiting'))
    assert "<status>a&amp;b&lt;c&gt;</status>" in text
    assert '<summary>session "a&lt;b&amp;c" is waiting</summary>' in text


def test_ask_prompt_puts_the_question_last_behind_the_preamble():
    prompt = ask_prompt("what are you working on?")
    assert prompt.startswith(ASK_PREAMBLE)
    assert prompt.endswith("what are you working on?")
    lowered = ASK_PREAMBLE.lower()
    assert "side question" in lowered and "not added to the conversation" in lowered and "no tools" in lowered


@pytest.mark.parametrize(
    "item, reason",
    [
        ("a string", "not a JSON object"),
        (["m1"], "not a JSON object"),
        (None, "not a JSON object"),
        ({"kind": "abort"}, "no id"),
        ({"id": 7, "kind": "abort"}, "not a non-empty string (a number)"),
        ({"id": "", "kind": "abort"}, "not a non-empty string (an empty string)"),
    ],
)
def test_an_item_without_a_usable_id_is_discarded_with_a_reason(item, reason):
    (parsed,) = parse_batch([item])
    assert isinstance(parsed, Discarded)
    assert reason in parsed.reason


@pytest.mark.parametrize("kind, echoed", [("abort", "abort"), ("rewind", "rewind"), (None, "unknown"), (7, "unknown")])
def test_an_id_over_the_limit_is_a_command_acked_failed_never_applied(kind, echoed):
    # lich gave it an id, so it is acked; applying it is not worth the risk.
    (parsed,) = parse_batch([{"id": "x" * 2000, "kind": kind, "text": "hi"}])
    assert isinstance(parsed, Command) and parsed.id == "x" * 2000 and parsed.kind == echoed
    assert parsed.problem == "the id is over 1,024 characters; such a command is not applied"


def test_an_id_of_exactly_the_limit_is_applied():
    (parsed,) = parse_batch([{"id": "x" * MAX_ID_CHARS, "kind": "abort"}])
    assert isinstance(parsed, Command) and parsed.problem is None


@pytest.mark.parametrize(
    "item, problem",
    [
        ({"id": "a", "kind": "rewind"}, "unknown kind"),
        ({"id": "a"}, "command has no kind"),
        ({"id": "a", "kind": 3}, "command has a kind that is not a string (a number)"),
        ({"id": "a", "kind": "prompt"}, "text must be a string (missing)"),
        ({"id": "a", "kind": "prompt", "text": 5}, "text must be a string (got a number)"),
        ({"id": "a", "kind": "prompt", "text": "x", "notification": "n"}, "notification must be an object with string status and summary"),
        ({"id": "a", "kind": "prompt", "text": "x", "notification": {"status": "s"}}, "notification must be an object"),
        ({"id": "a", "kind": "model", "model": 5}, "model must be a non-empty string, or absent to drop the override (got a number)"),
        ({"id": "a", "kind": "model", "model": ""}, "model must be a non-empty string"),
        ({"id": "a", "kind": "effort", "effort": "extreme"}, "unknown effort"),
        ({"id": "a", "kind": "effort", "effort": 3}, "unknown effort"),
        ({"id": "a", "kind": "command"}, "name must be a non-empty string (missing)"),
        ({"id": "a", "kind": "command", "name": "compact", "args": ["x"]}, "args must be a string (got an array)"),
        ({"id": "a", "kind": "ask"}, "question must be a non-empty string (missing)"),
        ({"id": "a", "kind": "ask", "question": {"q": 1}}, "question must be a non-empty string (got an object)"),
    ],
)
def test_a_command_with_bad_fields_carries_the_error_its_ack_will_give(item, problem):
    (parsed,) = parse_batch([item])
    assert isinstance(parsed, Command)
    assert parsed.problem is not None and parsed.problem.startswith(problem)


def test_an_unknown_kind_is_echoed():
    (parsed,) = parse_batch([{"id": "m12", "kind": "rewind"}])
    assert (parsed.kind, parsed.problem) == ("rewind", "unknown kind")


def test_every_documented_effort_is_accepted():
    for effort in ("low", "medium", "high", "xhigh", "max"):
        (parsed,) = parse_batch([{"id": "e", "kind": "effort", "effort": effort}])
        assert parsed.problem is None and parsed.effort == effort


def test_null_model_and_null_args_read_as_absent():
    model, command = parse_batch(
        [{"id": "a", "kind": "model", "model": None}, {"id": "b", "kind": "command", "name": "clear", "args": None}]
    )
    assert model.problem is None and model.model is None
    assert command.problem is None and command.args is None
