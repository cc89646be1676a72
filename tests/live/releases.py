"""The Claude Code releases the live test runs on, and what each does with
the plugin's mod: the table in docs/install.md ("Which Claude Code"), as
the test needs it.

    LICH_LIVE_RELEASES  the releases the session test runs on
                        (default: the oldest that runs mods, one from the middle, the last
                        without $.process.hookEnv and $.session.info, and the pinned one)
    LICH_LIVE_DEGRADE   the releases that must skip the mod cleanly (default: 2.1.278 2.1.200)
    LICH_LIVE_INSTALL   the releases the install check runs on (default: 2.1.325, the last
                        without $.process.hookEnv, and the pinned one)
    LICH_LIVE_REFUSING  the releases whose refusal of the relay's requests (nonessential
                        traffic off) must keep lich out, and say so (default: 2.1.280,
                        which the session test installs already)

Each is installed from the npm registry by .ci/claude-code when it is not
cached yet; the pinned one is LICH_LIVE_CLAUDE's when that is set.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from devlich import Unavailable
from workspace import CHECKOUT

PINNED = "2.1.332"
SESSION_RELEASES = ("2.1.280", "2.1.300", "2.1.325", PINNED)
DEGRADE_RELEASES = ("2.1.278", "2.1.200")
# The install check also runs where the relay names the data folder itself.
INSTALL_RELEASES = ("2.1.325", PINNED)
REFUSING_RELEASES = ("2.1.280",)

# Mods are off by default from 2.1.280 to 2.1.285 in a session with no
# feature-flag server, as here; this switch turns them on.
FORCE_MODS = {"CLAUDE_CODE_ENABLE_FUNCTION_HOOKS": "1"}
# Up to 2.1.287 Claude Code refuses every $.http.fetch of a plugin while
# nonessential traffic is off, the relay's posts to its daemon included:
# there lich cannot control the session (test_refused.py).
TRAFFIC_ON = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": None}
TRAFFIC_OFF = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}


def key(version: str) -> Tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


@dataclass(frozen=True)
class Release:
    """One Claude Code release, its binary, and what the table says of it."""

    version: str
    binary: str

    @property
    def runs_mods(self) -> bool:
        return key(self.version) >= (2, 1, 280)

    @property
    def refuses_fetch(self) -> bool:
        """Whether it refuses a plugin's every $.http.fetch while nonessential
        traffic is off (2.1.280 to 2.1.287)."""
        return self.runs_mods and key(self.version) < (2, 1, 288)

    @property
    def env(self) -> Dict[str, Optional[str]]:
        """What a session on it needs for its mod to run, as changes to the
        environment (None removes): the switch before 2.1.286, and
        nonessential traffic left on where it would refuse the relay's requests."""
        env: Dict[str, Optional[str]] = {}
        if self.runs_mods and key(self.version) < (2, 1, 286):
            env.update(FORCE_MODS)
        if self.refuses_fetch:
            env.update(TRAFFIC_ON)
        return env

    @property
    def submits_as_user(self) -> bool:
        """Whether $.prompt.submit takes asUser (2.1.286 on); before, the
        model reads a plugin's prompt under the plugin's name."""
        return key(self.version) >= (2, 1, 286)

    def __str__(self) -> str:
        return self.version


def named(variable: str, default: Tuple[str, ...]) -> List[str]:
    """The releases a variable lists, else the default."""
    listed = os.environ.get(variable, "").split()
    return listed or list(default)


def session_releases() -> List[str]:
    return named("LICH_LIVE_RELEASES", SESSION_RELEASES)


def degrade_releases() -> List[str]:
    return named("LICH_LIVE_DEGRADE", DEGRADE_RELEASES)


def install_releases() -> List[str]:
    return named("LICH_LIVE_INSTALL", INSTALL_RELEASES)


def refusing_releases() -> List[str]:
    return named("LICH_LIVE_REFUSING", REFUSING_RELEASES)


def release(version: str, pinned_binary: str) -> Release:
    """The release, installed (by .ci/claude-code) when it is not there yet."""
    if version == PINNED:
        return Release(version, pinned_binary)
    done = subprocess.run([os.path.join(CHECKOUT, ".ci", "claude-code"), version], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not done.stdout.strip():
        raise Unavailable(f"no Claude Code {version} to run: {done.stderr.strip() or '.ci/claude-code found none'}")
    return Release(version, done.stdout.strip().splitlines()[-1])
