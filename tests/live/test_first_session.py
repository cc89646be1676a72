"""The first session a person meets, on screen: its setup shown while it
builds, a failure shown with its cause and what tries again, and nothing
shown where nothing happens.

Installed as test_install.py installs it (a marketplace, no python option,
a `python3` with the standard library alone), read on a screen drawn from
the terminal. pip finds packages only in a folder of wheels (PIP_NO_INDEX),
empty at first: the first session's setup fails, the next session tries
again (and fails the same way), then the wheels are put there, the command
lich-mod-status printed builds the environment, and `/reload-plugins` in
the first session runs the setup again, starts the daemon and takes the
line away. The tests are the steps of one scenario, in
file order: run the module whole.
"""
import json
import os
import subprocess
import sys

import pytest

from claude_world import World
from devlich import python
from workspace import PLUGIN_NAME

MARKETPLACE = "lich-control"
FIRST, SECOND, THIRD = "first-1", "first-2", "first-3"
# Claude Code draws a plugin's status line after the plugin's name.
BUILDING = "lich-control: setting up Python for lich (first run)…"
FAILED = "lich-control: cannot set up Python for lich: pip: attrs>=22.2 is not on the package index, or none there fits this Python. Mend that, then /reload-plugins"
WAIT = 60.0


@pytest.fixture(scope="module")
def world(claude):
    with World(claude, settings={}) as world:
        world.marketplace = marketplace = world.ws.copy_checkout("marketplace")
        for args in (["plugin", "marketplace", "add", marketplace], ["plugin", "install", f"{PLUGIN_NAME}@{MARKETPLACE}"]):
            done = world.run(args)
            assert done.returncode == 0, done.stdout + done.stderr
        bare = world.ws.path("python3-without-lich-control")
        subprocess.run([python(), "-m", "venv", "--without-pip", bare], check=True, timeout=120)
        world.wheels = world.ws.path("wheels")
        os.makedirs(world.wheels)
        world.session_env = {
            # pip's settings of this machine left out: only the folder of wheels.
            "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": world.wheels,
            "PIP_CACHE_DIR": world.ws.path("pip-cache"), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PATH": os.pathsep.join([os.path.join(bare, "bin"), "/usr/bin", "/bin"]),
        }
        world.data = os.path.join(world.ws.home, ".claude", "plugins", "data", f"{PLUGIN_NAME}-{MARKETPLACE}")
        yield world


@pytest.fixture(scope="module")
def first(world):
    return world.session(FIRST, env=world.session_env)


def test_a_failed_setup_shows_on_screen_with_its_cause_and_what_tries_again(world, first):
    first.terminal.wait_for_text(BUILDING, WAIT)  # the line while it builds, as drawn
    screen = first.wait_for_screen(FAILED, WAIT)
    assert BUILDING not in " ".join(screen.split())
    assert first.status() is None


def test_lich_mod_status_names_the_failure_and_the_command_that_tries_again(world):
    # The plugin's own bin/lich-mod-status, run as a person runs it: on a
    # python3 that has no attrs, with no environment built.
    env = dict(world.env(None, world.session_env), CLAUDE_CONFIG_DIR=os.path.join(world.ws.home, ".claude"))
    done = subprocess.run([os.path.join(world.marketplace, "bin", "lich-mod-status")], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    [line] = done.stdout.splitlines()
    assert f"the last setup of lich-control's Python environment in {world.data} failed at" in line
    world.retry = line.split("To try again: ", 1)[1]


def test_the_next_session_tries_again_at_once(world):
    second = world.session(SECOND, env=world.session_env)
    second.wait_for_screen(FAILED, WAIT)
    assert "lich-control setup: creating a virtual environment" in second.debug_text()
    assert second.exit() == 0


def test_the_command_lich_mod_status_printed_works_as_printed(world):
    subprocess.run([python(), "-m", "pip", "download", "--quiet", "--dest", world.wheels, "attrs>=22.2", "requests>=2.28"],
                   check=True, timeout=300)
    done = subprocess.run(world.retry, shell=True, env=world.env(None, world.session_env), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["ok"] is True and result["built"] is True
    assert not os.path.exists(os.path.join(world.data, "setup-failed.json"))


def test_reload_plugins_runs_the_setup_again_and_the_daemon_takes_the_line_away(world, first):
    first.slash("/reload-plugins")
    first.wait_polling(timeout=WAIT)
    first.wait_for(first.screen, lambda text: "lich-control:" not in text, WAIT, "the relay's line off the screen",
                   lambda text: f"the screen: {text}")
    setups = [line for line in first.debug_text().splitlines() if "$.process.spawn (lich-control): python3 with" in line]
    assert len(setups) == 2, setups


def test_a_session_with_its_environment_ready_shows_nothing(world):
    third = world.session(THIRD, env=world.session_env)
    third.wait_polling(timeout=WAIT)
    assert "lich-control" not in third.terminal.text
    assert third.exit() == 0


def test_a_session_outside_lich_shows_nothing(world):
    outside = world.session(None, env=world.session_env, name="outside")
    outside.wait_debug(f"hooks module {PLUGIN_NAME}@{MARKETPLACE} session.start settled", timeout=WAIT)
    outside.wait_for_screen("shift+tab to cycle", WAIT)
    assert "lich-control" not in outside.terminal.text
    assert outside.exit() == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
