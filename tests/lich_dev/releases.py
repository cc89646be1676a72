"""The plugin release each session's mod names in `X-Lich-Plugin`, checked as lich checks it.

lich (internal/agentplugin/compat.go) speaks the contract with plugin
releases from 0.13.0 up to, not including, 0.19.0. It keeps the release each
session last named (internal/terminal/pluginversion.go) and warns when a
session names one outside that range, a missing header included (a plugin
older than the header), once per session and release rather than once per
request: again only when the session names a different release.
"""
from __future__ import annotations

import logging
import threading
from typing import Dict, List, Optional, Tuple

FLOOR = "0.13.0"
CEILING = "0.19.0"


def release_key(version: str) -> Tuple[int, int, int, int]:
    """What lich sorts a release by (internal/semver): MAJOR, MINOR, PATCH,
    then a pre-release below its release. A leading `v` and build metadata
    are ignored; a missing or non-numeric part reads as 0."""
    version = version[1:] if version.startswith("v") else version
    version = version.split("+", 1)[0]
    core, dash, _ = version.partition("-")
    parts = [int(part) if part.isdigit() else 0 for part in core.split(".", 2)]
    parts += [0] * (3 - len(parts))
    return (parts[0], parts[1], parts[2], 0 if dash else 1)


def compatible(version: Optional[str]) -> bool:
    """Whether lich speaks the contract with this release; an absent one never."""
    if not version:
        return False
    return release_key(FLOOR) <= release_key(version) < release_key(CEILING)


def label(version: Optional[str]) -> str:
    """How a release reads in a log line."""
    return version if version else "absent"


class PluginReleases:
    """The release each session last named. Any connection thread notes one;
    a lock guards the map, and the warning is logged outside it."""

    def __init__(self, log: logging.Logger):
        self._log = log
        self._lock = threading.Lock()
        self._by_session: Dict[str, str] = {}
        self.warned: List[Tuple[str, str]] = []  # (session, release label), in order: what the log said

    def note(self, session_id: str, version: Optional[str]) -> None:
        version = version or ""
        with self._lock:
            seen = session_id in self._by_session
            before = self._by_session.get(session_id)
            self._by_session[session_id] = version
            if (seen and before == version) or compatible(version):
                return
            self.warned.append((session_id, label(version)))
        self._log.warning(
            "session %s: its mod names plugin release %s in X-Lich-Plugin, outside the range lich supports "
            "(%s up to, not including, %s); lich would show the session as plugin-incompatible",
            session_id, label(version), FLOOR, CEILING,
        )

    def of(self, session_id: str) -> Optional[str]:
        """The release the session last named: None if it never reported, "" if it sent no header."""
        with self._lock:
            return self._by_session.get(session_id)
