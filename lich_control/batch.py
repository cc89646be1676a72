"""Reading JSON from lich and the relay so that no one value costs the rest.

Python's own parser refuses a whole document for one integer of more than
4,300 digits, or for nesting deeper than the interpreter's stack, and builds
every value before it returns: a 16 MiB poll answer of `{}` is 5.5 million
dicts. Both documents read here come from outside the daemon:

- `loads` reads one document (a relay's message) as `json.loads` does, but
  an over-long integer becomes an infinite float (no field takes a number,
  so such a value is refused field by field instead of the message whole),
  and a large one is first counted: past MAX_VALUES it is refused unbuilt.
- `Answer` reads one poll answer, a JSON array, item by item as the poller
  asks for them: at most MAX_ITEMS items, at most MAX_VALUES values built
  from a large answer, an item nested too deep skipped alone, one that is
  not UTF-8 handed out marked so (`NotUtf8`), and the items before a syntax
  error handed out all the same.

Only the standard library parses: `raw_decode` reads each item, and the one
walk over brackets done here (to find where an item ends without building
it) leaves strings to `scanstring`.
"""
from __future__ import annotations

import collections
import json
import re
from json.decoder import scanstring
from typing import Any, Iterator, Optional, Tuple

import attrs

# lich hands a poll every command queued for the session, with no cap of
# its own: a script may queue thousands at once (the benchmark's burst is
# 2,000). Ten thousand is past any such use, and each one costs an ack.
MAX_ITEMS = 10_000
# Values (brackets and commas) one large answer may build: ~100 bytes each
# once built, so ~10 MB at most, where the raw text could make 5.5 million.
MAX_VALUES = 100_000
# An answer this short builds at most ~20,000 values: it is read without
# first walking each item's brackets, which keeps the usual poll fast.
SMALL_ANSWER = 64 * 1024

TOO_DEEP = "nested deeper than Python reads"


def _int_or_inf(digits: str) -> Any:
    try:
        return int(digits)
    except ValueError:  # past sys.get_int_max_str_digits: no field takes a number anyway
        return float(digits)


_DECODER = json.JSONDecoder(parse_int=_int_or_inf)
_SPACE = re.compile(r"[ \t\n\r]*")
_STRUCTURE = re.compile(r'["\[\]{},]')
# What surrogateescape makes of a byte that is not UTF-8.
_BAD_BYTE = re.compile("[\udc80-\udcff]")
_SKIPPED = object()
_OVER_ITEMS = f"holds more than {MAX_ITEMS:,} items; the rest of it was dropped"


def loads(body: bytes) -> Any:
    """One JSON document, as json.loads reads it but for over-long integers,
    and never one that would build more than MAX_VALUES values (TooMany).
    Raises ValueError (not JSON, not UTF-8) or RecursionError (too deep)."""
    text = body.decode("utf-8", "surrogatepass")
    if len(text) > SMALL_ANSWER:
        start = _SPACE.match(text).end()
        if text.startswith(("[", "{"), start):
            try:
                _extent(text, start, MAX_VALUES)  # counted before anything is built
            except _OverBudget:
                raise TooMany(f"the body holds more than {MAX_VALUES:,} JSON values") from None
    return _DECODER.decode(text)


class TooMany(ValueError):
    """A document that would build more values than one message may."""


@attrs.frozen
class NotUtf8:
    """An item with bytes that are not UTF-8, each read as a lone surrogate
    (U+DC80 to U+DCFF): its id may still be sound, and get its ack."""

    value: Any


def garbled(text: str) -> bool:
    """Whether a string read from such an item holds a byte that was not UTF-8."""
    return _BAD_BYTE.search(text) is not None


class NotAnArray(ValueError):
    """The answer is not a JSON array at all: nothing in it can be read."""


class _OverBudget(Exception):
    pass


def read_answer(body: bytes) -> "Answer":
    """The answer's items, to be read as they are iterated; NotAnArray at once
    when it does not even begin as an array."""
    try:
        text = body.decode("utf-8", "surrogatepass")  # as json.loads decodes bytes
        bad_bytes = False
    except UnicodeDecodeError:
        # Keep the items that are UTF-8; those that are not are skipped below.
        text, bad_bytes = body.decode("utf-8", "surrogateescape"), True
    start = _SPACE.match(text, 1 if text.startswith("\ufeff") else 0).end()
    if not text.startswith("[", start):
        raise NotAnArray(_what_instead(text))
    return Answer(text, start + 1, bad_bytes)


