"""What lich refuses, and how it words it: the development lich's contract model.

Pure functions over command and ack documents, no I/O. Each rule names the
place in lich's server (github.com/omartelo/lich) it was read from; where
lich has wording, the text here is lich's, so a person who met a refusal in
the stub recognises it in lich. docs/dev-lich.md lists where the stub
differs on purpose.
"""
from __future__ import annotations

import codecs
import json
import re
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

# internal/relay: the statuses a prompt's notification carries.
NOTIFICATION_STATUSES = ("completed", "waiting")

# What Go's strings.TrimSpace and strings.Fields take for white space
# (unicode.IsSpace): Python's str.strip also takes U+001C..U+001F.
_GO_SPACE = "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_GO_FIELD = re.compile(f"[^{_GO_SPACE}]+")
_SURROGATE = re.compile("[\ud800-\udfff]")


class Refused(Exception):
    """lich will not queue this command; the text says why and what to do."""


class NotPolling(Refused):
    """The session's mod is not polling: nobody would take the command."""


def check_command(command: Mapping[str, Any], kinds: Mapping[str, Tuple[str, ...]] = CONTRACT_KINDS) -> Dict[str, Any]:
    """The command as lich would queue it, or `Refused` with lich's reason.

    The rules run in lich's order (modcontrol.go queueModCommand): a known
    kind, a runnable slash command, only the kind's own fields, a prompt
    with text. lich holds a command in a Go struct whose empty strings are
    no field at all (`omitempty`), so an empty field here is an absent one,
    and a Go string holds no lone surrogate. `id` is this stub's addition:
    a caller may name its command.
    """
    kind = command.get("kind")
    if not isinstance(kind, str) or kind not in kinds:
        raise Refused(f"unknown mod command kind {go_quote(kind)}")
    queued = {name: value for name, value in command.items() if value is not None and value != ""}
    if command.get("id") is not None and (not isinstance(command["id"], str) or not command["id"]):
        raise Refused("a command's id must be a non-empty string")
    for name, value in queued.items():
        if name in ("id", "kind", "notification"):
            continue
        if not isinstance(value, str):
            raise Refused(f"{kind} command's {name} must be a string")
        queued[name] = go_string(value)
    if kind == "command":
        queued["name"] = _runnable_name(queued.get("name", ""))
    own = set(kinds[kind]) | {"id", "kind"}
    strangers = sorted(name for name in queued if name not in own)
    if strangers:
        raise Refused(f"{kind} command carries a field that belongs to another kind")
    if kind == "prompt":
        if _go_blank(queued.get("text", "")):
            raise Refused("prompt command has no text")
        if "notification" in queued:
            queued["notification"] = _notification(queued["notification"])
    if kind == "ask":
        question = queued.get("question", "")
        if _go_blank(question):
            raise Refused("ask command has no question")
        if len(question.encode("utf-8")) > MAX_QUESTION_BYTES:
            raise Refused(f"ask command's question is over {MAX_QUESTION_BYTES // 1024} KiB")
    return queued


def _runnable_name(name: str) -> str:
    """The slash command's name as the mod passes it on (one leading slash
    dropped), or `Refused`: modcontrol.go runnableCommand, which reads the
    first word with every leading slash gone, so no spelling of /model or
    /effort reaches Claude Code."""
    name = name.strip(_GO_SPACE)
    if name.startswith("/"):
        name = name[1:]
    if not name:
        raise Refused("a command needs the name of a slash command, and none was given")
    first = _GO_FIELD.search(name).group().lstrip("/").lower()
    kind = DEFAULT_WRITING_COMMANDS.get(first)
    if kind is not None:
        raise Refused(
            f"/{first} is refused as a command: Claude Code saves what it sets as the default for every "
            f"new session. The {kind} action changes this session only"
        )
    return name


def _notification(value: Any) -> Dict[str, str]:
    """A prompt's notification as lich queues it (a status it knows and a
    summary to show), or `Refused` in lich's words (modcontrol.go
    checkNotification). The shape check is the stub's: lich reads the
    notification into a Go struct, which has no other shape."""
    if not isinstance(value, dict) or set(value) != {"status", "summary"} or not all(isinstance(v, str) for v in value.values()):
        raise Refused("a prompt's notification must be an object with a status and a summary, both strings")
    if value["status"] not in NOTIFICATION_STATUSES:
        raise Refused(f"unknown notification status {go_quote(value['status'])}")
    if _go_blank(value["summary"]):
        raise Refused("a notification needs a summary, and none was given")
    return {"status": value["status"], "summary": go_string(value["summary"])}


def _go_blank(text: str) -> bool:
    return not text.strip(_GO_SPACE)


