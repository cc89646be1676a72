"""Where Claude Code refuses the relay's requests to its daemon (2.1.280 to
2.1.287 while CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC is set: releases.py,
LICH_LIVE_REFUSING), lich never hands the session a command it cannot hear
back from, and the person sees why.

With the variable set from the start, no daemon runs: the session works,
lich refuses to control it with its "no mod has ever polled" message, and
the relay's line on screen names the cause and what mends it. Set later,
in the settings' env while a daemon polls (Claude Code applies it at
once), the next result the relay posts is refused: the daemon is ended,
acks the command it held with why, and is not started again; the same line
shows.

The tests are the steps of one scenario, in file order: run the module whole.
"""
import os

import pytest

from claude_world import World, check_answers_and_lich_is_refused
from devlich import python
from processes import pid_ended
from releases import TRAFFIC_OFF
from workspace import PLUGIN_NAME, python_option

FROM_THE_START, LATER = "refused-1", "refused-2"
# After the plugin's name, which Claude Code draws before it.
LINE = "no lich control while CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC is set: unset it or update Claude Code to 2.1.288+, then restart claude"
NONESSENTIAL = "nonessential network traffic is disabled for this session"
WAIT = 30.0


@pytest.fixture(scope="module")
def world(refusing_release):
    assert refusing_release.refuses_fetch, f"{refusing_release} does not refuse the relay's requests"
    with World(refusing_release.binary, claude_env=refusing_release.env) as world:
        world.release = refusing_release
        world.plugin = world.ws.copy_checkout()
        yield world


def plugin_trouble(world, session):
    """The plugin's errors and warnings in the debug log."""
    return [line for line in session.debug_text().splitlines()
            if PLUGIN_NAME in line and ("[ERROR]" in line or "[WARN]" in line)]


def test_set_from_the_start_no_daemon_runs_the_session_works_and_lich_is_refused(world):
    session = world.session(FROM_THE_START, plugin_dir=world.plugin, env=TRAFFIC_OFF)
    session.wait_for_screen(f"{PLUGIN_NAME}: {LINE}", WAIT)
    check_answers_and_lich_is_refused(world, session, "[refused]", WAIT)
    # Nothing was started: no setup, no daemon (which would have left its log).
    assert "$.process.spawn (lich-control)" not in session.debug_text()
    assert not os.path.exists(os.path.join(world.ws.run_dir, f"{FROM_THE_START}.log"))

    [said] = [line for line in session.debug_text().splitlines() if "lich-control runs no daemon" in line]
    assert f"Claude Code refuses the plugin's requests to it ({NONESSENTIAL}); unset CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC" in said
    assert plugin_trouble(world, session) == []
    assert session.exit() == 0


def test_set_later_the_daemon_is_ended_acks_what_it_held_and_is_not_started_again(world):
    session = world.session(LATER, plugin_dir=world.plugin)
    daemon = session.wait_polling(WAIT)["daemon"]["pid"]
    # As a person sets it mid-session: Claude Code reads the change, puts it
    # in its own environment, and only then clears its proxy agents (a line
    # of its debug log, in the same step).
    seen = len(session.debug_text().splitlines())
    world.ws.write_settings({**python_option(python()), "env": TRAFFIC_OFF})

    def applied(lines):
        changed = next((i for i, line in enumerate(lines) if "Settings changed from userSettings" in line), None)
        return changed is not None and any("Cleared proxy agent cache" in line for line in lines[changed:])

    session.wait_for(lambda: session.debug_text().splitlines()[seen:], applied, WAIT, "the settings' env applied")

    outcome = world.lich.control(LATER, "prompt", "still there? [refused-later]", timeout=WAIT)
    assert outcome["ack"] == {"session_id": LATER, "id": outcome["id"], "kind": "prompt", "ok": False,
                              "error": "the daemon stopped before the session answered (got SIGTERM)"}, outcome
    # Shown once the relay is done with the daemon, for good.
    session.wait_for_screen(f"{PLUGIN_NAME}: {LINE}", WAIT)
    assert pid_ended(daemon, WAIT), "the daemon outlived the refusal"
    outcome = world.lich.control(LATER, "prompt", "anyone there?", timeout=5)
    assert outcome["ok"] is False and not outcome.get("delivered"), outcome
    assert "its mod hung up its last poll and has not polled since" in outcome["error"], outcome
    assert plugin_trouble(world, session) == []
    assert session.exit() == 0
    # The one daemon, never started again.
    spawned = [line for line in session.debug_text().splitlines() if "$.process.spawn (lich-control)" in line and " with " in line]
    assert len(spawned) == 1, spawned
