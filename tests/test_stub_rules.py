"""What the development lich refuses, rule by rule, each with the place in
lich's server (github.com/omartelo/lich) it comes from and lich's wording.

Pure functions: no server, no clock. The HTTP side of the same rules is in
test_stub.py.
"""
import json
import os

import pytest

from lich_dev.releases import CEILING, FLOOR, compatible, release_key
from lich_dev.rules import (
    CONTRACT_KINDS,
    PLUGIN_TOO_OLD,
    Refused,
    check_command,
    parse_json,
    reported_error,
    validate_ack,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "acks.jsonl")
ACK_LINES = [json.loads(line) for line in open(FIXTURES, encoding="utf-8") if line.strip()]
NEWER = dict(CONTRACT_KINDS, rewind=("to",))  # a lich that knows a kind the mod does not


def refusal(command, kinds=CONTRACT_KINDS):
    with pytest.raises(Refused) as err:
        check_command(command, kinds)
    return str(err.value)


# -- queueing: internal/terminal/modcontrol.go queueModCommand ----------------


@pytest.mark.parametrize("kind", ["rewind", "compact", "", None, 7])
def test_a_kind_lich_does_not_know_is_refused_in_lichs_words(kind):
    # knownModKind, and its error: unknown mod command kind %q
    assert refusal({"kind": kind}) == f"unknown mod command kind {json.dumps(str(kind))}"


def test_a_kind_a_newer_lich_knows_is_queued_with_its_own_fields():
    assert check_command({"kind": "rewind", "to": "t1"}, NEWER) == {"kind": "rewind", "to": "t1"}


@pytest.mark.parametrize("text", ["", "   ", "\n\t", None])
def test_a_prompt_whose_text_is_blank_is_refused(text):
    # queueModCommand: strings.TrimSpace(cmd.Text) == "" -> "prompt command has no text"
    assert refusal({"kind": "prompt", "text": text}) == "prompt command has no text"


@pytest.mark.parametrize(
    "command, stranger",
    [
        ({"kind": "abort", "text": "x"}, "text"),
        ({"kind": "prompt", "text": "go", "model": "m"}, "model"),
        ({"kind": "model", "effort": "high"}, "effort"),
        ({"kind": "effort", "args": "x"}, "args"),
        ({"kind": "command", "name": "clear", "text": "x"}, "text"),
        ({"kind": "ask", "question": "q?", "name": "clear"}, "name"),
        ({"kind": "model", "notification": {"status": "s", "summary": "s"}}, "notification"),
        ({"kind": "abort", "reason": "no kind has this field"}, "reason"),
    ],
)
def test_a_command_carrying_a_field_of_another_kind_is_refused(command, stranger):
    # ownModFields(cmd) != cmd -> "%s command carries a field that belongs to another kind"
    said = refusal(command)
    assert said == f"{command['kind']} command carries a field that belongs to another kind ({stranger})"


@pytest.mark.parametrize("name", ["", "   ", "/", " / "])
def test_a_slash_command_with_no_name_is_refused(name):
    # runnableCommand: the name trimmed, one slash dropped, nothing left
    assert refusal({"kind": "command", "name": name}) == "a command needs the name of a slash command, and none was given"


def test_a_slash_command_without_a_name_field_is_refused():
    assert refusal({"kind": "command"}) == "a command needs the name of a slash command, and none was given"


@pytest.mark.parametrize(
    "name, first, kind",
    [
        ("model", "model", "model"),
        ("/effort", "effort", "effort"),
        ("Model", "model", "model"),
        ("model opus", "model", "model"),
        ("//Model", "model", "model"),
        (" /effort high", "effort", "effort"),
        ("///EFFORT", "effort", "effort"),
    ],
)
def test_model_and_effort_are_refused_as_slash_commands_in_any_spelling(name, first, kind):
    # runnableCommand reads the first word, every leading slash gone, lower-cased
    assert refusal({"kind": "command", "name": name}) == (
        f"/{first} is refused as a command: Claude Code saves what it sets as the default for every "
        f"new session. The {kind} action changes this session only"
    )


@pytest.mark.parametrize("name, passed_on", [("/compact", "compact"), ("compact", "compact"), (" /clear ", "clear"), ("//compact", "/compact")])
def test_one_leading_slash_of_a_command_name_is_dropped(name, passed_on):
    # runnableCommand: strings.TrimPrefix(strings.TrimSpace(name), "/"), once
    assert check_command({"kind": "command", "name": name, "args": "keep it"})["name"] == passed_on


def test_model_effort_and_args_left_empty_are_sent_as_absent():
    # ModCommand's omitempty: an empty model or effort is no field, which drops the override
    assert check_command({"kind": "model", "model": ""}) == {"kind": "model"}
    assert check_command({"kind": "effort", "effort": None}) == {"kind": "effort"}
    assert check_command({"kind": "command", "name": "clear", "args": ""}) == {"kind": "command", "name": "clear"}


