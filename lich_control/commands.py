"""What lich sends, read once where it arrives: a JSON document within the
daemon's memory bound (`loads`), and each command of a poll answer checked
(`Command.from_json`), with the texts the worker and the asks make of them.

`Command.from_json` never raises for an item: one lich gave an id becomes a
`Command` (with `problem` set when it cannot be applied, which is then the
ack's error), and one with no usable id becomes a `Discarded` the poller
counts, since there is nothing to ack it under.
"""
from __future__ import annotations

import json
import re
from typing import Any, Optional, Union

import attrs

KINDS = ("prompt", "abort", "model", "effort", "command", "ask")
EFFORTS = ("low", "medium", "high", "xhigh", "max")

# No lich mints ids anywhere near this (its own are `m` and a counter); a
# longer one is acked failed, never applied.
MAX_ID_CHARS = 1024
LONG_ID = f"the id is over {MAX_ID_CHARS:,} characters; such a command is not applied"

UNKNOWN_KIND = "unknown kind"
UNKNOWN_EFFORT = "unknown effort"

# JSON values (brackets and commas) one document may build: ~100 bytes each
# once built, so ~10 MB at most, where 16 MiB of `[{},{},...]` would build
# 5.5 million dicts. A poll answer of 10,000 commands builds under 100,000.
MAX_VALUES = 100_000
# A JSON string, closed or running to the end of the text (so that no quote
# starts a second scan to the end): what the count of values leaves out.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)


class TooMany(ValueError):
    """A document that would build more values than one may."""


def _int_or_inf(digits: str) -> Any:
    try:
        return int(digits)
    except ValueError:  # past sys.get_int_max_str_digits (4,300): no field takes a number anyway
        return float(digits)


_DECODER = json.JSONDecoder(parse_int=_int_or_inf)


def loads(body: bytes) -> Any:
    """One JSON document from outside the daemon, read as json.loads reads
    bytes (UTF-8, -16 or -32, as RFC 8259 allows), but for two things: an
    integer of more than 4,300 digits, which Python refuses the whole document
    for, reads as infinity (a number: any field that wants a string refuses
    it, so it costs its command alone); and a document that would build more
    than MAX_VALUES values is refused (TooMany) before anything is built.
    Raises ValueError (not JSON, not in a Unicode encoding) or RecursionError
    (nested deeper than the interpreter's stack)."""
    text = body.decode(json.detect_encoding(body), "surrogatepass")
    if count_values(text) > MAX_VALUES:
        raise TooMany(f"the body holds more than {MAX_VALUES:,} JSON values")
    return _DECODER.decode(text)


def count_values(text: str) -> int:
    """The brackets and commas of a JSON text, its strings left out: one
    pass of the regular expression engine, then five counts."""
    bare = _STRING.sub("", text)
    return sum(map(bare.count, "[]{},"))


@attrs.frozen
class Notification:
    status: str
    summary: str


@attrs.frozen
class Command:
    """One command lich asked for, with the fields its kind uses."""

    id: str
    kind: str
    text: Optional[str] = None
    notification: Optional[Notification] = None
    model: Optional[str] = None
    effort: Optional[str] = None
    name: Optional[str] = None
    args: Optional[str] = None
    question: Optional[str] = None
    # Set when the command cannot be applied: the ack's `error`, sent in order.
    problem: Optional[str] = None

    @classmethod
    def from_json(cls, item: Any) -> Union["Command", "Discarded"]:
        if not isinstance(item, dict):
            return Discarded(f"an item that is not a JSON object ({_json_type(item)})")
        cid = item.get("id")
        if not isinstance(cid, str) or not cid:
            why = "no id" if cid is None else f"an id that is not a non-empty string ({_json_type(cid)})"
            return Discarded(f"an item with {why}")
        kind = item.get("kind")
        if len(cid) > MAX_ID_CHARS:
            # lich gave it an id, so it gets its ack (unless even that is
            # over lich's 64 KiB, which the ack path drops and logs).
            return cls(id=cid, kind=kind if isinstance(kind, str) and kind else "unknown", problem=LONG_ID)
        if not isinstance(kind, str) or not kind:
            what = "has no kind" if kind is None else f"has a kind that is not a string ({_json_type(kind)})"
            return cls(id=cid, kind="unknown", problem=f"command {what}")
        if kind not in KINDS:
            return cls(id=cid, kind=kind, problem=UNKNOWN_KIND)
        return _PARSERS[kind](cid, item)


