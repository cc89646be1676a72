"""commands: a JSON document read within its bound (`loads`), each command of
a poll answer checked once (`Command.from_json`), and the texts made of them."""
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lich_control import commands
from lich_control.commands import (
    ASK_PREAMBLE,
    EFFORTS,
    MAX_ID_CHARS,
    MAX_VALUES,
    Command,
    Discarded,
    Notification,
    TooMany,
    ask_prompt,
    loads,
    notification_text,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


def fixture_commands():
    with open(os.path.join(FIXTURES, "commands.json")) as f:
        return [Command.from_json(item) for item in json.load(f)]


# -- loads ---------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16-le", "utf-16-be", "utf-32-le", "utf-32-be"])
def test_a_document_is_read_in_any_encoding_json_loads_detects(encoding):
    doc = [{"id": "m1", "kind": "prompt", "text": "é ✓ 𝄞"}]
    assert loads(json.dumps(doc, ensure_ascii=False).encode(encoding)) == doc


def test_an_integer_past_4300_digits_reads_as_infinity_not_a_refusal_of_the_document():
    assert loads(b'[{"id": "m1", "n": ' + b"9" * 5000 + b'}, {"id": "m2", "n": -' + b"9" * 5000 + b"}]") == [
        {"id": "m1", "n": float("inf")},
        {"id": "m2", "n": float("-inf")},
    ]


def test_a_document_of_more_values_than_the_bound_is_refused_before_it_is_built():
    with pytest.raises(TooMany, match=f"^the body holds more than {MAX_VALUES:,} JSON values$"):
        loads(b"[" + b",".join([b"{}"] * MAX_VALUES) + b"]")
    assert len(loads(b"[" + b",".join([b"1"] * (MAX_VALUES - 2)) + b"]")) == MAX_VALUES - 2  # the bound itself is read


def test_brackets_and_commas_inside_strings_are_no_values():
    text = '[,]{"\\"' * 50_000
    assert loads(json.dumps([{"id": "m1", "text": text}]).encode()) == [{"id": "m1", "text": text}]


@pytest.mark.parametrize("body", [b"[", b'["\\"\\"\\"', b'["x\\', b"\xff[]", b"[] []", b""])
def test_what_is_not_one_json_document_is_a_value_error(body):
    with pytest.raises(ValueError):
        loads(body)


def values_in(value):
    """The values a document of `value` counts: each array or object its two
    brackets and a comma between each two members."""
    if isinstance(value, (list, dict)):
        members = list(value.values()) if isinstance(value, dict) else value
        return 2 + max(len(members) - 1, 0) + sum(map(values_in, members))
    return 0


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{},"\\:aé\n\ud800', max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet='[]{},"\\a', max_size=4), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values, ascii_only=st.booleans(), indent=st.sampled_from([None, 1]))
def test_the_count_of_values_sees_only_what_is_outside_strings(value, ascii_only, indent):
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent)
    assert commands.count_values(text) == values_in(value)
    assert loads(text.encode("utf-8", "surrogatepass")) == value


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


@pytest.mark.parametrize(
    "item, reason",
    [
        ("a string", "an item that is not a JSON object (a string)"),
        (["m1"], "an item that is not a JSON object (an array)"),
        (None, "an item that is not a JSON object (null)"),
        ({"kind": "abort"}, "an item with no id"),
        ({"id": 7, "kind": "abort"}, "an item with an id that is not a non-empty string (a number)"),
        ({"id": float("inf"), "kind": "abort"}, "an item with an id that is not a non-empty string (a number)"),
        ({"id": "", "kind": "abort"}, "an item with an id that is not a non-empty string (an empty string)"),
    ],
)
def test_an_item_without_a_usable_id_is_discarded_with_a_reason(item, reason):
    assert Command.from_json(item) == Discarded(reason)


