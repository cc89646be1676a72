"""Acks: the one answer lich gets for each command, encoded within its limit."""
from __future__ import annotations

import json
from typing import Optional

import attrs

# lich refuses (400) an ack body over 64 KiB.
MAX_BODY_BYTES = 64 * 1024
ANSWER_UNITS = 16_000  # UTF-16 code units, as JavaScript counts a string
TRUNCATED = "\n[truncated]"


class AckTooLarge(Exception):
    """Even with its free text cut, the ack would not fit lich's limit."""


@attrs.frozen
class Ack:
    session_id: str
    id: str
    kind: str
    ok: bool
    error: Optional[str] = None
    answer: Optional[str] = None

    def body(self) -> bytes:
        """The ack as UTF-8 JSON, measured to stay under lich's limit.

        The 16,000-unit cut alone does not bound the bytes (an answer of
        control characters encodes at six bytes a unit), so a body that is
        still too large has its answer, or else its error, cut further.
        """
        answer = cut_answer(self.answer) if self.answer is not None else None
        body = _encode(self._doc(answer, self.error))
        if len(body) < MAX_BODY_BYTES:
            return body
        if answer is not None:
            return self._shrunk(lambda text: self._doc(text, self.error), self.answer)
        if self.error is not None:
            return self._shrunk(lambda text: self._doc(None, text), self.error)
        raise AckTooLarge(f"the ack for {self.id[:40]!r} is over {MAX_BODY_BYTES} bytes")

    def _doc(self, answer: Optional[str], error: Optional[str]) -> dict:
        doc = {"session_id": self.session_id, "id": self.id, "kind": self.kind, "ok": self.ok}
        if error is not None:
            doc["error"] = error
        if answer is not None:
            doc["answer"] = answer
        return doc

    def _shrunk(self, build, text: str) -> bytes:
        # The largest prefix (in UTF-16 units) whose body fits: bodies grow
        # with the prefix, so a binary search finds it in ~15 encodings.
        units = _utf16_units(text)
        low, high = 0, min(units, ANSWER_UNITS)
        while low < high:
            mid = (low + high + 1) // 2
            if len(_encode(build(_prefix(text, mid) + TRUNCATED))) < MAX_BODY_BYTES:
                low = mid
            else:
                high = mid - 1
        body = _encode(build(_prefix(text, low) + TRUNCATED))
        if len(body) >= MAX_BODY_BYTES:
            raise AckTooLarge(f"the ack for {self.id[:40]!r} is over {MAX_BODY_BYTES} bytes")
        return body


def cut_answer(text: str) -> str:
    """Cut at 16,000 UTF-16 units, never inside a surrogate pair."""
    if len(text) <= ANSWER_UNITS // 2:  # each code point is at most two units
        return text
    if _utf16_units(text) <= ANSWER_UNITS:
        return text
    return _prefix(text, ANSWER_UNITS) + TRUNCATED


def _utf16_units(text: str) -> int:
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _prefix(text: str, units: int) -> str:
    """The first `units` UTF-16 units of text, one fewer if that would split a pair."""
    raw = text.encode("utf-16-le", "surrogatepass")[: units * 2]
    if len(raw) >= 2 and 0xD8 <= raw[-1] <= 0xDB:  # a high surrogate left alone
        raw = raw[:-2]
    return raw.decode("utf-16-le", "surrogatepass")


def _encode(doc: dict) -> bytes:
    # A lone surrogate (JSON allows "\ud800") cannot be UTF-8: it goes out as
    # the same JSON escape, which backslashreplace spells exactly that way.
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"))
    return text.encode("utf-8", "backslashreplace")