def go_string(text: str) -> str:
    """`text` as a Go string can hold it: every lone surrogate is U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def validate_ack(doc: Any, kinds: Mapping[str, Tuple[str, ...]] = CONTRACT_KINDS) -> Optional[str]:
    """None for an ack lich takes, else the reason it answers 400 with.

    What lich takes is what Go decodes into its ack struct (modcontrol.go
    parseModAck): a null or an empty string is the field's zero value, so
    `ok` missing or null reads as false and an empty `answer` is no answer.
    The wording is the contract fixtures' (tests/fixtures/acks.jsonl), and
    lich's own where it has one (an unknown kind). The id is not checked
    against anything: lich accepts an ack nobody waits on like any other.
    """
    if not isinstance(doc, dict):
        return "body must be a JSON object"
    for name in ("session_id", "id", "kind"):
        if doc.get(name) is None:
            return f"{name} is required"
        if not isinstance(doc[name], str) or not doc[name]:
            return f"{name} must be a non-empty string"
    if doc["kind"] not in kinds:
        return f"mod ack has unknown kind {go_quote(doc['kind'])}"
    if doc.get("ok") is not None and not isinstance(doc["ok"], bool):
        return "ok must be a boolean"
    if doc.get("error") is not None and not isinstance(doc["error"], str):
        return "error must be a string"
    answer = doc.get("answer")
    if answer is not None and not isinstance(answer, str):
        return "answer must be a string"
    if answer and (doc["kind"] != "ask" or doc.get("ok") is not True):
        return "only an answered ask carries an answer"
    return None


def reported_error(ack: Optional[Mapping[str, Any]]) -> Optional[str]:
    """A failed ack's error as lich reports it to whoever issued the command:
    trimmed of white space as lich takes it (parseModAck), then a mod's
    `unknown kind` means its plugin predates the kind."""
    if ack is None or ack.get("ok") is True:
        return None
    error = ack.get("error")
    if isinstance(error, str):
        error = error.strip(_GO_SPACE)
    return PLUGIN_TOO_OLD if error == UNKNOWN_KIND else error


def parse_json(raw: bytes) -> Any:
    """The document in `raw` as Go's encoding/json reads it, or None for
    anything that does not parse.

    Go reads the bytes as UTF-8 and puts U+FFFD for each byte that is not,
    and for each lone surrogate a \\u escape names; it knows no NaN or
    Infinity. Hostile input may fail at any depth and in more ways than
    ValueError (nesting deep enough raises RecursionError): every one is a
    bad body.
    """
    try:
        return _go_strings(json.loads(raw.decode("utf-8", "lich-dev-go"), parse_constant=_no_constant))
    except (ValueError, RecursionError):
        return None


def encode_answer(doc: Any) -> bytes:
    """A poll's answer as lich writes it: Go's json.NewEncoder(w).Encode, compact,
    with <, >, &, U+2028 and U+2029 escaped and the newline Encode ends with."""
    text = go_string(json.dumps(doc, ensure_ascii=False, separators=(",", ":")))
    for char, escape in _GO_ESCAPES:
        text = text.replace(char, escape)
    return (text + "\n").encode("utf-8")


_GO_ESCAPES = (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def _go_byte_replace(error: UnicodeDecodeError) -> Tuple[str, int]:
    return "\ufffd", error.start + 1  # one U+FFFD per byte, as Go's decoder puts them


codecs.register_error("lich-dev-go", _go_byte_replace)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _go_strings(doc: Any) -> Any:
    if isinstance(doc, str):
        return go_string(doc)
    if isinstance(doc, list):
        return [_go_strings(item) for item in doc]
    if isinstance(doc, dict):
        return {go_string(key): _go_strings(value) for key, value in doc.items()}
    return doc


# What Go's strconv.Quote writes for these instead of the character itself.
_GO_QUOTE_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\v": "\\v", '"': '\\"', "\\": "\\\\"}


def go_quote(value: Any) -> str:
    """`value` as Go's %q writes a string, for what lich quotes in its
    errors: printable characters as they are (Python's isprintable and Go's
    unicode.IsPrint draw the same line), C escapes, then \\xhh below U+0080,
    \\uhhhh, \\Uhhhhhhhh. A field lich's Go struct did not get is the empty string."""
    text = "" if value is None else go_string(value if isinstance(value, str) else str(value))
    out = []
    for char in text:
        code = ord(char)
        if char in _GO_QUOTE_ESCAPES:
            out.append(_GO_QUOTE_ESCAPES[char])
        elif char.isprintable():
            out.append(char)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    return '"' + "".join(out) + '"'
