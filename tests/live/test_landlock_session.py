"""A live Claude Code session in the stand-in for lich's macOS profile
(tests/landlock.py), with the plugin installed by `make plugin-install`'s
route (a marketplace added from ~/.local/share/lich-control/plugin).

The home is shaped as a Mac's is for this (test_landlock.py): no
$XDG_RUNTIME_DIR, a $TMPDIR the profile does not let a session write, no
LICH_CONTROL_RUN_DIR, so the daemon takes its default run folder
(~/.cache/lich-control/run), where the status is read from outside.

Claude Code itself does not run in lich's strict profile: it makes its
folder in $TMPDIR as it starts (EACCES, and it exits). `allowances` are the
fewest extra paths it needs, as measured on 2.1.332 (docs/install.md, "In
lich's macOS confined sessions"): $TMPDIR writable; /dev/null is not
needed. The plugin needs none. One more, to look in
from outside: the folder of the debug logs is writable.

The first session builds the runtime and polls; prompt, model, effort,
command (/compact), abort and ask ack; /exit ends it and its daemon.

To measure again: LICH_LIVE_LANDLOCK_ALLOW names the allowances
(`devnull`, `tmpdir`, comma-separated; empty for lich's profile as it is),
and LICH_LIVE_LANDLOCK_TMPDIR sets the session's TMPDIR to a folder below
the home (`.claude/tmp`: one the profile already lets it write).
"""
import os
import sys

import pytest

from claude_world import ClaudeSession, World
from processes import argv_of, pid_ended
from test_install import MARKETPLACE, data_folder
from test_session import (assert_acked_ok, assert_answered, check_abort, check_effort_override, check_model_override,
                          main_request, send)
from workspace import PLUGIN_NAME

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LANDLOCK = os.path.join(CHECKOUT, "tests", "landlock.py")
PLUGIN_ID = f"{PLUGIN_NAME}@{MARKETPLACE}"
SESSION = "0f8e3c2a-9b1d-4c5e-8f7a-6b2d1e0c9a84"  # as lich's window names one
BUILD_WAIT = 300.0
WAIT = 30.0


def allowances(ws):
    """What Claude Code needs beyond lich's profile, as measured on 2.1.332."""
    names = os.environ.get("LICH_LIVE_LANDLOCK_ALLOW")
    chosen = {"devnull": "/dev/null", "tmpdir": ws.tmp}
    return [chosen[n] for n in names.split(",") if n] if names is not None else [ws.tmp]


class MacSession(ClaudeSession):
    """A session in the stand-in: one that ended says so at once."""

    def status(self):
        if self.terminal.poll() is not None:
            raise AssertionError(f"the confined session ended (exit {self.terminal.poll()})\n{self.diagnosis()}")
        return super().status()


class MacWorld(World):
    """The live world, every session in the stand-in for lich's macOS profile."""

    def __init__(self, claude):
        super().__init__(claude, settings={})
        self.ws.run_dir = os.path.join(self.ws.home, ".cache", "lich-control", "run")

    def prepare(self):
        super().prepare()
        for name in (".cache", ".config", ".local/state"):
            os.makedirs(os.path.join(self.ws.home, name), exist_ok=True)

    def env(self, session_id, changes=None):
        tmp = os.environ.get("LICH_LIVE_LANDLOCK_TMPDIR")
        tmp = {"TMPDIR": os.path.join(self.ws.home, tmp)} if tmp else {}
        return super().env(session_id, {"LICH_CONTROL_RUN_DIR": None, "XDG_RUNTIME_DIR": None, **tmp, **(changes or {})})

    def session(self, session_id, **kwargs):
        return self.adopt(MacSession(self, session_id, **kwargs))

    def session_argv(self, argv):
        extra = [arg for path in allowances(self.ws) + [self.ws.logs] for arg in ("--write", path)]
        return [sys.executable, LANDLOCK, "--home", self.ws.home, "--checkout", self.ws.work,
                "--read", os.path.dirname(os.path.realpath(self.claude)), *extra, "--", *argv]


@pytest.fixture(scope="module")
def world(claude):
    with MacWorld(claude) as world:
        folder = os.path.join(world.ws.home, ".local", "share", "lich-control", "plugin")
        os.makedirs(os.path.dirname(folder))
        os.rename(world.ws.copy_checkout("copy"), folder)
        for args in (["plugin", "marketplace", "add", folder], ["plugin", "install", PLUGIN_ID]):
            done = world.run(args)
            assert done.returncode == 0, done.stdout + done.stderr
        world.plugin = folder
        yield world


def test_a_confined_session_builds_the_runtime_and_polls(world):
    session = world.session(SESSION)
    status = session.wait_polling(timeout=BUILD_WAIT)
    session.wait_debug("lich-control setup: the environment is ready")
    assert argv_of(status["daemon"]["pid"])[0].startswith(data_folder(world) + os.sep)
    world.first = session


def test_every_command_kind_acks(world):
    session = world.first
    assert_acked_ok(send(world, session, "prompt", "confined prompt [mac-p]", timeout=WAIT))
    main_request(world, "[mac-p]")
    session.wait_idle()
    check_model_override(world, session, "[mac-m]")
    check_effort_override(world, session, "[mac-e]")
    assert_acked_ok(send(world, session, "command", "compact", timeout=WAIT))
    check_abort(world, session, "[mac-a]", WAIT)
    question = "what are you doing? [mac-q]"
    assert_answered(world.lich.ask(SESSION, question, timeout=60), question)
    session.wait_idle()


def test_exit_ends_the_session_and_its_daemon(world):
    session = world.first
    daemon = session.wait_polling()["daemon"]["pid"]
    session.slash("/exit")
    assert session.wait_exit() == 0
    assert pid_ended(daemon, WAIT), "the daemon outlived its session"
