"""lich's macOS confinement, in its Linux stand-in (tests/landlock.py), by
each install route docs/install.md gives.

lich confines a session on macOS with a sandbox-exec profile: no write
anywhere but the checkout, ~/.claude, ~/.cache and a few build caches; no
read below $HOME but those and ~/.config, ~/.local/{bin,share,state}, ...;
and no exception for /dev/null or any temporary folder. Here the same
rules are put on each program with Landlock, in a throwaway home shaped as
a Mac's is for this: no $XDG_RUNTIME_DIR, and a $TMPDIR that exists and
cannot be written (the per-user /var/folders/.../T of a Mac, which the
profile denies). The session's folder (the checkout) is work/.

For each route, the plugin's files where it puts them:
- the git URL: under ~/.claude/plugins/cache, Claude Code's copy;
- `make plugin-install`: under ~/.local/share/lich-control/plugin, which
  the profile reads and does not write;
- the `python` option: a virtual environment under ~/.local/share the
  person made unconfined, the package installed into it with pip
  (docs/install.md's example), with the git URL's copy.

Confined, each must do what a session would: the runtime's first build,
then a second setup that finds it ready (the routes that build); the relay
with the real daemon (tests/plugin/relay.e2e.mjs, run from the installed
copy with no run folder named and, for the routes that build, no `python`
option: the relay runs the setup as in a session); and lich-mod-status,
run inside and outside the confinement, finding a confined daemon of a
36-character session id (a window's UUID) by the same rule.

It needs Landlock (Linux 5.13 or later), Node.js and this machine's way to a
package index; without them it fails, never skips.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from devlich import python
from processes import wait_until
from test_confined import pip_settings
from workspace import Workspace

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LANDLOCK = os.path.join(CHECKOUT, "tests", "landlock.py")
sys.path.insert(0, os.path.join(CHECKOUT, "tests"))
import landlock  # noqa: E402
from lich_dev.lich import StubLich  # noqa: E402

ROUTES = ["git-url", "plugin-install", "python-option"]
DATA = os.path.join(".claude", "plugins", "data", "lich-control-lich-control")
BUILD_WAIT = 300.0
TOKEN = "landlock-token-7c1e"


def plugin_version():
    with open(os.path.join(CHECKOUT, ".claude-plugin", "plugin.json")) as f:
        return json.load(f)["version"]


class Mac:
    """A throwaway home and work folder, the plugin installed by one route, and the confinement."""

    def __init__(self, route):
        self.route = route
        self.ws = Workspace(prefix="lich-ll-")
        self.home = self.ws.home
        for name in (".claude", ".cache", ".config", ".local/share", ".local/state", ".npm"):
            os.makedirs(os.path.join(self.home, name), exist_ok=True)
        self.data = os.path.join(self.home, DATA)
        if route == "plugin-install":
            self.plugin = os.path.join(self.home, ".local", "share", "lich-control", "plugin")
        else:
            self.plugin = os.path.join(self.home, ".claude", "plugins", "cache", "lich-control", "lich-control",
                                       plugin_version())
        os.makedirs(os.path.dirname(self.plugin))
        shutil.move(self.ws.copy_checkout("copy"), self.plugin)
        self.option = None
        if route == "python-option":
            venv = os.path.join(self.home, ".local", "share", "lich-control", "venv")
            self.unconfined([sys.executable, "-m", "venv", "--without-pip", venv], cwd=self.plugin)
            self.option = os.path.join(venv, "bin", "python")
            # pip install . into it, by this interpreter's pip (the venv's own would cost half a minute more).
            self.unconfined([sys.executable, "-m", "pip", "--python", self.option, "install", "--quiet", "."],
                            cwd=self.plugin)

    def env(self, **changes):
        """A session's environment on this Mac: its home, no XDG_RUNTIME_DIR,
        a TMPDIR the profile does not let it write, pip's settings of this machine."""
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(("LICH_", "XDG_", "CLAUDE_", "PIP_"))}
        env.update(pip_settings(), HOME=self.home, TMPDIR=self.ws.tmp)
        env.update(changes)
        return env

    def confined(self, argv):
        return [sys.executable, LANDLOCK, "--home", self.home, "--checkout", self.ws.work, "--", *argv]

    def unconfined(self, argv, cwd, timeout=BUILD_WAIT):
        done = subprocess.run(argv, cwd=cwd, env=self.env(), capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr[-2000:]}"

    def run(self, argv, cwd, env=None, confined=True, timeout=120):
        return subprocess.run(self.confined(argv) if confined else argv, cwd=cwd, env=env or self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def setup(self):
        """The relay's setup, as a session runs it: python3 hooks/lich_runtime.py in the plugin's folder."""
        done = self.run(["python3", os.path.join(self.plugin, "hooks", "lich_runtime.py"), "--data", self.data],
                        cwd=self.plugin, env=self.env(CLAUDE_PLUGIN_DATA=self.data), timeout=BUILD_WAIT)
        lines = done.stdout.strip().splitlines()
        assert lines, f"the setup said nothing (exit {done.returncode}): {done.stderr[-2000:]}"
        return json.loads(lines[-1]), done

    def daemon_python(self):
        if self.option:
            return self.option
        with open(os.path.join(self.data, "current.json")) as f:
            return json.load(f)["python"]


@pytest.fixture(scope="module")
def stand_in():
    try:
        version = landlock.abi()
    except landlock.Unavailable as exc:
        pytest.fail(f"no Landlock to stand in for lich's macOS profile: {exc}", pytrace=False)
    if shutil.which("node") is None:
        pytest.fail("no node on PATH to run the relay with", pytrace=False)
    return version


@pytest.fixture(scope="module", params=ROUTES)
def mac(request, stand_in):
    mac = Mac(request.param)
    try:
        yield mac
    finally:
        mac.ws.remove()


def test_the_stand_in_denies_what_the_profile_denies(mac):
    secret = mac.ws.write_file("home/secret", "key")
    script = (f"cat {secret}; echo x > /dev/null; echo x > {mac.ws.tmp}/t; echo x > {mac.home}/.config/t; "
              f"echo x > {mac.home}/.cache/t && echo cache; echo x > {mac.ws.work}/t && echo work")
    done = mac.run(["/bin/sh", "-c", script], cwd=mac.ws.work)
    assert done.stdout.split() == ["cache", "work"], done.stdout + done.stderr
    for denied in (secret, "/dev/null", f"{mac.ws.tmp}/t", f"{mac.home}/.config/t"):
        assert f"{denied}: Permission denied" in done.stderr, done.stderr


def test_the_first_build_and_the_next_setup(mac):
    if mac.option:  # built by the person, unconfined: the relay runs it as it is
        done = mac.run([mac.option, "-m", "lich_control", "--version"], cwd=mac.plugin)
        assert done.returncode == 0, done.stderr
        return
    result, done = mac.setup()
    assert result.get("ok") and result.get("built"), (result, done.stderr[-3000:])
    again, done = mac.setup()
    assert again.get("ok") and again.get("built") is False, (again, done.stderr[-3000:])


def test_the_relay_with_the_real_daemon(mac):
    env = mac.env(LICH_E2E_RUN_DIR="default", PYTHON=mac.option or python())
    if not mac.option:
        env["LICH_E2E_PLUGIN_DATA"] = mac.data
    done = mac.run(["node", "--test", os.path.join(mac.plugin, "tests", "plugin", "relay.e2e.mjs")],
                   cwd=mac.ws.work, env=env, timeout=BUILD_WAIT)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert os.path.isdir(os.path.join(mac.home, ".cache", "lich-control", "run")), "the run folder is not the default one"


def test_lich_mod_status_finds_the_confined_daemon_inside_and_outside(mac):
    session = str(uuid.uuid4())
    interpreter = mac.daemon_python()
    status_tool = [interpreter, os.path.join(mac.plugin, "bin", "lich-mod-status"), "--json"]
    with StubLich(token=TOKEN) as lich:
        env = mac.env(LICH_PORT=str(lich.port), LICH_TOKEN=TOKEN, LICH_SESSION_ID=session,
                      CLAUDE_PLUGIN_DATA=mac.data, LICH_CONTROL_PYTHON=interpreter)
        daemon = subprocess.Popen(mac.confined([interpreter, "-m", "lich_control"]), cwd=mac.plugin, env=env,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            if not lich.wait_polled(session, timeout=60):
                daemon.kill()
                pytest.fail(f"the confined daemon never polled: {daemon.communicate(timeout=10)[1].decode()[-2000:]}")
            tool_env = {k: v for k, v in env.items() if k not in ("LICH_PORT", "LICH_TOKEN", "LICH_SESSION_ID")}
            outside = dict(tool_env, TMPDIR=mac.ws.path("lich"))  # outside, the Mac's TMPDIR is writable
            for where, confined, with_env in (("inside", True, tool_env), ("outside", False, outside)):
                done = mac.run(status_tool, cwd=mac.ws.work, env=with_env, confined=confined)
                assert done.returncode == 0, f"{where}: {done.stdout}{done.stderr}"
                found = json.loads(done.stdout)
                assert [d["session_id"] for d in found["daemons"] if d["status"]] == [session], f"{where}: {found}"
        finally:
            daemon.terminate()
            wait_until(lambda: daemon.poll() is not None, 10, "the daemon's end")