@pytest.mark.parametrize("kind, echoed", [("abort", "abort"), ("rewind", "rewind"), (None, "unknown"), (7, "unknown")])
def test_an_id_over_the_limit_is_a_command_acked_failed_never_applied(kind, echoed):
    parsed = Command.from_json({"id": "x" * (MAX_ID_CHARS + 1), "kind": kind, "text": "hi"})
    assert (parsed.kind, parsed.text) == (echoed, None)
    assert parsed.problem == "the id is over 1,024 characters; such a command is not applied"
    assert Command.from_json({"id": "x" * MAX_ID_CHARS, "kind": "abort"}).problem is None


@pytest.mark.parametrize(
    "item, problem",
    [
        ({"id": "a", "kind": "rewind"}, "unknown kind"),
        ({"id": "a"}, "command has no kind"),
        ({"id": "a", "kind": 3}, "command has a kind that is not a string (a number)"),
        ({"id": "a", "kind": "prompt"}, "text must be a string (missing)"),
        ({"id": "a", "kind": "prompt", "text": 5}, "text must be a string (got a number)"),
        ({"id": "a", "kind": "prompt", "text": "x", "notification": "n"}, "notification must be an object with string status and summary"),
        ({"id": "a", "kind": "prompt", "text": "x", "notification": {"status": "s"}}, "notification must be an object with string status and summary"),
        ({"id": "a", "kind": "model", "model": float("inf")}, "model must be a non-empty string, or absent to drop the override (got a number)"),
        ({"id": "a", "kind": "model", "model": ""}, "model must be a non-empty string, or absent to drop the override (got an empty string)"),
        ({"id": "a", "kind": "effort", "effort": "extreme"}, "unknown effort"),
        ({"id": "a", "kind": "effort", "effort": 3}, "unknown effort"),
        ({"id": "a", "kind": "command"}, "name must be a non-empty string (missing)"),
        ({"id": "a", "kind": "command", "name": "compact", "args": ["x"]}, "args must be a string (got an array)"),
        ({"id": "a", "kind": "ask"}, "question must be a non-empty string (missing)"),
        ({"id": "a", "kind": "ask", "question": " \n"}, "question must be a non-empty string (got a string)"),
        ({"id": "a", "kind": "ask", "question": {"q": 1}}, "question must be a non-empty string (got an object)"),
    ],
)
def test_a_command_with_bad_fields_carries_the_error_its_ack_will_give(item, problem):
    parsed = Command.from_json(item)
    assert (parsed.id, parsed.kind, parsed.problem) == ("a", item.get("kind") if isinstance(item.get("kind"), str) else "unknown", problem)


def test_every_documented_effort_and_a_null_model_or_args_are_accepted():
    for effort in EFFORTS:
        parsed = Command.from_json({"id": "e", "kind": "effort", "effort": effort})
        assert parsed.problem is None and parsed.effort == effort
    model = Command.from_json({"id": "a", "kind": "model", "model": None})
    command = Command.from_json({"id": "b", "kind": "command", "name": "clear", "args": None})
    assert (model.problem, model.model, command.problem, command.args) == (None, None, None, None)


def test_ids_over_the_limit_are_acked_failed_by_the_real_daemon_or_dropped_with_a_line_when_no_ack_fits(relay, lich, run_dir):
    r = relay()
    r.wait_hello()
    seen = r.autoanswer()
    assert lich.wait_polled("s1", 10, parked=True)
    long_id, unfit_id = "x" * 2000, "y" * 100_000  # an ack under lich's 64 KiB holds the first, not the second
    lich.faults.deliver({"id": long_id, "kind": "prompt", "text": "not to be run"}, {"id": unfit_id, "kind": "abort"}, {"id": "m2", "kind": "rewind"})
    assert lich.record.ack_for("m2", 10)["error"] == "unknown kind"  # acked in order, after the long ones
    ack = lich.record.ack_for(long_id, 10)
    assert (ack["ok"], ack["kind"], ack["error"]) == (False, "prompt", "the id is over 1,024 characters; such a command is not applied")
    assert all(a.id != unfit_id for a in lich.record.acks) and seen.calls == []
    r.stop()
    with open(os.path.join(run_dir, "s1.log")) as f:
        assert len([line for line in f if "dropped the ack for" in line and "yyyy" in line]) == 1


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
