"""The development lich's rules (lich_dev/rules.py, releases.py): what lich
refuses and how it words it, and which acks it takes.

Pure functions, no server. Each rule names the place in lich's server
(github.com/omartelo/lich, internal/terminal/modcontrol.go unless said).
"""
import json
import os

import pytest

from lich_dev.releases import CEILING, FLOOR, compatible
from lich_dev.rules import (
    CONTRACT_KINDS,
    PLUGIN_TOO_OLD,
    Refused,
    check_command,
    go_quote,
    parse_json,
    reported_error,
    validate_ack,
)

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "acks.jsonl")
ACK_LINES = [json.loads(line) for line in open(FIXTURES, encoding="utf-8") if line.strip()]
NEWER = dict(CONTRACT_KINDS, rewind=("to",))  # a lich that knows a kind the mod does not
NOTE = {"status": "completed", "summary": 'session "docs" finished'}


def refusal(command, kinds=CONTRACT_KINDS):
    with pytest.raises(Refused) as err:
        check_command(command, kinds)
    return str(err.value)


def ack(**fields):
    return dict({"session_id": "s1", "id": "m1", "kind": "abort", "ok": True}, **fields)


# -- queueing: queueModCommand -----------------------------------------------------


@pytest.mark.parametrize(
    "kind, quoted",
    [("rewind", '"rewind"'), ("", '""'), (None, '""'), ("\x01", '"\\x01"'), ("\u00a0", '"\\u00a0"'), ("é", '"é"')],
)
def test_a_kind_lich_does_not_know_is_refused_in_lichs_words_and_gos_quoting(kind, quoted):
    assert refusal({"kind": kind}) == f"unknown mod command kind {quoted}"


@pytest.mark.parametrize(
    "text, quoted",
    # Each as Go 1.19's fmt.Sprintf("%q", text) printed it.
    [
        ("a\"b\\c", '"a\\"b\\\\c"'),
        ("\n\t\x7f\x1b", '"\\n\\t\\x7f\\x1b"'),
        ("\u00a0\u2028\u200b\u3000", '"\\u00a0\\u2028\\u200b\\u3000"'),
        ("é€😀\u0300", '"é€😀\u0300"'),
        ("\U000e0001\U0010ffff", '"\\U000e0001\\U0010ffff"'),
        ("\ud800", '"\ufffd"'),  # a Go string holds no lone surrogate
    ],
)
def test_go_quote_writes_what_gos_percent_q_writes(text, quoted):
    assert go_quote(text) == quoted


@pytest.mark.parametrize(
    "command, refused",
    [
        ({"kind": "prompt", "text": " \n\t\u3000"}, "prompt command has no text"),  # strings.TrimSpace
        ({"kind": "prompt"}, "prompt command has no text"),
        ({"kind": "ask", "question": "  "}, "ask command has no question"),  # the stub's words
        ({"kind": "ask", "question": "é" * 4096 + "x"}, "ask command's question is over 8 KiB"),
        ({"kind": "command", "name": " / "}, "a command needs the name of a slash command, and none was given"),
        ({"kind": "command"}, "a command needs the name of a slash command, and none was given"),
        ({"kind": "prompt", "text": 7}, "prompt command's text must be a string"),
        ({"kind": "abort", "text": "x"}, "abort command carries a field that belongs to another kind"),  # ownModFields
        ({"kind": "model", "effort": "high"}, "model command carries a field that belongs to another kind"),
        ({"kind": "ask", "question": "q?", "name": "clear"}, "ask command carries a field that belongs to another kind"),
        ({"kind": "model", "notification": NOTE}, "model command carries a field that belongs to another kind"),
    ],
)
def test_what_lich_refuses_to_queue_is_refused_in_its_words(command, refused):
    assert refusal(command) == refused


def test_a_command_is_queued_as_lichs_go_struct_holds_it():
    # ModCommand's omitempty: "" is a Go string's zero value, the same as absent
    assert check_command({"kind": "abort", "text": ""}) == {"kind": "abort"}
    assert check_command({"kind": "model", "model": ""}) == {"kind": "model"}
    assert check_command({"kind": "effort", "effort": None}) == {"kind": "effort"}
    assert check_command({"kind": "command", "name": "clear", "args": ""}) == {"kind": "command", "name": "clear"}


