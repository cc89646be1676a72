"""The Claude Code releases the live test runs on, and what each does with
the plugin's mod: the table in docs/install.md ("Which Claude Code") is
written from TABLE here (`make release-table`, which runs this file), and
tests/test_live_releases.py fails when the two disagree.

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
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

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


@dataclass(frozen=True)
class Row:
    """One row of the table: the releases from `first` to `last` (None: and
    every later one), whether the mod runs there, what it does and what lich
    can do, and the releases it was measured on, each with its note if any."""

    first: str
    last: Optional[str]
    runs_mod: bool
    mod: str
    control: str
    measured: Tuple[str, ...]
    notes: Mapping[str, str] = field(default_factory=dict)

    def covers(self, version: str) -> bool:
        return key(self.first) <= key(version) and (self.last is None or key(version) <= key(self.last))

    @property
    def releases(self) -> str:
        if self.last is None:
            return f"{self.first} and later"
        if self.last == self.first:
            return self.first
        adjacent = key(self.last)[:-1] == key(self.first)[:-1] and key(self.last)[-1] == key(self.first)[-1] + 1
        return f"{self.first} {'and' if adjacent else 'to'} {self.last}"

    def measured_on(self) -> str:
        notes = {**self.notes, PINNED: "the pinned one"}
        return ", ".join(f"{version} ({notes[version]})" if version in notes else version for version in self.measured)


NONESSENTIAL = "`CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC`"
REFUSED = 'refused: "no mod has ever polled"'

# What was measured, newest first: a live session on each measured release
# that runs the mod, with every command kind, and where the mod does not
# run, a session that works while lich is refused, with no error or warning
# of the plugin. A release make canary passed on goes into its row's
# `measured` (then make release-table).
TABLE = (
    Row("2.1.326", None, True, "runs", "every command kind", ("2.1.326", "2.1.331", PINNED)),
    Row("2.1.288", "2.1.325", True,
        "runs; Claude Code does not yet hand over its hook variables (`$.process.hookEnv`) or say its platform "
        "(`$.session.info`): the relay names the plugin's data folder itself, the daemon takes the parent it finds "
        "as it starts, and the plugin's folder tells Windows",
        "every command kind", ("2.1.289", "2.1.300", "2.1.325")),
    Row("2.1.286", "2.1.287", True,
        f"runs, as above, with {NONESSENTIAL} unset; with it set, Claude Code refuses the relay's requests to its "
        "daemon (`$.http.fetch`), so no daemon runs, and the screen and the debug log say why "
        "([Nonessential traffic](#nonessential-traffic-before-21288))",
        f"every command kind, with that variable unset; with it set, {REFUSED}", ("2.1.286", "2.1.287")),
    Row("2.1.280", "2.1.285", True,
        f"runs where mods are on, as 2.1.286 and 2.1.287 otherwise ({NONESSENTIAL} included): off by default in a "
        "session with no feature-flag server (a third-party `ANTHROPIC_BASE_URL`, no telemetry), on with "
        "`CLAUDE_CODE_ENABLE_FUNCTION_HOOKS=1` in the session's environment",
        "every command kind; a notification prompt reaches the model under the plugin's name (\"The lich-control "
        "plugin sent a message: …\", the `<task-notification>` whole after it), since `$.prompt.submit` takes "
        "`asUser` from 2.1.286 on",
        ("2.1.280", "2.1.285"), {"2.1.280": "switched on"}),
    Row("2.1.260", "2.1.278", False,
        "the plugin loads and the mod is skipped (the rollout switch is off for plugins there)", REFUSED, ("2.1.278",)),
    Row("2.1.250", "2.1.250", False,
        "knows an older event set: `claude plugin validate` fails on `session.start`; a session loads the plugin "
        "and skips the mod", "refused, likewise", ("2.1.250",)),
    Row("2.1.200", "2.1.200", False, "ignores `modules` (hooks.json's empty `hooks` record is what it reads)",
        "refused, likewise", ("2.1.200",)),
)

TABLE_START = "<!-- The table is written from tests/live/releases.py by make release-table: edit it there. -->"
TABLE_END = "<!-- End of the table written by make release-table. -->"
DOC = os.path.join(CHECKOUT, "docs", "install.md")


def table() -> str:
    """TABLE in Markdown."""
    lines = ["| Claude Code | the mod | lich's control | measured on |", "|---|---|---|---|"]
    lines += [f"| {row.releases} | {row.mod} | {row.control} | {row.measured_on()} |" for row in TABLE]
    return "\n".join(lines) + "\n"


def with_table(doc: str) -> str:
    """The document with the table between its markers written anew."""
    head, start, rest = doc.partition(TABLE_START + "\n")
    _, end, tail = rest.partition(TABLE_END)
    if not start or not end:
        raise ValueError(f"the document has no {TABLE_START!r} line, then {TABLE_END!r}, for the table to go between")
    return head + start + table() + end + tail


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


def install(version: str) -> str:
    """The release's binary, installed by .ci/claude-code when it is not there yet."""
    done = subprocess.run([os.path.join(CHECKOUT, ".ci", "claude-code"), version], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not done.stdout.strip():
        raise Unavailable(f"no Claude Code {version} to run: {done.stderr.strip() or '.ci/claude-code found none'}")
    return done.stdout.strip().splitlines()[-1]


def release(version: str, pinned_binary: str) -> Release:
    """The release, installed when it is not there yet."""
    return Release(version, pinned_binary if version == PINNED else install(version))


if __name__ == "__main__":
    with open(DOC, encoding="utf-8") as f:
        before = f.read()
    after = with_table(before)
    if after != before:
        with open(DOC, "w", encoding="utf-8") as f:
            f.write(after)
    print(f"{os.path.relpath(DOC)}: the release table {'rewritten' if after != before else 'was up to date'}")
