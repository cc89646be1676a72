"""Installed as a Claude Code user installs it, and set up by its first session.

A copy of the checkout is the marketplace: `claude plugin marketplace add`
and `claude plugin install lich-control@lich-control` put the plugin into
the throwaway home (offline: the marketplace is a folder). No python option
is set, and the sessions run with a `python3` that cannot import
lich_control (checked first), so nothing but the plugin's own setup can give
the daemon its Python. The first session inside lich builds the private
environment in the plugin's data folder and its daemon runs from it; lich
drives the session, and `lich-mod-status` on the session's PATH works. The
second session reuses the environment without building it. Last,
`claude plugin update` picks up a new release of the marketplace's folder.
It runs on each release releases.py lists for it: one before 2.1.326,
where the relay names the plugin's data folder itself, and the pinned one.
"""
import json
import os
import subprocess
import sys

import pytest

from devlich import python
from claude_world import World
from processes import argv_of
from workspace import PLUGIN_NAME

MARKETPLACE = "lich-control"
PLUGIN_ID = f"{PLUGIN_NAME}@{MARKETPLACE}"
FIRST, SECOND = "install-1", "install-2"
# The first session builds the environment: python3 -m venv and a pip install.
BUILD_WAIT = 240.0
WAIT = 30.0


@pytest.fixture(scope="module")
def world(install_release):
    # settings={}: no python option, as a fresh install starts.
    with World(install_release.binary, settings={}, claude_env=install_release.env) as world:
        world.marketplace = world.ws.copy_checkout("marketplace")
        world.bare = bare_python(world.ws.path("python3-without-lich-control"))
        yield world


def bare_python(folder):
    """A python3 that has the standard library alone (a virtual environment
    without pip): what the machine's python3 is for these sessions."""
    subprocess.run([python(), "-m", "venv", "--without-pip", folder], check=True, timeout=120)
    return os.path.join(folder, "bin")


def session_path(world):
    """The sessions' PATH: the bare python3 first, and no folder holding a
    lich-control tool (a developer's virtual environment), so that what the
    session runs can come only from the plugin."""
    kept = [folder for folder in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
            if folder and not os.path.exists(os.path.join(folder, "lich-mod-status"))]
    return os.pathsep.join([world.bare, *kept])


def session_env(world):
    # pip's own settings of this machine (an index, a proxy), as a person's
    # shell would hand them to the Claude Code they start.
    env = {name: value for name, value in os.environ.items() if name.startswith("PIP_")}
    env["PATH"] = session_path(world)
    return env


def data_folder(world):
    return os.path.join(world.ws.home, ".claude", "plugins", "data", f"{PLUGIN_NAME}-{MARKETPLACE}")


def environments(world):
    folder = data_folder(world)
    return sorted(name for name in os.listdir(folder) if name.startswith("env-")) if os.path.isdir(folder) else []


def test_two_claude_plugin_commands_install_it(world):
    added = world.run(["plugin", "marketplace", "add", world.marketplace])
    assert added.returncode == 0, added.stdout + added.stderr
    assert f"Successfully added marketplace: {MARKETPLACE}" in added.stdout
    installed = world.run(["plugin", "install", PLUGIN_ID])
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert f"Successfully installed plugin: {PLUGIN_ID}" in installed.stdout
    # Nothing left for the person to set before the plugin works: Claude
    # Code names every declared option still unset, the optional python
    # one included, and says how many of them are required.
    said = installed.stdout + installed.stderr
    assert "1 userConfig option not yet set" in said and "required)" not in said, said


def test_the_sessions_python3_cannot_import_lich_control(world):
    env = dict(os.environ, PATH=session_path(world))
    for folder, module in [(world.ws.work, "lich_control"), (world.marketplace, "lich_control.daemon")]:
        done = subprocess.run(["python3", "-c", f"import {module}"], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr, (folder, done.stderr)
    done = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip().startswith(world.bare), done.stdout


def test_the_first_session_builds_the_environment_and_the_daemon_runs_from_it(world):
    assert environments(world) == []
    session = world.session(FIRST, env=session_env(world))
    status = session.wait_polling(timeout=BUILD_WAIT)
    loaded = session.wait_debug(f"hooks module {PLUGIN_ID}")
    assert "loaded" in loaded, loaded

    [env] = environments(world)
    env_python = os.path.join(data_folder(world), env, "bin", "python")
    assert argv_of(status["daemon"]["pid"])[0] == env_python
    session.wait_debug(f"lich-control setup: creating a virtual environment in {os.path.dirname(os.path.dirname(env_python))}")
    session.wait_debug(f"lich-control setup: the environment is ready: {env_python}")

    # lich drives the session.
    outcome = world.lich.control(FIRST, "prompt", "after the install [install-1]", timeout=WAIT)
    assert outcome.get("ok") is True, outcome
    world.api.wait_for(lambda r: r.is_message and "[install-1]" in r.last_user_text, WAIT, "the prompt's request")
    session.wait_idle(WAIT)

    # lich-mod-status, on the session's PATH through the plugin's bin/, as a
    # command the session runs (bash mode): it finds the daemon's interpreter.
    # What it prints (in the work folder, the session's) is moved into place
    # once the command has ended, so the file's being there says it ran,
    # whatever it printed; its errors are on the screen, which a failure shows.
    session.shell("{ lich-mod-status --json; command -v lich-mod-status; } > status.part; mv status.part status.txt")
    answer = os.path.join(world.ws.work, "status.txt")
    text = session.wait_for(lambda: read_text(answer), lambda text: text is not None, WAIT, "the command run from the session to end")
    lines = text.splitlines()
    assert lines[-1:] == [os.path.join(world.marketplace, "bin", "lich-mod-status")], \
        f"the command printed {text!r}\n{session.diagnosis()}"
    assert [d["session_id"] for d in json.loads("\n".join(lines[:-1]))["daemons"]] == [FIRST]

    session.slash("/exit")
    assert session.wait_exit(WAIT) == 0


def read_text(path):
    """The file's text, None while there is no such file."""
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return None


def test_the_second_session_reuses_the_environment_without_building(world):
    [env] = environments(world)
    stamp = os.path.join(data_folder(world), env, "lich-control-env.json")
    built = os.stat(stamp).st_mtime_ns
    session = world.session(SECOND, env=session_env(world))
    status = session.wait_polling(timeout=WAIT * 2)
    assert argv_of(status["daemon"]["pid"])[0] == os.path.join(data_folder(world), env, "bin", "python")
    assert "lich-control setup: creating" not in session.debug_text()
    assert environments(world) == [env]
    assert os.stat(stamp).st_mtime_ns == built
    session.slash("/exit")
    assert session.wait_exit(WAIT) == 0


def test_claude_plugin_update_picks_up_a_new_release(world):
    manifest = os.path.join(world.marketplace, ".claude-plugin", "plugin.json")
    with open(manifest) as f:
        doc = json.load(f)
    major, minor, patch = (int(part) for part in doc["version"].split("."))
    doc["version"] = f"{major}.{minor}.{patch + 1}"
    with open(manifest, "w") as f:
        json.dump(doc, f, indent=2)
    updated = world.run(["plugin", "update", PLUGIN_ID])
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert f"to {doc['version']}" in updated.stdout, updated.stdout
    with open(os.path.join(world.ws.home, ".claude", "plugins", "installed_plugins.json")) as f:
        [record] = json.load(f)["plugins"][PLUGIN_ID]
    assert record["version"] == doc["version"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))