@pytest.mark.parametrize("question", ["", "  ", None])
def test_an_ask_with_no_question_is_refused(question):
    # docs/hooks/mod-control.md: question "never empty" (the wording is the stub's)
    assert refusal({"kind": "ask", "question": question}) == "ask command has no question"


def test_an_ask_whose_question_is_over_8_kib_is_refused_and_8_kib_is_not():
    # docs/hooks/mod-control.md: question "at most 8 KiB" (the wording is the stub's)
    assert check_command({"kind": "ask", "question": "é" * 4096})["question"] == "é" * 4096
    assert refusal({"kind": "ask", "question": "é" * 4096 + "x"}) == "ask command's question is over 8 KiB"


def test_a_field_that_is_not_a_string_is_refused():
    assert refusal({"kind": "prompt", "text": 7}) == "prompt command's text must be a string"


def test_a_notification_must_carry_a_status_and_a_summary():
    good = {"kind": "prompt", "text": "done", "notification": {"status": "completed", "summary": "s"}}
    assert check_command(good) == good
    assert "notification must be an object" in refusal(dict(good, notification={"status": "completed"}))


# -- acks: modcontrol.go parseModAck, and the contract's fixtures ---------------


@pytest.mark.parametrize("case", ACK_LINES, ids=[c["name"] for c in ACK_LINES])
def test_ack_validation_matches_every_fixture_line_for_a_lich_that_knows_its_kind(case):
    doc = parse_json(case["raw"].encode()) if "raw" in case else case.get("body")
    expected = None if case.get("accept") else case["reject"]
    assert validate_ack(doc, NEWER) == expected


def test_an_ack_whose_kind_lich_does_not_know_is_refused_in_lichs_words():
    # parseModAck: !knownModKind(req.Kind) -> "mod ack has unknown kind %q" (a 400)
    echoed = next(c["body"] for c in ACK_LINES if c["name"] == "unknown kind echoed")
    assert validate_ack(echoed) == 'mod ack has unknown kind "rewind"'


def test_an_ack_is_not_checked_against_any_id():
    # parseModAck: "The id is not checked: an ack nobody is waiting on is accepted like any other."
    assert validate_ack({"session_id": "s1", "id": "never-queued", "kind": "abort", "ok": True}) is None


@pytest.mark.parametrize(
    "raw",
    [b"[" * 100000 + b"]" * 100000, b'{"a":' * 50000 + b"1" + b"}" * 50000, b"\xff\xfe{", b'{"id": "\\ud800"', b"1" + b"0" * 5000],
    ids=["deep-array", "deep-object", "invalid-utf8", "cut-json", "huge-number"],
)
def test_hostile_json_at_any_depth_is_no_document_never_an_exception(raw):
    doc = parse_json(raw)
    assert doc is None or validate_ack(doc) == "body must be a JSON object"


def test_a_mod_acking_unknown_kind_is_reported_as_lich_reports_it():
    # RunModCommand: an acked "unknown kind" becomes "this session's lich-plugin is too old for it ..."
    assert reported_error({"ok": False, "error": "unknown kind"}) == PLUGIN_TOO_OLD
    assert PLUGIN_TOO_OLD.startswith("this session's lich-plugin is too old for it: update lich-plugin to 0.15.0")
    assert reported_error({"ok": False, "error": "unknown effort"}) == "unknown effort"
    assert reported_error({"ok": True}) is None and reported_error(None) is None


# -- the plugin release: internal/agentplugin/compat.go, internal/semver -------


@pytest.mark.parametrize(
    "version, ok",
    [
        ("0.13.0", True),  # the floor is in
        ("0.16.0", True),
        ("0.18.99", True),
        ("v0.16.0", True),  # semver.parse drops a leading v
        ("0.16.0+build.7", True),  # and build metadata
        ("0.19.0-rc1", True),  # a pre-release sorts before its release
        ("0.19.0", False),  # the ceiling is out
        ("0.12.9", False),
        ("0.13.0-rc1", False),
        ("0.1.0", False),  # this package's own version
        ("1.0.0", False),
        ("", False),  # an absent header: a plugin older than the header
        (None, False),
        ("junk", False),  # unreadable sorts as 0.0.0
    ],
)
def test_the_supported_range_is_lichs(version, ok):
    assert (FLOOR, CEILING) == ("0.13.0", "0.19.0")
    assert compatible(version) is ok


def test_release_order_reads_missing_and_odd_parts_as_zero():
    assert release_key("1") == release_key("1.0.0") == (1, 0, 0, 1)
    assert release_key("1.x.3") == (1, 0, 3, 1)
    assert release_key("2.0.0-beta") < release_key("2.0.0")