class Answer:
    """One poll answer's items, read one at a time as they are iterated.

    Iterated once, by one thread (the poller's). Afterwards `read` is how many
    items were handed out, `skipped` counts the items left out by reason,
    `ended` says why reading stopped before the array's end (None when it was
    read to the end), and `broken` whether that was a syntax error.
    """

    def __init__(self, text: str, start: int, bad_bytes: bool = False):
        self._text = text
        self._start = start
        self._bad_bytes = bad_bytes
        self._walk = len(text) > SMALL_ANSWER
        self._values = 0
        self.read = 0
        self.skipped: "collections.Counter[str]" = collections.Counter()
        self.ended: Optional[str] = None
        self.broken = False

    def __iter__(self) -> Iterator[Any]:
        if not self._walk and not self._bad_bytes:
            # The usual answer, short and sound, read whole: what it builds is
            # small, and one parse is twice as quick as one per item.
            try:
                whole = _DECODER.decode(self._text)
            except (ValueError, RecursionError):
                pass  # read item by item below, to keep what can be kept
            else:
                for value in whole[:MAX_ITEMS]:
                    self.read += 1
                    yield value
                if len(whole) > MAX_ITEMS:
                    self.ended = _OVER_ITEMS
                return
        text = self._text
        pos = _SPACE.match(text, self._start).end()
        if text.startswith("]", pos):
            self._close(pos + 1)
            return
        taken = 0
        while True:
            if taken == MAX_ITEMS:
                self.ended = _OVER_ITEMS
                return
            try:
                value, end = self._item(pos)
            except _OverBudget:
                self.ended = f"builds more than {MAX_VALUES:,} JSON values; the rest of it ({_size(len(text) - pos)}) was dropped"
                return
            except ValueError:
                self._break()
                return
            taken += 1
            if value is not _SKIPPED:
                self.read += 1
                yield value
            pos = _SPACE.match(text, end).end()
            if text.startswith(",", pos):
                pos = _SPACE.match(text, pos + 1).end()
            elif text.startswith("]", pos):
                self._close(pos + 1)
                return
            else:
                self._break()
                return

    def _item(self, pos: int) -> Tuple[Any, int]:
        text, end = self._text, None
        if self._walk and text.startswith(("[", "{"), pos):
            end, values = _extent(text, pos, MAX_VALUES - self._values)
            self._values += values
        try:
            value, end = _DECODER.raw_decode(text, pos)
        except RecursionError:
            if end is None:  # a short answer: the walk is short too
                end, _ = _extent(text, pos, None)
            self.skipped[TOO_DEEP] += 1
            return _SKIPPED, end
        if self._bad_bytes and _BAD_BYTE.search(text, pos, end):
            return NotUtf8(value), end
        return value, end

    def _close(self, end: int) -> None:
        if _SPACE.match(self._text, end).end() != len(self._text):
            self._break()

    def _break(self) -> None:
        self.broken = True
        taken = self.read + sum(self.skipped.values())
        self.ended = f"is not JSON after its first {taken} item{'' if taken == 1 else 's'}" if taken else "is not JSON"


def _extent(text: str, pos: int, budget: Optional[int]) -> Tuple[int, int]:
    """Where the array or object at `pos` ends, and how many values it holds
    (its brackets and commas), found without building it; _OverBudget past
    `budget` values, ValueError if it never ends."""
    depth = values = 0
    while True:
        found = _STRUCTURE.search(text, pos)
        if found is None:
            raise json.JSONDecodeError("an array or object that never ends", text, pos)
        char, pos = found.group(), found.end()
        if char == '"':
            pos = scanstring(text, pos)[1]
            continue
        values += 1
        if budget is not None and values > budget:
            raise _OverBudget()
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth == 0:
                return pos, values


def _what_instead(text: str) -> str:
    # A short answer is parsed whole, to tell bad JSON from JSON of another
    # shape; a long one is not built at all.
    if len(text) <= SMALL_ANSWER:
        try:
            _DECODER.decode(text)
        except (ValueError, RecursionError):
            return "a body that is not JSON"
        return "JSON that is not an array"
    return "a body that is not a JSON array"


def _size(chars: int) -> str:
    # Characters, which are bytes but for the text beyond ASCII: near enough.
    return f"about {chars / (1024 * 1024):.1f} MiB" if chars >= 1024 * 1024 else f"about {chars:,} bytes"
