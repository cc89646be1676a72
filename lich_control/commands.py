"""Each command of a poll answer, checked once where it arrives
(`Command.from_json`), with the texts the worker and the asks make of them.

`from_json` never raises: an item with an id becomes a `Command` (`problem`
set, and acked as its error, when it cannot be applied); one without is
None, as there is nothing to ack it under.
"""
from __future__ import annotations

from html import escape  # http.server loads html already: no import of its own at the start
from typing import Any, Optional

import attrs

# The string fields each kind reads (a prompt may carry a notification
# object too), and the one it cannot do without.
FIELDS = {
    "prompt": ("text",),
    "abort": (),
    "model": ("model",),
    "effort": ("effort",),
    "command": ("name", "args"),
    "ask": ("question",),
}
REQUIRED = {"prompt": "text", "command": "name", "ask": "question"}
EFFORTS = ("low", "medium", "high", "xhigh", "max")

UNKNOWN_KIND = "unknown kind"
UNKNOWN_EFFORT = "unknown effort"

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
    def from_json(cls, item: Any) -> Optional["Command"]:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            return None
        cid, kind = item["id"], item.get("kind")
        if kind not in FIELDS:
            echoed = kind if isinstance(kind, str) and kind else "unknown"
            return cls(id=cid, kind=echoed, problem=UNKNOWN_KIND if echoed == kind else "the command has no kind")
        try:
            fields = {name: _string(item, name) for name in FIELDS[kind]}
            if kind in REQUIRED and fields[REQUIRED[kind]] is None:
                raise _Bad(f"the {kind} has no {REQUIRED[kind]}")
            note = item.get("notification") if kind == "prompt" else None
            if note is not None:
                if not isinstance(note, dict) or _string(note, "status") is None or _string(note, "summary") is None:
                    raise _Bad("notification must be an object with a status and a summary")
                fields["notification"] = Notification(note["status"], note["summary"])
        except _Bad as bad:
            return cls(id=cid, kind=kind, problem=str(bad))
        # An empty effort is none of the five: refused, as the seed says; an
        # empty model keeps reading as absent (the override dropped).
        if fields.get("effort") not in EFFORTS + (None,) or item.get("effort") == "":
            return cls(id=cid, kind=kind, problem=UNKNOWN_EFFORT)
        return cls(id=cid, kind=kind, **fields)


def notification_text(text: str, note: Notification) -> str:
    """The prompt as Claude Code words a background agent's completion.
    Status and summary are XML-escaped, as Claude Code decodes them for its
    one dim line; the text is not, since the model reads it as written."""
    return (
        "<task-notification>\n"
        f"<status>{escape(note.status, quote=False)}</status>\n"
        f"<summary>{escape(note.summary, quote=False)}</summary>\n"
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


_JSON_TYPES = {bool: "a boolean", int: "a number", float: "a number", list: "an array", dict: "an object"}


class _Bad(ValueError):
    """A field of a command that cannot be applied; the text is the ack's error."""


def _string(item: dict, name: str) -> Optional[str]:
    """A field lich sends as a string, None when absent: Go's encoder omits an empty one."""
    value = item.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise _Bad(f"{name} must be a string, not {_JSON_TYPES.get(type(value), type(value).__name__)}")
    return value
