"""lich's confined session: Claude Code inside lich's bubblewrap profile
(sandbox.py), as an unprivileged user, installed the way README.md gives
first.

The person, as that user in their own terminal (unconfined), adds the
repository's git URL as a marketplace and installs the plugin. The URL is
an https one, which the user's ~/.gitconfig (`url.<base>.insteadOf`) sends
to a bare repository made from a copy of this checkout: no network, and
Claude Code clones it as it clones any git marketplace, into ~/.claude. Then
lich starts the sessions confined: the first builds the plugin's runtime in
its data folder and its daemon polls; prompt, model, abort and ask ack;
/exit ends it; the second reuses the runtime. The token is in no file.

Then the two routes that cannot work confined, shown failing as the docs
say: a `python` option naming an interpreter in ~/.venvs (the sandbox has
no ~/.venvs; one under ~/.local/share, as docs/install.md gives, works), and a
marketplace added from a clone in ~/src (the sandbox has no ~/src:
"Marketplace file not found"). Before them, `make plugin-install`, the
route for a clone: it installs from ~/.local/share, which the sandbox
mounts, and a confined session polls.

What the test needs from the machine, and how it gets it:
- bubblewrap (LICH_LIVE_BWRAP, .ci/bwrap installs it) and a user that is not
  root (LICH_LIVE_USER, .ci/test-user makes it); without them it fails.
- The user reaches what it runs: the workspace is handed to it (its home,
  work, run and log folders are its own; the development lich's folder,
  which holds the token, stays root's), and Claude Code's binary, which sits
  in root's cache, is hard-linked (else copied) into a folder of the
  workspace that lich's profile mounts as it mounts any binary's folder.
- The development lich runs as the user too, as lich runs as the person
  whose sessions it starts (the daemon sends the token only to a listener
  of its own user), from a copy of the checkout and a virtual environment
  of the system's python3 with attrs and requests.
- The session's Python is the system's python3 (/usr/bin): the sandbox has
  no other. pip's settings of this machine are handed to it as PIP_*
  variables, as the user's own settings would be.
- Two additions to lich's profile, to look in from outside: the daemons'
  run folder (LICH_CONTROL_RUN_DIR) and the folder of the debug logs are
  bound read-write; the status is read as the user with the installed
  plugin's bin/lich-mod-status, and a daemon's pid (the sandbox's own pid
  namespace) is turned into the host's through /proc's NSpid.

The tests are the steps of one scenario, in file order: run the module whole.
"""
import json
import os
import shutil
import subprocess

import pytest

from claude_world import ClaudeSession, World
from devlich import Lich, python
from processes import argv_of, pid_ended
from sandbox import BWRAP_ENV, USER_ENV, User, binary_dirs, profile
from test_install import MARKETPLACE, data_folder, environments
from test_session import assert_acked_ok, assert_answered, check_abort, check_model_override, main_request, send
from workspace import PLUGIN_NAME, python_option
from world import lich_env

PLUGIN_ID = f"{PLUGIN_NAME}@{MARKETPLACE}"
GIT_URL = "https://git.example.invalid/lich-control.git"
FIRST, SECOND, LOCAL = "confined-1", "confined-2", "confined-local"
VENVS, SHARE, FROM_SRC = "confined-venvs", "confined-share", "confined-src"
# The first session builds the runtime (python3 -m venv and a pip install)
# on a machine whose two cores are shared: well above the minute it takes.
BUILD_WAIT = 300.0
WAIT = 30.0
# The relay's five restarts of a daemon that will not start (1 + 2 + ... + 16 s), and more.
GIVE_UP_WAIT = 90.0
# The relay's five restarts of a daemon that will not start (1 + 2 + ... + 16 s), and more.
GIVE_UP_WAIT = 90.0
# The path docs/install.md's `python` option example names.
VENVS_PYTHON = "~/.venvs/lich-control/bin/python"


def needed(variable):
    value = os.environ.get(variable)
    if not value:
        pytest.fail(f"{variable} is not set: run the live test through .ci/plugin-checks", pytrace=False)
    return value