@pytest.mark.parametrize(
    "name, first",
    [("model", "model"), ("/effort", "effort"), ("Model opus", "model"), ("//Model", "model"), (" /effort high", "effort"), ("///EFFORT", "effort")],
)
def test_model_and_effort_are_refused_as_slash_commands_in_any_spelling(name, first):
    # runnableCommand: the first word, every leading slash gone, lower-cased
    assert refusal({"kind": "command", "name": name}) == (
        f"/{first} is refused as a command: Claude Code saves what it sets as the default for every "
        f"new session. The {first} action changes this session only"
    )


@pytest.mark.parametrize("name, passed_on", [("/compact", "compact"), (" /clear ", "clear"), ("//compact", "/compact")])
def test_one_leading_slash_of_a_command_name_is_dropped(name, passed_on):
    assert check_command({"kind": "command", "name": name, "args": "keep it"})["name"] == passed_on


def test_a_notification_lich_sends_is_queued_and_one_it_never_sends_is_refused():
    # internal/relay: NotifyCompleted, NotifyWaiting; the wording is checkNotification's
    for status in ("completed", "waiting"):
        good = {"kind": "prompt", "text": "done", "notification": dict(NOTE, status=status)}
        assert check_command(good) == good
    prompt = {"kind": "prompt", "text": "done"}
    assert refusal(dict(prompt, notification=dict(NOTE, status="bogus"))) == 'unknown notification status "bogus"'
    assert refusal(dict(prompt, notification=dict(NOTE, status="\x01"))) == 'unknown notification status "\\x01"'
    assert refusal(dict(prompt, notification=dict(NOTE, summary=" \n"))) == "a notification needs a summary, and none was given"
    assert "must be an object" in refusal(dict(prompt, notification={"status": "completed"}))


# -- acks: parseModAck, as Go decodes the body into its struct ------------------------


@pytest.mark.parametrize("case", ACK_LINES, ids=[c["name"] for c in ACK_LINES])
def test_ack_validation_matches_every_fixture_line_for_a_lich_that_knows_its_kind(case):
    doc = parse_json(case["raw"].encode()) if "raw" in case else case.get("body")
    assert validate_ack(doc, NEWER) == (None if case.get("accept") else case["reject"])


@pytest.mark.parametrize(
    "doc, refused",
    [
        (ack(kind="rewind"), 'mod ack has unknown kind "rewind"'),  # lich's words
        (ack(ok=1), "ok must be a boolean"),  # a type Go cannot put in a bool
        (ack(error=5), "error must be a string"),
        (ack(kind="prompt", answer="x"), "only an answered ask carries an answer"),
        (ack(kind="ask", ok=None, answer="x"), "only an answered ask carries an answer"),
        (ack(session_id=None), "session_id is required"),
    ],
)
def test_an_ack_lich_refuses_is_refused(doc, refused):
    assert validate_ack(doc) == refused


def test_a_mod_acking_unknown_kind_is_reported_as_lich_reports_it():
    # RunModCommand: an acked "unknown kind" becomes "this session's lich-plugin is too old ..."
    assert reported_error({"ok": False, "error": "unknown kind"}) == PLUGIN_TOO_OLD
    # lich trims the error (strings.TrimSpace) before it rewords it, and reports it trimmed
    assert reported_error({"ok": False, "error": " \t unknown kind\n\u3000"}) == PLUGIN_TOO_OLD
    assert reported_error({"ok": False, "error": "  no turn is running \n"}) == "no turn is running"
    assert PLUGIN_TOO_OLD.startswith("this session's lich-plugin is too old for it: update lich-plugin to 0.15.0")
    assert reported_error({"ok": False, "error": "unknown effort"}) == "unknown effort"
    assert reported_error({"ok": True}) is None and reported_error(None) is None


# -- the plugin release: internal/agentplugin/compat.go, internal/semver ---------------


@pytest.mark.parametrize(
    "version, ok",
    [
        ("0.13.0", True), ("0.18.99", True),
        ("0.19.0-rc1", True),  # a pre-release sorts before its release
        ("0.19.0", False), ("0.12.9", False),
        (None, False),  # an absent header: a plugin older than the header
    ],
)
def test_the_supported_range_is_lichs(version, ok):
    assert (FLOOR, CEILING) == ("0.13.0", "0.19.0")
    assert compatible(version) is ok

