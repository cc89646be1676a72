"""commands: each command of a poll answer checked once (`Command.from_json`),
and the texts made of them."""
import json
import os

import pytest

from lich_control.commands import ASK_PREAMBLE, EFFORTS, Command, Notification, ask_prompt, notification_text

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def fixture_commands():
    with open(os.path.join(FIXTURES, "commands.json")) as f:
        return [Command.from_json(item) for item in json.load(f)]


# -- Command.from_json ------------------------------------------------------------------------


def test_every_fixture_command_parses_with_its_fields_where_its_kind_uses_them():
    parsed = fixture_commands()
    assert [c.id for c in parsed] == [f"m{i}" for i in range(1, 12)]
    assert all(isinstance(c, Command) and c.problem is None for c in parsed)
    by_id = {c.id: c for c in parsed}
    assert by_id["m1"].text == "run the tests" and by_id["m1"].notification is None
    assert by_id["m3"].model == "claude-opus-4-1"
    assert by_id["m4"].model is None  # absent drops the override
    assert by_id["m5"].effort == "high" and by_id["m6"].effort is None
    assert (by_id["m7"].name, by_id["m7"].args) == ("compact", "keep the test plan")
    assert (by_id["m8"].name, by_id["m8"].args) == ("clear", None)
    assert by_id["m9"].question == "what are you working on?"
    assert by_id["m10"].notification == Notification("completed", 'session "docs" finished')


@pytest.mark.parametrize("item", ["a string", ["m1"], None, {"kind": "abort"}, {"id": 7, "kind": "abort"}, {"id": "", "kind": "abort"}])
def test_an_item_without_an_id_is_no_command(item):
    assert Command.from_json(item) is None


@pytest.mark.parametrize(
    "item, kind, problem",
    [
        ({"id": "a", "kind": "rewind"}, "rewind", "unknown kind"),
        ({"id": "a"}, "unknown", "the command has no kind"),
        ({"id": "a", "kind": "prompt"}, "prompt", "the prompt has no text"),
        ({"id": "a", "kind": "prompt", "text": 5}, "prompt", "text must be a string, not a number"),
        ({"id": "a", "kind": "prompt", "text": "x", "notification": {"status": "s"}}, "prompt", "notification must be an object with a status and a summary"),
        ({"id": "a", "kind": "model", "model": float("inf")}, "model", "model must be a string, not a number"),
        ({"id": "a", "kind": "effort", "effort": "extreme"}, "effort", "unknown effort"),
        ({"id": "a", "kind": "effort", "effort": ""}, "effort", "unknown effort"),
        ({"id": "a", "kind": "command", "args": "x"}, "command", "the command has no name"),
        ({"id": "a", "kind": "command", "name": "compact", "args": ["x"]}, "command", "args must be a string, not an array"),
        ({"id": "a", "kind": "ask", "question": ""}, "ask", "the ask has no question"),
    ],
)
def test_a_command_with_bad_fields_carries_the_error_its_ack_will_give(item, kind, problem):
    assert Command.from_json(item) == Command(id="a", kind=kind, problem=problem)


def test_every_documented_effort_is_accepted_and_an_absent_effort_or_an_absent_or_empty_field_reads_as_absent():
    for effort in EFFORTS:
        assert Command.from_json({"id": "e", "kind": "effort", "effort": effort}) == Command(id="e", kind="effort", effort=effort)
    assert Command.from_json({"id": "e", "kind": "effort"}) == Command(id="e", kind="effort")
    for absent in (None, ""):
        assert Command.from_json({"id": "a", "kind": "model", "model": absent}) == Command(id="a", kind="model")
        assert Command.from_json({"id": "b", "kind": "command", "name": "clear", "args": absent}) == Command(id="b", kind="command", name="clear")


# -- the texts made of commands ----------------------------------------------------------------


def test_notification_escapes_status_and_summary_but_not_the_text():
    command = fixture_commands()[9]  # m10
    assert notification_text(command.text, command.notification) == (
        "<task-notification>\n"
        "<status>completed</status>\n"
        '<summary>session "docs" finished</summary>\n'
        '<result>Session "docs" finished the task (ticket t1). Its report:\n\n'
        "If a < b && c > d, see </result>.</result>\n"
        "</task-notification>"
    )
    text = notification_text("x", Notification("a&b<c>", 'session "a<b&c" is waiting'))
    assert "<status>a&amp;b&lt;c&gt;</status>" in text and '<summary>session "a&lt;b&amp;c" is waiting</summary>' in text


def test_ask_prompt_puts_the_question_last_behind_the_preamble():
    prompt = ask_prompt("what are you working on?")
    assert prompt == ASK_PREAMBLE + "what are you working on?"
    lowered = ASK_PREAMBLE.lower()
    assert "side question" in lowered and "not added to the conversation" in lowered and "no tools" in lowered
