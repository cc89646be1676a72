"""The development lich's own endpoints, for `lich-stub control` and `ask`; lich has none of these.

    POST /stub/control?token=…  {"session_id", "command", "timeout"}
        queues one command and answers, once it is acked or the caller's
        wait is over, with `Outcome.to_json()`; 409 {"error", "not_polling"}
        when lich would refuse it, 400 for a body of another shape.
    GET  /stub/sessions?token=…
        who polled when, with the plugin release each named.
"""
from __future__ import annotations

import math
from typing import Dict, Tuple

import attrs

from .handler import Handler, Route
from .rules import NotPolling, Refused, parse_json

MAX_CONTROL_BYTES = 1024 * 1024
DEFAULT_TIMEOUT = 100.0


def control(req: Handler, query: Dict[str, list]) -> None:
    raw = req.body(MAX_CONTROL_BYTES)
    if raw is None:
        return
    doc = parse_json(raw)
    try:
        session_id, command = doc["session_id"], doc["command"]
        timeout = float(doc.get("timeout", DEFAULT_TIMEOUT))
        if not isinstance(session_id, str) or not session_id or not isinstance(command, dict) or not 0 <= timeout < math.inf:
            raise ValueError
    except (ValueError, KeyError, TypeError, OverflowError):
        return req.reply_json(400, {"error": "the body must be {session_id, command, timeout}"})
    try:
        cid = req.lich.queue(session_id, command)
    except Refused as exc:
        return req.reply_json(409, {"error": str(exc), "not_polling": isinstance(exc, NotPolling)})
    req.reply_json(200, req.lich.wait(cid, timeout).to_json())


def sessions(req: Handler, query: Dict[str, list]) -> None:
    req.reply_json(200, {"sessions": [attrs.asdict(info) for info in req.lich.sessions()]})


ROUTES: Dict[str, Tuple[str, Route]] = {
    "/stub/control": ("POST", control),
    "/stub/sessions": ("GET", sessions),
}
