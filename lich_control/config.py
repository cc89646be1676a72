"""What the daemon is told by its environment, and the names of its files.

The gate of bridge.md: all three LICH_* variables or nothing at all, and a
port that is a port. The token is kept in `Config` and reaches only the URLs
the lich client builds; `repr` leaves it out so no log or traceback shows it.
"""
from __future__ import annotations

import os
import re
from typing import Mapping, Optional

import attrs

from .system import native

VARIABLES = ("LICH_PORT", "LICH_TOKEN", "LICH_SESSION_ID")
# The suffix of the daemon's address: its socket, or (Windows) a file naming port and secret.
ADDRESS = native.ADDRESS
# sockaddr_un.sun_path is 108 bytes on Linux, 104 on macOS; keep under both.
MAX_SOCKET_PATH = 100
_PLAIN_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


class NotInLich(Exception):
    """A variable is missing: the daemon exits 0 and never polls."""


class BadConfig(Exception):
    """The environment names something unusable: one line, exit 2."""


@attrs.frozen
class Config:
    port: int
    token: str = attrs.field(repr=False)
    session_id: str
    run_dir: str

    @property
    def lich_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Config":
        missing = [name for name in VARIABLES if not env.get(name)]
        if missing:
            raise NotInLich(", ".join(missing))
        folder = run_dir(env)
        # os.environ keeps bytes that were not UTF-8 as lone surrogates: such
        # a value could go in no URL and no JSON. No value is shown, nor kept
        # as a cause (the token may be one).
        for value, problem in (
            (env["LICH_TOKEN"], "LICH_TOKEN is not valid UTF-8; lich sets it to text"),
            (env["LICH_SESSION_ID"], "LICH_SESSION_ID is not valid UTF-8; lich sets it to text"),
            # The hello names the socket in JSON: the relay would read U+FFFD in its path and lose every result.
            (folder, "the run folder is not valid UTF-8, so the relay could not reach the socket there; set LICH_CONTROL_RUN_DIR to another folder"),
        ):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise BadConfig(problem) from None
        config = cls(port=parse_port(env["LICH_PORT"]), token=env["LICH_TOKEN"], session_id=env["LICH_SESSION_ID"], run_dir=folder)
        socket_path = config.path(ADDRESS)
        if native.address_too_long(socket_path):
            raise BadConfig(f"the socket path {socket_path} is too long for a Unix socket; set LICH_CONTROL_RUN_DIR to a shorter folder")
        return config

    def path(self, suffix: str) -> str:
        """This session's file in the run folder: socket (or address), lock or log."""
        return session_path(self.run_dir, self.session_id, suffix)


def parse_port(raw: str) -> int:
    text = raw.strip()
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        shown = raw if len(raw) <= 20 else raw[:20] + "…"
        raise BadConfig(f"LICH_PORT must be a port number from 1 to 65535, not {shown!r}")
    return int(text)


def run_dir(env: Mapping[str, str]) -> str:
    """Always an absolute path: the hello names the socket in it, and the
    relay, in a folder of its own, could not reach a relative one."""
    if env.get("LICH_CONTROL_RUN_DIR"):
        return os.path.abspath(env["LICH_CONTROL_RUN_DIR"])
    return native.run_dir(env)


def session_path(folder: str, session_id: str, suffix: str) -> str:
    """`<session>.<suffix>`, or a short hashed name when the id is not a
    plain file name or the path would be too long for a Unix socket."""
    if _PLAIN_NAME.fullmatch(session_id) and not session_id.startswith("."):
        plain = os.path.join(folder, f"{session_id}.sock")
        if len(os.fsencode(plain)) <= MAX_SOCKET_PATH:
            return os.path.join(folder, f"{session_id}.{suffix}")
    import hashlib  # only for the rare awkward id: loading OpenSSL slows a start

    digest = hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return os.path.join(folder, f"s-{digest}.{suffix}")


def lock_wait(env: Mapping[str, str], default: float = 5.0) -> float:
    """LICH_CONTROL_LOCK_WAIT: how long a second daemon waits for the session's lock."""
    try:
        return max(0.0, float(env.get("LICH_CONTROL_LOCK_WAIT", default)))
    except ValueError:
        return default


def expected_parent(env: Mapping[str, str], started_by: Optional[int]) -> Optional[int]:
    """The pid the daemon's parent must have: LICH_CONTROL_PARENT_PID when
    the spawner names itself (so a parent that died before the daemon ran a
    line is seen), else `started_by` (None on Windows: no parent watched)."""
    raw = env.get("LICH_CONTROL_PARENT_PID")
    if not raw:
        return started_by
    if not (raw.isascii() and raw.isdigit()):
        raise BadConfig(f"LICH_CONTROL_PARENT_PID must be the spawner's process id, not {raw!r}")
    return int(raw)