def pip_settings():
    """This machine's pip settings (files and PIP_* variables) as PIP_*
    variables, for a user whose own pip has none."""
    done = subprocess.run([python(), "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60)
    env = {name: value for name, value in os.environ.items() if name.startswith("PIP_")}
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.partition(".")
        if section in ("global", "install") and name:
            env.setdefault("PIP_" + name.upper().replace("-", "_"), value.strip().strip("'\""))
    return env


class ConfinedSession(ClaudeSession):
    """A Claude Code session lich started confined, looked at from outside."""

    POLL_WAIT = 60.0
    IDLE_WAIT = 40.0
    EXIT_WAIT = 30.0

    def __init__(self, world, session_id, **kwargs):
        self.world = world
        super().__init__(world, session_id, **kwargs)

    def status(self):
        if self.terminal.poll() is not None:
            raise AssertionError(f"the confined session ended (exit {self.terminal.poll()})\n{self.diagnosis()}")
        for entry in (self.world.mod_status() or {}).get("daemons", []):
            if entry.get("session_id") == self.session_id:
                return entry.get("status")
        return None

    def daemon_pid(self, status):
        """The host's pid of the daemon the status names (a pid of the sandbox's namespace)."""
        return self.wait_for(lambda: host_pid(self.world, status["daemon"]["pid"]), bool, WAIT,
                             f"the daemon {status['daemon']['pid']} of the sandbox among the processes")


def host_pid(world, inner):
    for proc in world.watch.alive():
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                line = next(line for line in f if line.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        pids = [int(pid) for pid in line.split()[1:]]
        if len(pids) > 1 and pids[-1] == inner:
            return proc.pid
    return None


class ConfinedWorld(World):
    """The live world, with every session of the test user confined."""

    def __init__(self, claude, bwrap, user):
        self.bwrap = bwrap
        self.user = user
        self.pip = pip_settings()
        super().__init__(claude, settings={})
        self.claude = self.reachable_claude(claude)

    def start_lich(self):
        """The development lich as the user, as lich runs as the person whose
        sessions it starts: the daemon sends the token only to a listener of
        its own user. Its Python, which must be the user's: a virtual
        environment of the system's python3 with the packages lich-stub needs."""
        os.chmod(self.ws.root, 0o755)
        for name in ("lich", "logs", "tmp"):
            self.hand_over(self.ws.path(name))
        folder = self.ws.path("tmp", "lich-python")
        for argv in (["/usr/bin/python3", "-m", "venv", folder],
                     [os.path.join(folder, "bin", "python"), "-m", "pip", "install", "--quiet", "attrs", "requests"]):
            done = self.as_user(argv, cwd=self.ws.tmp, env={"HOME": self.ws.tmp}, timeout=300)
            assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr[-1500:]}"
        # From a copy of the checkout: the checkout may be where the user cannot read (/root).
        source = self.ws.copy_checkout("lich-source")
        self.hand_over(source)
        return Lich(self.ws, self.watch, command=[*self.user.become(), os.path.join(folder, "bin", "python"),
                                                 os.path.join(source, "tests", "lich-stub")])

    def prepare(self):
        super().prepare()
        for name in (".cache", ".config", ".local/share", ".local/state", "src", "xdg-runtime"):
            os.makedirs(self.ws.path("home", name), exist_ok=True)
        os.chmod(self.ws.root, 0o755)
        for name in ("home", "work", "run", "tmp", "logs"):
            self.hand_over(self.ws.path(name))

    def hand_over(self, folder):
        """Make a folder of the workspace the test user's, whole."""
        for dirpath, dirnames, filenames in os.walk(folder):
            for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                os.lchown(name, self.user.uid, self.user.gid)

    def reachable_claude(self, claude):
        """Claude Code's binary in a folder of the workspace the user can read."""
        folder = self.ws.path("claude-code")
        os.makedirs(folder, mode=0o755)
        target = os.path.join(folder, "claude")
        try:
            os.link(os.path.realpath(claude), target)
        except OSError:
            shutil.copy2(claude, target)
        return target

    def env(self, session_id, changes=None):
        return super().env(session_id, {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "TMPDIR": None,  # the sandbox's /tmp is its own
            "XDG_RUNTIME_DIR": self.ws.path("home", "xdg-runtime"),
            **self.pip,
            **(changes or {}),
        })

    def session_argv(self, argv):
        home, work = self.ws.home, self.ws.work
        bwrap = profile(home, work, self.env(None)["XDG_RUNTIME_DIR"], read=binary_dirs(self.claude),
                        write=[self.ws.run_dir, self.ws.logs])
        return [*self.user.become(), self.bwrap, *bwrap, "--", *argv]

    def command_argv(self, argv):
        return [*self.user.become(), *argv]

    def session(self, session_id, **kwargs):
        return self.adopt(ConfinedSession(self, session_id, **kwargs))

    def installed_path(self):
        try:
            with open(os.path.join(self.ws.home, ".claude", "plugins", "installed_plugins.json")) as f:
                [record] = json.load(f)["plugins"][PLUGIN_ID]
        except (OSError, ValueError, KeyError):
            return None
        return record["installPath"]

    def mod_status(self):
        """`lich-mod-status --json` as the user, from the installed plugin's
        bin/; None before there is an environment to run it in."""
        installed = self.installed_path()
        if installed is None:
            return None
        env = {**self.env(None), "LICH_CONTROL_RUN_DIR": self.ws.run_dir}
        done = subprocess.run([*self.user.become(), os.path.join(installed, "bin", "lich-mod-status"), "--json"],
                              env=env, cwd=self.ws.work, capture_output=True, text=True, timeout=60)
        try:
            return json.loads(done.stdout)
        except ValueError:
            return None

    def as_user(self, argv, cwd, env=None, timeout=120):
        """`argv` run as the user, unconfined, with a session's environment outside lich."""
        base = lich_env(self.ws, None, None, {"PATH": "/usr/local/bin:/usr/bin:/bin", **self.pip}, {"TMPDIR": None})
        return subprocess.run([*self.user.become(), *argv], cwd=cwd, env={**base, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)


def bare_repository(world):
    """A git repository of a copy of this checkout, owned by the user (git
    refuses to read one of another user), as the git URL's remote."""
    source = world.ws.copy_checkout("plugin-source")
    bare = world.ws.path("git", "lich-control.git")
    git = ["git", "-c", "user.name=live test", "-c", "user.email=live@test.invalid", "-c", "init.defaultBranch=main"]
    for argv in ([*git, "init", "-q"], [*git, "add", "-A"], [*git, "commit", "-q", "-m", "the plugin under test"]):
        subprocess.run(argv, cwd=source, check=True, timeout=120)
    subprocess.run([*git, "clone", "-q", "--bare", source, bare], check=True, timeout=120)
    world.hand_over(world.ws.path("git"))
    os.chmod(world.ws.path("git"), 0o755)
    return bare


@pytest.fixture(scope="module")
def world(claude):
    user = User.named(needed(USER_ENV))
    assert user.uid != 0, f"{user.name} is root: the confined session must run as a user that is not"
    with ConfinedWorld(claude, needed(BWRAP_ENV), user) as world:
        bare = bare_repository(world)
        world.ws.write_file("home/.gitconfig", f'[url "file://{bare}"]\n\tinsteadOf = {GIT_URL}\n')
        world.hand_over(world.ws.home)
        yield world


def exit_session(world, session):
    status = session.wait_polling()
    daemon = session.daemon_pid(status)
    session.slash("/exit")
    assert session.wait_exit() == 0
    assert pid_ended(daemon, WAIT), "the daemon outlived its session"
    world.watch.wait_ended("something of the session still runs", WAIT, but={world.lich.pid})


# --- installed by the README's first route -----------------------------------

def test_the_git_url_installs_it_as_the_user(world):
    added = world.run(["plugin", "marketplace", "add", GIT_URL])
    assert added.returncode == 0, added.stdout + added.stderr
    assert f"Successfully added marketplace: {MARKETPLACE}" in added.stdout
    installed = world.run(["plugin", "install", PLUGIN_ID])
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert world.installed_path().startswith(os.path.join(world.ws.home, ".claude", "plugins") + os.sep)


def test_the_session_is_confined(world):
    # The sandbox is on: its host name, no /root, and the home empty but for
    # what the profile mounts back (no ~/src).
    done = world.as_user([world.bwrap, *profile(world.ws.home, world.ws.work, None), "--", "/bin/sh", "-c",
                          f"hostname; id -u; ls -A {world.ws.home}; test -e /root && echo has-root || true"],
                         cwd=world.ws.work)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines[:2] == ["lich-sandbox", str(world.user.uid)]
    assert "src" not in lines and "has-root" not in lines and ".claude" in lines


def test_the_first_confined_session_builds_the_runtime_and_polls(world):
    assert environments(world) == []
    session = world.session(FIRST)
    status = session.wait_polling(timeout=BUILD_WAIT)
    assert "loaded" in session.wait_debug(f"hooks module {PLUGIN_ID}")
    [env] = environments(world)
    env_python = os.path.join(data_folder(world), env, "bin", "python")
    assert argv_of(session.daemon_pid(status))[0] == env_python
    session.wait_debug("lich-control setup: creating a virtual environment")
    session.wait_debug(f"lich-control setup: the environment is ready: {env_python}")
    world.first = session


def test_prompt_model_abort_and_ask_ack(world):
    session = world.first
    assert_acked_ok(send(world, session, "prompt", "confined prompt [conf-p]", timeout=WAIT))
    main_request(world, "[conf-p]")
    session.wait_idle()

    check_model_override(world, session, "[conf-m]")

    check_abort(world, session, "[conf-a]", WAIT)

    question = "what are you doing? [conf-q]"
    assert_answered(world.lich.ask(FIRST, question, timeout=60), question)
    session.wait_idle()


def test_exit_ends_the_session_and_its_daemon(world):
    exit_session(world, world.first)
    outcome = world.lich.control(FIRST, "prompt", "is anyone there?", timeout=3)
    assert outcome["ok"] is False and not outcome.get("delivered"), outcome


def test_the_second_confined_session_reuses_the_runtime(world):
    [env] = environments(world)
    stamp = os.path.join(data_folder(world), env, "lich-control-env.json")
    built = os.stat(stamp).st_mtime_ns
    session = world.session(SECOND)
    status = session.wait_polling()
    assert argv_of(session.daemon_pid(status))[0] == os.path.join(data_folder(world), env, "bin", "python")
    assert "lich-control setup: creating" not in session.debug_text()
    assert environments(world) == [env] and os.stat(stamp).st_mtime_ns == built
    assert_acked_ok(send(world, session, "prompt", "second session [conf-2]", timeout=WAIT))
    main_request(world, "[conf-2]")
    session.wait_idle()
    exit_session(world, session)


# --- the route for a clone: make plugin-install ------------------------------

def test_make_plugin_install_from_a_clone_in_src_works_confined(world):
    clone = world.ws.path("home", "src", "lich-control")
    done = world.as_user(["git", "clone", "-q", GIT_URL, clone], cwd=world.ws.home)
    assert done.returncode == 0, done.stderr
    done = world.as_user(["make", "plugin-install", f"CLAUDE={world.claude}"], cwd=clone)
    assert done.returncode == 0, done.stdout + done.stderr
    installed = os.path.join(world.ws.home, ".local", "share", "lich-control", "plugin")
    assert os.path.isfile(os.path.join(installed, ".claude-plugin", "marketplace.json"))
    assert f"now points at dir:{installed}" in done.stdout, done.stdout
    session = world.session(LOCAL)
    session.wait_polling(timeout=BUILD_WAIT)
    assert_acked_ok(send(world, session, "prompt", "from the local share [conf-l]", timeout=WAIT))
    main_request(world, "[conf-l]")
    session.wait_idle()
    exit_session(world, session)


# --- the routes that cannot work confined ------------------------------------

def assert_never_polls(world, session, why):
    """The session comes up and lich cannot drive it: `why` is in its debug log."""
    session.wait_debug(why, timeout=GIVE_UP_WAIT)
    outcome = world.lich.control(session.session_id, "prompt", "anyone?", timeout=5)
    assert outcome["ok"] is False and not outcome.get("delivered"), outcome
    assert session.status() is None
    session.slash("/exit")
    assert session.wait_exit() == 0


def test_a_python_option_in_venvs_is_not_in_the_sandbox(world):
    interpreter = os.path.join(world.ws.home, VENVS_PYTHON[2:])
    done = world.as_user(["/usr/bin/python3", "-m", "venv", "--without-pip", os.path.dirname(os.path.dirname(interpreter))],
                         cwd=world.ws.work)
    assert done.returncode == 0 and os.access(interpreter, os.X_OK), done.stderr
    world.ws.write_settings(python_option(interpreter))
    try:
        session = world.session(VENVS)
        assert_never_polls(world, session, "not restarting it again")
    finally:
        world.ws.write_settings({"pluginConfigs": {}})


def test_a_python_option_under_local_share_is_in_the_sandbox(world):
    # docs/install.md's example: the package installed by hand into a
    # virtual environment under ~/.local/share, which the sandbox mounts read-only.
    folder = os.path.join(world.ws.home, ".local", "share", "lich-control", "venv")
    for argv in (["/usr/bin/python3", "-m", "venv", folder],
                 [os.path.join(folder, "bin", "pip"), "install", "--quiet", "."]):
        done = world.as_user(argv, cwd=world.ws.path("home", "src", "lich-control"), env={"HOME": world.ws.home}, timeout=300)
        assert done.returncode == 0, done.stderr[-1500:]
    interpreter = os.path.join(folder, "bin", "python")
    world.ws.write_settings(python_option(interpreter))
    try:
        session = world.session(SHARE)
        status = session.wait_polling()
        assert argv_of(session.daemon_pid(status))[0] == interpreter
        exit_session(world, session)
    finally:
        world.ws.write_settings({"pluginConfigs": {}})


def test_a_marketplace_added_from_a_clone_in_src_never_loads_confined(world):
    clone = world.ws.path("home", "src", "lich-control")
    done = world.run(["plugin", "marketplace", "add", clone])
    assert done.returncode == 0, done.stdout + done.stderr
    session = world.session(FROM_SRC)
    assert_never_polls(world, session, "Marketplace file not found")
    assert f"hooks module {PLUGIN_ID}" not in session.debug_text()


# --- last -------------------------------------------------------------------

def test_the_token_is_in_no_file(world):
    token = world.lich.token
    folders = world.ws.left_by_the_run()
    assert world.ws.home in folders and world.ws.run_dir in folders
    assert os.path.getsize(os.path.join(world.ws.run_dir, f"{FIRST}.log")) > 0
    assert world.ws.files_holding(token, folders) == []
    assert [p for p in world.watch.seen if any(token in arg for arg in p.argv)] == []
