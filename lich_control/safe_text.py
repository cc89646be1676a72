"""Text from outside made safe to show: the token taken out, the length cut,
what a terminal or a log reader would act on escaped.

lich chooses every id, kind and reason it sends, and an error text may quote
a URL, and so the token. The log filter and the status document both pass
such text through one `Scrub`, so what one hides the other hides too.

    scrub = Scrub.of(token)
    scrub(text)                 # redacted, cut to 200 characters, escaped
    scrub(text, limit=4096)     # a log message's own limit
    scrub.redact(text)          # only the token taken out (a traceback)
"""
from __future__ import annotations

import re
from typing import Tuple
from urllib.parse import quote, unquote, unquote_plus

import attrs

# Where a string lich sent is cut as it enters the status document.
LIMIT = 200
CUT = "…"
REDACTED = "[token]"

# Control characters (a newline starts a forged log line, an ESC drives the
# terminal lich-mod-status prints on), lone surrogates (no encoder takes
# them), and the two line separators some readers break lines at.
_UNSAFE = re.compile("([\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029])")


@attrs.frozen
class Scrub:
    """Makes one text safe to show; holds the forms of the token it hides."""

    forms: Tuple[str, ...] = attrs.field(repr=False)  # never in a repr or a traceback

    @classmethod
    def of(cls, secret: str) -> "Scrub":
        """The token as it is and as a URL carries it: quoted as the daemon
        quotes it (nothing safe), and as most clients would (`/` left)."""
        if not secret:
            return cls(())
        raw = secret.encode("utf-8", "surrogatepass")
        forms = (secret, quote(raw, safe=""), quote(raw))
        return cls(tuple(dict.fromkeys(forms)))  # each once, in that order

    def __call__(self, text: str, limit: int = LIMIT) -> str:
        # Redacted before the cut, so no part of the token is left at the cut;
        # escaped after it, so a 15 MB text is never escaped whole.
        text = _escape_within(cut(self.redact(text), limit), limit)
        return self.redact(text)  # an escape could spell a token with a backslash in it

    def redact(self, text: str) -> str:
        for secret in self.forms:
            if secret in text:
                text = text.replace(secret, REDACTED)
        if self.forms and ("%" in text or "+" in text):
            # Quoted some other way (lower-case hex, `+` for a space): found
            # in the text as decoded, which is then what is shown.
            for decode in (unquote, unquote_plus):
                decoded = decode(text)
                if self.forms[0] in decoded:
                    text = decoded.replace(self.forms[0], REDACTED)
        return text


def cut(text: str, limit: int) -> str:
    """`text`, or its first `limit - 1` characters and `…`."""
    return text if len(text) <= limit else text[: limit - 1] + CUT


def escape(text: str) -> str:
    """Python's escapes (`\\n`, `\\x1b`, `\\udc80`) for the unsafe characters; the rest as it is."""
    return _UNSAFE.sub(lambda m: _escaped(m.group()), text)


def _escaped(char: str) -> str:
    return char.encode("unicode_escape").decode("ascii")


def _escape_within(text: str, limit: int) -> str:
    """`escape(text)`, cut to `limit` between escapes, never inside one."""
    whole = escape(text)
    if len(whole) <= limit:
        return whole
    shown, room = [], limit - len(CUT)
    for n, piece in enumerate(_UNSAFE.split(text)):  # odd pieces: one unsafe character each
        piece = _escaped(piece) if n % 2 else piece
        if len(piece) > room:
            shown.append("" if n % 2 else piece[:room])
            break
        shown.append(piece)
        room -= len(piece)
    return "".join(shown) + CUT
