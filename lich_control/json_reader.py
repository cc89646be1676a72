"""JSON from outside the daemon, read within its memory bound (`loads`):
lich's poll answers (poller.read_answer) and the relay's posts (bridge_server)."""
from __future__ import annotations

import json
import re
from typing import Any

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


def loads(body: bytes) -> Any:
    """One document, read as json.loads reads bytes but for two things: an
    integer of more than 4,300 digits, which Python refuses the whole document
    for, reads as infinity; and one of more than MAX_VALUES values is refused
    (TooMany) before anything is built. Else ValueError (not JSON, or not in a
    Unicode encoding) or RecursionError (nested deeper than the stack)."""
    text = body.decode(json.detect_encoding(body), "surrogatepass")
    if count_values(text) > MAX_VALUES:
        raise TooMany(f"the body holds more than {MAX_VALUES:,} JSON values")
    return json.loads(text, parse_int=_int_or_inf)


def count_values(text: str) -> int:
    """The brackets and commas of a JSON text, its strings left out."""
    bare = _STRING.sub("", text)
    return sum(map(bare.count, "[]{},"))
