"""What lich refuses, and how it words it: the development lich's contract model.

Pure functions over command and ack documents, no I/O. Each rule names the
place in lich's server (github.com/omartelo/lich) it was read from; where
lich has wording, the text here is lich's, so a person who met a refusal in
the stub recognises it in lich. docs/dev-lich.md lists where the stub
differs on purpose.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Mapping, Optional, Tuple

# internal/terminal/modcontrol.go: modPollWait, and the attach window, which
# is that wait plus the 5 s a live mod takes to poll again (modRepollGrace).
HOLD_SECONDS = 25.0
STALE_SECONDS = 30.0
MAX_ACK_BYTES = 64 * 1024  # docs/hooks/mod-control.md: the room an answer needs
MAX_QUESTION_BYTES = 8 * 1024  # docs/hooks/mod-control.md: `question` at most 8 KiB

# The six kinds of the contract and the fields each carries besides id and
# kind (modcontrol.go ownModFields, the `notification` of modprompt.go, and
# `ask`'s question from docs/hooks/mod-control.md).
CONTRACT_KINDS: Mapping[str, Tuple[str, ...]] = {
    "prompt": ("text", "notification"),
    "abort": (),
    "model": ("model",),
    "effort": ("effort",),
    "command": ("name", "args"),
    "ask": ("question",),
}

# modcontrol.go defaultWritingCommands: run through a mod, these save their
# value as the default of every new session; the kinds change this one only.
DEFAULT_WRITING_COMMANDS = {"model": "model", "effort": "effort"}

# modcontrol.go: what a mod acks for a kind it does not know, and what lich's
# RunModCommand tells its caller instead.
UNKNOWN_KIND = "unknown kind"
PLUGIN_TOO_OLD = (
    "this session's lich-plugin is too old for it: update lich-plugin to 0.15.0 or later, then restart the session"
)

# Fields that are strings on the wire, where lich's encoding (omitempty)
# sends an empty one as no field at all.
_OPTIONAL_STRINGS = ("model", "effort", "args")


class Refused(Exception):
    """lich will not queue this command; the text says why and what to do."""


class NotPolling(Refused):
    """The session's mod is not polling: nobody would take the command."""


def check_command(command: Mapping[str, Any], kinds: Mapping[str, Tuple[str, ...]] = CONTRACT_KINDS) -> Dict[str, Any]:
    """The command as lich would queue it, or `Refused` with lich's reason.

    The rules run in lich's order (modcontrol.go queueModCommand): a known
    kind, a runnable slash command, only the kind's own fields, a prompt
    with text. `id` is this stub's addition: a caller may name its command.
    """
    kind = command.get("kind")
    if not isinstance(kind, str) or kind not in kinds:
        raise Refused(f"unknown mod command kind {_quoted(kind)}")
    queued = {name: value for name, value in command.items() if value is not None}
    if "id" in queued and (not isinstance(queued["id"], str) or not queued["id"]):
        raise Refused("a command's id must be a non-empty string")
    for name, value in list(queued.items()):
        if name in ("id", "kind", "notification"):
            continue
        if not isinstance(value, str):
            raise Refused(f"{kind} command's {name} must be a string")
        if name in _OPTIONAL_STRINGS and value == "":
            del queued[name]
    if kind == "command":
        queued["name"] = _runnable_name(queued.get("name", ""))
    own = set(kinds[kind]) | {"id", "kind"}
    strangers = sorted(name for name in queued if name not in own)
    if strangers:
        raise Refused(f"{kind} command carries a field that belongs to another kind ({', '.join(strangers)})")
    if kind == "prompt":
        if not queued.get("text", "").strip():
            raise Refused("prompt command has no text")
        if "notification" in queued and not _is_notification(queued["notification"]):
            raise Refused("a prompt's notification must be an object with a status and a summary, both strings")
    if kind == "ask":
        question = queued.get("question", "")
        if not question.strip():
            raise Refused("ask command has no question")
        if len(question.encode("utf-8", "surrogatepass")) > MAX_QUESTION_BYTES:
            raise Refused(f"ask command's question is over {MAX_QUESTION_BYTES // 1024} KiB")
    return queued


def _runnable_name(name: str) -> str:
    """The slash command's name as the mod passes it on (one leading slash
    dropped), or `Refused`: modcontrol.go runnableCommand, which reads the
    first word with every leading slash gone, so no spelling of /model or
    /effort reaches Claude Code."""
    name = name.strip()
    if name.startswith("/"):
        name = name[1:]
    if not name:
        raise Refused("a command needs the name of a slash command, and none was given")
    first = name.split()[0].lstrip("/").lower()
    kind = DEFAULT_WRITING_COMMANDS.get(first)
    if kind is not None:
        raise Refused(
            f"/{first} is refused as a command: Claude Code saves what it sets as the default for every "
            f"new session. The {kind} action changes this session only"
        )
    return name


def _is_notification(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and set(value) == {"status", "summary"}
        and all(isinstance(value[name], str) for name in ("status", "summary"))
    )


def validate_ack(doc: Any, kinds: Mapping[str, Tuple[str, ...]] = CONTRACT_KINDS) -> Optional[str]:
    """None for an ack lich takes, else the reason it answers 400 with.

    The shape rules and their wording are the contract's (tests/fixtures/
    acks.jsonl); the kind must be one lich knows (modcontrol.go parseModAck,
    in its words). The id is not checked against anything: lich accepts an
    ack nobody waits on like any other.
    """
    if not isinstance(doc, dict):
        return "body must be a JSON object"
    for name in ("session_id", "id", "kind"):
        if name not in doc or doc[name] is None:
            return f"{name} is required"
        if not isinstance(doc[name], str) or not doc[name]:
            return f"{name} must be a non-empty string"
    if doc["kind"] not in kinds:
        return f"mod ack has unknown kind {_quoted(doc['kind'])}"
    if not isinstance(doc.get("ok"), bool):
        return "ok must be a boolean"
    if "error" in doc and not isinstance(doc["error"], str):
        return "error must be a string"
    if "answer" in doc:
        if doc["kind"] != "ask" or doc["ok"] is not True:
            return "only an answered ask carries an answer"
        if not isinstance(doc["answer"], str):
            return "answer must be a string"
    return None


def reported_error(ack: Optional[Mapping[str, Any]]) -> Optional[str]:
    """A failed ack's error as lich reports it to whoever issued the command:
    a mod's `unknown kind` means its plugin predates the kind."""
    if ack is None or ack.get("ok") is True:
        return None
    error = ack.get("error")
    return PLUGIN_TOO_OLD if error == UNKNOWN_KIND else error


def parse_json(raw: bytes) -> Any:
    """The document in `raw`, or None for anything that does not parse.

    Hostile input may fail at any depth and in more ways than ValueError
    (nesting deep enough raises RecursionError): every one is a bad body.
    """
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _quoted(value: Any) -> str:
    """As Go's %q shows a string, for the kinds lich quotes in its errors."""
    return json.dumps(value if isinstance(value, str) else str(value), ensure_ascii=False)