@attrs.frozen
class Discarded:
    """An item lich sent that cannot be acked: logged, never applied."""

    reason: str




def notification_text(text: str, note: Notification) -> str:
    """The prompt as Claude Code words a background agent's completion.

    Status and summary are escaped, since Claude Code decodes them for its
    one dim line; the text is not, since the model reads it as written.
    """
    return (
        "<task-notification>\n"
        f"<status>{_xml_escape(note.status)}</status>\n"
        f"<summary>{_xml_escape(note.summary)}</summary>\n"
        f"<result>{text}</result>\n"
        "</task-notification>"
    )


ASK_PREAMBLE = (
    "[A side question from outside your current work, asked through lich.]\n"
    "Answer it directly from what you already know of this conversation. "
    "Your answer goes back to whoever asked and is not added to the "
    "conversation, so it changes nothing in your work. No tools are "
    "available for this answer: do not try to call any.\n\n"
    "Question: "
)


def ask_prompt(question: str) -> str:
    """The fork's one message: the preamble, then the question, last."""
    return ASK_PREAMBLE + question


# -- one parser per kind --------------------------------------------------


def _prompt(cid: str, item: dict) -> Command:
    text = item.get("text")
    if not isinstance(text, str):
        return _bad(cid, "prompt", "text", text, "a string")
    raw = item.get("notification")
    if raw is None:
        return Command(id=cid, kind="prompt", text=text)
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("status"), str)
        or not isinstance(raw.get("summary"), str)
    ):
        return Command(
            id=cid,
            kind="prompt",
            problem="notification must be an object with string status and summary",
        )
    note = Notification(status=raw["status"], summary=raw["summary"])
    return Command(id=cid, kind="prompt", text=text, notification=note)


def _abort(cid: str, item: dict) -> Command:
    return Command(id=cid, kind="abort")


def _model(cid: str, item: dict) -> Command:
    model = item.get("model")
    if model is not None and (not isinstance(model, str) or not model):
        return _bad(cid, "model", "model", model, "a non-empty string, or absent to drop the override")
    return Command(id=cid, kind="model", model=model)


def _effort(cid: str, item: dict) -> Command:
    effort = item.get("effort")
    if effort is not None and effort not in EFFORTS:
        return Command(id=cid, kind="effort", problem=UNKNOWN_EFFORT)
    return Command(id=cid, kind="effort", effort=effort)


def _command(cid: str, item: dict) -> Command:
    name, args = item.get("name"), item.get("args")
    if not isinstance(name, str) or not name:
        return _bad(cid, "command", "name", name, "a non-empty string")
    if args is not None and not isinstance(args, str):
        return _bad(cid, "command", "args", args, "a string")
    return Command(id=cid, kind="command", name=name, args=args)


def _ask(cid: str, item: dict) -> Command:
    question = item.get("question")
    if not isinstance(question, str) or not question.strip():
        return _bad(cid, "ask", "question", question, "a non-empty string")
    return Command(id=cid, kind="ask", question=question)


_PARSERS = {
    "prompt": _prompt,
    "abort": _abort,
    "model": _model,
    "effort": _effort,
    "command": _command,
    "ask": _ask,
}


def _bad(cid: str, kind: str, field: str, value: Any, wanted: str) -> Command:
    got = "missing" if value is None else f"got {_json_type(value)}"
    return Command(id=cid, kind=kind, problem=f"{field} must be {wanted} ({got})")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "an empty string" if not value else "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _xml_escape(value: str) -> str:
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
