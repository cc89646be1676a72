#!/usr/bin/env python3
"""The daemon's own Python: a private virtual environment in the plugin's data folder.

A relay (the Claude Code mod, and any other host's) runs this with the
system's `python3` (on Windows `py -3`, else `python`) before it starts the
daemon, unless the person named an interpreter:

    python3 hooks/lich_runtime.py [--data DIR]

DIR is the plugin's persistent data folder (default: $CLAUDE_PLUGIN_DATA).
It makes sure DIR holds a virtual environment with this plugin's package
installed, and builds one when there is none for this release of the
plugin's files: `python3 -m venv --without-pip`, pip (one the interpreter
already has, else the wheel Python ships for ensurepip) installing what the
package needs, and a copy of the package itself. It says what it does on
stderr, one sentence a line, and on stdout one JSON line when it starts to
build, then its result as the last:

    {"building": "DIR/env-0.1.0-1a2b3c4d5e6f"}
    {"ok": true, "python": "DIR/env-0.1.0-1a2b3c4d5e6f/bin/python", "built": false}
                                        (on Windows: ...\\Scripts\\python.exe)
    {"ok": false, "error": "one line: what went wrong and what to do",
     "problem": "what went wrong", "command": "the command that tries again"}

and exits 0 when the environment is ready, 1 when it is not. Each run tries
a failed build again; the failure is kept in DIR (setup-failed.json) for
lich-mod-status until a build succeeds. While it builds, DIR holds
setup-running.json. Two runs at once take turns under a lock, so the second
finds what the first built (or that it failed). A run that is ended
mid-build (its session ended) ends its venv and pip with it, and the next
build clears what it left.

The bin/ tools import it too (`reexec`, `setup_states`), to run in the
daemon's interpreter and to say what a setup is doing. Standard library
only, and syntax an old python3 still reads, so that one too old for the
package is told so rather than failing to parse this file.
"""
import argparse
import configparser
import glob
import hashlib
import importlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

WINDOWS = os.name == "nt"

try:
    import fcntl
except ImportError:  # Windows: msvcrt's locking instead
    fcntl = None
try:
    import msvcrt
except ImportError:
    msvcrt = None

# Where the relay puts the chosen interpreter for the session's own commands
# (bin/ on its PATH), and the guard that stops a tool re-running itself twice.
PYTHON_VARIABLE = "LICH_CONTROL_PYTHON"
REEXEC_GUARD = "LICH_CONTROL_REEXECUTED"
# What lich sets in a session it started; the daemon needs all three.
LICH_VARIABLES = ("LICH_PORT", "LICH_TOKEN", "LICH_SESSION_ID")
KEPT_ENVIRONMENTS = 2
STAMP = "lich-control-env.json"
CURRENT = "current.json"
FAILURE = "setup-failed.json"
RUNNING = "setup-running.json"
LOCK = "setup.lock"
LOG = "setup.log"
# The build's temporary files, its own and pip's (TMPDIR): lich's macOS
# profile lets a session write no temporary folder, and tempfile's fallback,
# the working directory, is the plugin's folder (read-only, or too deep).
SCRATCH = "tmp"
# What the environment is made from: the package's own folder, copied in,
# and setup.cfg, which names what it needs. The rest of the plugin's folder
# (tests, docs, a developer's .venv) is neither copied nor part of the key,
# and nor are the texts setup.cfg only quotes, so editing them rebuilds nothing.
PACKAGE_FILES = ("setup.cfg", "pyproject.toml", "README.md", "LICENSE")
QUOTED_FILES = ("README.md", "LICENSE")
PACKAGE_DIR = "lich_control"
# What a pip says when it cannot do this job (none there; one older than
# 22.3, which has no --python): the next way to a pip is tried.
NO_PIP = re.compile(r"No module named pip\b|no such option: --python")
# pip's words for a package index it cannot reach.
UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution"
    r"|Name or service not known|Network is unreachable|Connection refused|ProxyError|SSLError"
    r"|Max retries exceeded|timed out"
)
NO_MATCH = re.compile(r"No matching distribution found for (\S+)|Could not find a version that satisfies the requirement (\S+)")
HERE = os.path.dirname(os.path.realpath(__file__))
PLUGIN_ROOT = os.path.dirname(HERE)


class SetupFailed(Exception):
    """A problem a person can act on, said in one sentence; `short`, the same
    in few enough words for one line on a screen (no folders)."""

    def __init__(self, text, short=None):
        super().__init__(text)
        self.short = short or text


class Plugin:
    """The plugin's folder as far as its Python package goes: what it is, and what it needs."""

    def __init__(self, root):
        self.root = root

    def version(self):
        with open(os.path.join(self.root, ".claude-plugin", "plugin.json"), encoding="utf-8") as f:
            return str(json.load(f).get("version", "0"))

    def requirements(self):
        """What the package needs installed, from setup.cfg's install_requires."""
        return [line.strip() for line in self.setup_cfg().get("options", "install_requires", fallback="").splitlines()
                if line.strip() and not line.strip().startswith("#")]

    def setup_cfg(self):
        parser = configparser.ConfigParser()
        parser.read(os.path.join(self.root, "setup.cfg"), encoding="utf-8")
        return parser

    def python_requires(self):
        """The oldest Python the package takes, from setup.cfg's `>=X.Y`; None if it names none."""
        wanted = self.setup_cfg().get("options", "python_requires", fallback="")
        found = re.search(r">=\s*(\d+)\.(\d+)", wanted)
        return (int(found.group(1)), int(found.group(2))) if found else None

    def sources(self):
        """The package's files, relative to the root, sorted: what is copied and hashed."""
        names = [name for name in PACKAGE_FILES if os.path.isfile(os.path.join(self.root, name))]
        for folder, dirs, files in os.walk(os.path.join(self.root, PACKAGE_DIR)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in files:
                if not name.endswith((".pyc", ".pyo")):
                    names.append(os.path.relpath(os.path.join(folder, name), self.root))
        return sorted(names)

    def key(self):
        """The plugin's version and a digest of its package's files: a new key, a new environment.

        The digest makes an edited folder (a developer's checkout, a marketplace
        read from a folder) rebuild too, where the version alone would not.
        """
        digest = hashlib.sha256()
        for name in [name for name in self.sources() if name not in QUOTED_FILES]:
            digest.update(name.replace(os.sep, "/").encode() + b"\0")
            with open(os.path.join(self.root, name), "rb") as f:
                digest.update(f.read())
            digest.update(b"\0")
        return "{}-{}".format(self.version(), digest.hexdigest()[:12])


class Runtime:
    """The private environments in one data folder, and the records beside them."""

    def __init__(self, data, plugin, say, now=time.time, python=sys.executable, building=lambda env: None):
        self.data = data
        self.plugin = plugin
        self.say = say
        self.now = now
        self.python = python
        self.building = building  # told the environment's folder as a build (or a wait for one) starts
        self.lock = None  # held while this run builds: its children hold it too

    def path(self, *names):
        return os.path.join(self.data, *names)

    def env_dir(self, key):
        return self.path("env-" + key)

    def ensure(self):
        """The interpreter of a ready environment for this plugin, and whether this run built it.

        Raises SetupFailed with the line to log when there is none.
        """
        key = self.plugin.key()
        # A ready environment takes no lock and writes nothing that has not
        # changed, so a full or read-only data folder keeps it usable.
        python = self.ready(key)
        if python:
            self.point_at(key, python)
            return python, False
        os.makedirs(self.data, exist_ok=True)
        self.building(self.env_dir(key))
        asked = self.now()
        with self.locked() as lock:
            self.lock = lock
            if lock.waited:  # what the run we waited for did: built, or failed since we asked
                python = self.ready(key)
                if python:
                    self.point_at(key, python)
                    return python, False
                failed = read_json(self.path(FAILURE))
                if isinstance(failed, dict) and failed.get("key") == key and failed.get("at", 0) >= asked:
                    raise SetupFailed(failed.get("error"), failed.get("problem"))
            write_json(self.path(RUNNING), {"pid": os.getpid(), "started": self.now(), "key": key})
            try:
                python = self.build(key)
            except SetupFailed as failure:
                self.remember_failure(key, failure)
                raise
            finally:
                remove(self.path(RUNNING))
            remove(self.path(FAILURE))
            self.point_at(key, python)
            self.prune(keep=self.env_dir(key))
            return python, True

    def locked(self):
        return _Lock(self.path(LOCK), self.say)

    def ready(self, key):
        """The environment's interpreter when it was built whole for `key` and still runs."""
        env = self.env_dir(key)
        python = env_python(env)
        stamp = read_json(os.path.join(env, STAMP))
        if not isinstance(stamp, dict) or stamp.get("key") != key or not os.path.exists(python):
            return None
        if not self.runs_daemon(python):
            self.say("the environment in {} no longer runs the daemon; building it again".format(env))
            return None
        return python

    def build(self, key):
        self.check_python()
        env = self.env_dir(key)
        # What a build cut short left: the lock, which its children held while
        # they lived, says nothing of it writes there any more.
        for scratch in glob.glob(self.path("build-*")) + [self.path(SCRATCH)]:
            shutil.rmtree(scratch, ignore_errors=True)
        if os.path.exists(env):  # no stamp
            shutil.rmtree(env)
        self.say("creating a virtual environment in {} with {} ({})".format(env, self.python, version_text()))
        self.create_venv(env)
        python = env_python(env)
        self.say("installing what lich-control {} needs into it ({}; pip's whole output goes to {}), "
                 "and the package itself".format(self.plugin.version(), ", ".join(self.plugin.requirements()),
                                                 self.path(LOG)))
        self.install(python)
        if not self.runs_daemon(python):
            raise SetupFailed("the environment in {} was built but cannot import lich_control.daemon".format(env),
                              "the environment it built cannot import lich_control.daemon")
        write_json(os.path.join(env, STAMP), {"key": key, "built": self.now(), "base": self.python})
        self.say("the environment is ready: {}".format(python))
        return python

    def check_python(self):
        needed = self.plugin.python_requires()
        if needed and tuple(sys.version_info[:2]) < needed:
            raise SetupFailed("{} is Python {}, and lich-control needs {}.{} or later".format(
                self.python, version_text(), needed[0], needed[1]))

    def create_venv(self, env):
        # Without pip: installing pip into it (ensurepip) would cost more than
        # the rest of the build, and the daemon never runs pip.
        code, text = self.run_captured([self.python, "-m", "venv", "--without-pip", env])
        if code == 0:
            return
        if ("No module named venv" in text or "ensurepip" in text) and WINDOWS:
            raise SetupFailed("{} has no venv module (the embeddable package has none: install Python from python.org)".format(
                self.python), "python has no venv module (install Python from python.org)")
        if "No module named venv" in text or "ensurepip" in text:
            raise SetupFailed("{} has no venv module (on Debian and Ubuntu: apt install python3-venv)".format(self.python),
                              "python3 has no venv module (on Debian and Ubuntu: apt install python3-venv)")
        raise SetupFailed("{} -m venv failed: {}".format(self.python, last_line(text)))

    def install(self, python):
        """What the package needs, through pip, then the package's own folder, copied.

        The package is pure Python and is run, never imported by anything that
        asks pip about it: copied, it needs no build (a build backend fetched
        from the index, and a wheel made), which cost more than the rest.
        """
        with open(self.path(LOG), "w", encoding="utf-8") as log:
            code = 0
            for pip in self.pips(python) if self.plugin.requirements() else ():
                argv = pip + ["install", "--disable-pip-version-check", "--no-input", "--progress-bar", "off"]
                argv += self.plugin.requirements()
                code, text = self.run_captured(argv, cwd=self.data)
                log.write("$ {}\n{}".format(" ".join(argv), text))
                if code == 0 or not NO_PIP.search(text):
                    break
        if code != 0:
            problem = pip_problem(self.path(LOG))
            raise SetupFailed("pip could not install what lich-control needs into {}: {} (pip's output: {})".format(
                os.path.dirname(os.path.dirname(python)), problem, self.path(LOG)), "pip: " + problem)
        site = env_site_packages(os.path.dirname(os.path.dirname(python)))
        for name in self.plugin.sources():
            if name.split(os.sep)[0] == PACKAGE_DIR:
                target = os.path.join(site, name)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                shutil.copyfile(os.path.join(self.plugin.root, name), target)

    def pips(self, python):
        """The ways to a pip that installs into the environment of `python`, the cheapest first.

        A pip the interpreter has (or the one it was made from, when it is a
        virtual environment itself) installs into another with --python and
        runs from its compiled files. Else the wheel Python ships for ensurepip,
        run as it is: its modules are compiled as they load, which costs a
        second more. Last, ensurepip itself, into the environment.
        """
        for interpreter in unique([self.python, base_python()]):
            yield [interpreter, "-m", "pip", "--python", python]
        for wheel in bundled_pips():
            yield [python, os.path.join(wheel, "pip")]
        code, text = self.run_captured([python, "-m", "ensurepip", "--default-pip"])
        if code != 0:
            raise SetupFailed("{} has no pip to install with, and cannot give a virtual environment one: its ensurepip "
                              "module is missing (on Debian and Ubuntu: apt install python3-venv)".format(self.python),
                              "python3 has no pip nor ensurepip (on Debian and Ubuntu: apt install python3-venv)")
        yield [python, "-m", "pip"]

    def run_captured(self, argv, **kwargs):
        """A step's exit code and its whole output; its temporary files in the data folder."""
        scratch = self.path(SCRATCH)
        os.makedirs(scratch, exist_ok=True)
        with tempfile.TemporaryFile("w+", encoding="utf-8", dir=scratch) as output:
            code = self.run_step(argv, stdout=output, env=child_env(scratch), **kwargs)
            output.seek(0)
            return code, output.read()

    def run_step(self, argv, **kwargs):
        return run_child(argv, hold=None if self.lock is None else self.lock.file.fileno(), **kwargs)

    def runs_daemon(self, python):
        return imports_daemon(python)

    def point_at(self, key, python):
        """Records the ready interpreter where the bin/ tools and other relays look.

        Only a record that changed is written; one the folder cannot take costs
        the tools their way to it, never the environment itself.
        """
        record = {"python": python, "key": key, "root": self.plugin.root}
        if read_json(self.path(CURRENT)) == record:
            return
        try:
            write_json(self.path(CURRENT), record)
        except OSError as error:
            self.say("could not record the environment in {} ({}); the bin/ tools may not find it".format(
                self.path(CURRENT), error.strerror))

    def prune(self, keep):
        """Keeps the new environment and the one before it, which a daemon of an
        older session may still be running from."""
        others = [env for env in glob.glob(self.path("env-*")) if env != keep and os.path.isdir(env)]
        others.sort(key=built_at, reverse=True)
        for env in others[KEPT_ENVIRONMENTS - 1:]:
            self.say("removing an older environment, {}".format(env))
            shutil.rmtree(env, ignore_errors=True)

    def remember_failure(self, key, failure):
        write_json(self.path(FAILURE), {"key": key, "at": self.now(), "error": str(failure), "problem": failure.short})


class _Lock:
    """An exclusive lock on a file, held by one run at a time; released with the process too."""

    def __init__(self, path, say):
        self.path = path
        self.say = say

    def __enter__(self):
        self.file = open(self.path, "a")
        self.waited = False
        if not try_lock(self.file):
            self.say("another session is setting the environment up; waiting for it")
            wait_lock(self.file)
            self.waited = True
        return self

    def __exit__(self, *exc):
        unlock(self.file)
        self.file.close()


# The lock of a file: flock on POSIX; on Windows msvcrt's lock of its first
# byte (LockFile), which another process cannot take either, and which goes
# with the process that holds it.


def try_lock(f, shared=False):
    """Takes the lock if no other run holds it: whether it did."""
    if fcntl is None:
        f.seek(0)
        try:
            msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    try:
        fcntl.flock(f, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def wait_lock(f):
    if fcntl is not None:
        fcntl.flock(f, fcntl.LOCK_EX)
        return
    while True:
        f.seek(0)
        try:  # LK_LOCK tries once a second for ten seconds, then gives up
            msvcrt.locking(f.fileno(), msvcrt.LK_LOCK, 1)
            return
        except OSError:
            continue


def unlock(f):
    if fcntl is None:
        f.seek(0)
        msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)
    else:
        fcntl.flock(f, fcntl.LOCK_UN)


# --- the build's children ----------------------------------------------------

# The process groups of the children running now, which a signal that ends
# the setup ends too. Only the main thread touches it (the setup has no other).
_running = set()

# What leads each step's process group, run as `python -c LEADER WATCHED
# STEP...`: it runs the step in its group and waits for it, and once WATCHED
# (a pipe only the setup holds the other end of, which the kernel closes
# however the setup ends) reaches its end, it kills the group whole: the
# step, and what the step started, which inherits neither the lock nor a
# death signal (pip re-runs itself so, as __pip-runner__). It exits as the
# step did (killed by a signal: 128 and its number). Only os, sys and
# _thread: it starts once a step, and subprocess with what it imports would
# cost twice its own start.
LEADER = """
import os, sys, _thread
watched = int(sys.argv[1])
os.set_inheritable(watched, False)
step = os.fork()
if step == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    except OSError as error:
        os.write(2, "cannot run {}: {}\\n".format(sys.argv[2], error.strerror).encode())
    finally:
        os._exit(127)
def watch():
    os.read(watched, 1)
    os.killpg(0, 9)  # SIGKILL
_thread.start_new_thread(watch, ())
status = os.waitpid(step, 0)[1]
os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
"""


def run_child(argv, hold=None, **kwargs):
    """Runs one step of a build (venv, pip) to its end, its output to stdout=;
    its exit code. The step and every process it starts end with the setup:
    they run in a process group of their own, which a signal that ends the
    setup kills whole (end_with_signals), which its leader (LEADER) kills
    whole when the setup ends any other way (SIGKILL), and which the setup
    kills once the step has ended, for what the step left running. The leader
    and the step hold the descriptor `hold` (the setup's lock) while they
    live, so a next build waits until the group is ended instead of removing
    what it writes into. On Windows: windows_child."""
    if WINDOWS:
        return windows_child(argv, **kwargs)
    kwargs.setdefault("env", child_env())
    watched, setup_end = os.pipe()
    try:
        child = subprocess.Popen([sys.executable, "-I", "-S", "-c", LEADER, str(watched)] + list(argv), stderr=subprocess.STDOUT, start_new_session=True,
                                 pass_fds=(watched,) if hold is None else (watched, hold), **kwargs)
    finally:
        os.close(watched)
    _running.add(child.pid)
    try:
        if hasattr(os, "waitid"):
            # Ended but not yet reaped, its id is still its group's and no
            # other's: what it left running goes with it.
            os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
            kill_group(child.pid)
        return child.wait()
    finally:
        _running.discard(child.pid)
        os.close(setup_end)


def windows_child(argv, **kwargs):
    """run_child on Windows, which has no process groups, death signals or
    descriptors to hand on, and where a relay stops the setup outright
    (TerminateProcess: no handler runs). The child, and what it starts, go
    in a job object of the setup's that kills them all once its last handle
    closes: when the setup ends, however it ends. What the child starts
    before it is put there (the moment after its creation) is not; venv and
    pip start nothing that soon. The lock goes with the setup: a next build
    finds it free only once the job has ended this one's children."""
    kwargs.setdefault("env", child_env())
    child = subprocess.Popen(argv, stderr=subprocess.STDOUT, **kwargs)
    _job().assign(child)
    return child.wait()


class _Job:
    """A Windows job object that kills its processes once the last handle to it closes (the setup's, at its end)."""

    KILL_ON_JOB_CLOSE = 0x2000
    EXTENDED_LIMIT_INFORMATION = 9

    def __init__(self):
        import ctypes
        from ctypes import wintypes

        class Limits(ctypes.Structure):  # JOBOBJECT_EXTENDED_LIMIT_INFORMATION, of which only LimitFlags is set
            _fields_ = [("PerProcessUserTimeLimit", ctypes.c_int64), ("PerJobUserTimeLimit", ctypes.c_int64),
                        ("LimitFlags", wintypes.DWORD), ("MinimumWorkingSetSize", ctypes.c_size_t),
                        ("MaximumWorkingSetSize", ctypes.c_size_t), ("ActiveProcessLimit", wintypes.DWORD),
                        ("Affinity", ctypes.c_size_t), ("PriorityClass", wintypes.DWORD),
                        ("SchedulingClass", wintypes.DWORD), ("IoCounters", ctypes.c_uint64 * 6),
                        ("ProcessMemoryLimit", ctypes.c_size_t), ("JobMemoryLimit", ctypes.c_size_t),
                        ("PeakProcessMemoryUsed", ctypes.c_size_t), ("PeakJobMemoryUsed", ctypes.c_size_t)]

        self._kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
        self._kernel32.CreateJobObjectW.restype = wintypes.HANDLE
        self._kernel32.AssignProcessToJobObject.argtypes = [wintypes.HANDLE, wintypes.HANDLE]
        self.handle = self._kernel32.CreateJobObjectW(None, None)
        limits = Limits(LimitFlags=self.KILL_ON_JOB_CLOSE)
        if not self.handle or not self._kernel32.SetInformationJobObject(
                wintypes.HANDLE(self.handle), self.EXTENDED_LIMIT_INFORMATION, ctypes.byref(limits), ctypes.sizeof(limits)):
            raise SetupFailed("a job object for the build's processes could not be made ({})".format(
                ctypes.FormatError(ctypes.get_last_error())))

    def assign(self, child):
        """Puts the child in the job; one that cannot be (gone already) is left to end as it does."""
        self._kernel32.AssignProcessToJobObject(self.handle, int(child._handle))


_JOBS = []


def _job():
    """The setup's one job object, made at its first child."""
    if not _JOBS:
        _JOBS.append(_Job())
    return _JOBS[0]


def kill_group(group):
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def end_with_signals():
    """A signal that ends the setup (the session that ran it ended) ends its children too."""
    def ended(signum, frame):
        for group in list(_running):
            kill_group(group)
        sys.exit(128 + signum)

    # Those this system has: Windows has no SIGHUP, and its SIGBREAK is Ctrl-Break.
    for name in ("SIGTERM", "SIGHUP", "SIGINT", "SIGBREAK"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), ended)


def built_at(env):
    """When the environment was finished; 0 for one never finished."""
    try:
        return os.path.getmtime(os.path.join(env, STAMP))
    except OSError:
        return 0


def env_python(env):
    return os.path.join(env, "Scripts", "python.exe") if WINDOWS else os.path.join(env, "bin", "python")


def env_site_packages(env):
    """Where a virtual environment made by this interpreter keeps its packages (venv's own layout)."""
    if WINDOWS:
        return os.path.join(env, "Lib", "site-packages")
    return os.path.join(env, "lib", "python{}.{}".format(*sys.version_info[:2]), "site-packages")


def base_python():
    """The interpreter this one was made from, when it is a virtual environment; else itself."""
    return getattr(sys, "_base_executable", None) or sys.executable


def bundled_pips():
    """The pip wheels this Python ships for ensurepip: in its ensurepip
    package, or where a distribution keeps them instead (Debian:
    <prefix>/share/python-wheels)."""
    folders = [os.path.join(sys.base_prefix, "share", "python-wheels")]
    try:
        import ensurepip
        folders.insert(0, os.path.join(os.path.dirname(ensurepip.__file__), "_bundled"))
    except ImportError:
        pass
    wheels = []
    for folder in folders:
        wheels.extend(sorted(glob.glob(os.path.join(folder, "pip-*.whl")), reverse=True)[:1])
    return wheels


def unique(items):
    return [item for n, item in enumerate(items) if item not in items[:n]]


def remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def imports_daemon(python):
    """Whether `python`, isolated from the caller's folder and variables, has
    the daemon. Its output is taken, not sent to /dev/null, which lich's
    macOS profile does not let a session open for writing."""
    try:
        result = subprocess.run([python, "-I", "-c", "import lich_control.daemon"], capture_output=True,
                                env=child_env(), timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def child_env(scratch=None):
    """Our environment for pip and venv, less lich's (the token has no business
    there), and with pip's --user turned off: a virtual environment refuses it.
    `scratch`: the folder for their temporary files (TMPDIR).

    On macOS pip caches in ~/Library/Caches/pip, which lich's profile denies:
    there, unless the person named a cache, it caches in ~/.cache/pip, which
    the profile lets a session write (a cache-dir in a pip config file is
    overridden by this; PIP_CACHE_DIR is not)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("LICH_")}
    env["PIP_USER"] = "0"
    if scratch:
        env["TMPDIR"] = scratch
    if sys.platform == "darwin" and not env.get("PIP_CACHE_DIR") and not env.get("PIP_NO_CACHE_DIR"):
        env["PIP_CACHE_DIR"] = os.path.join(os.path.expanduser("~"), ".cache", "pip")
    return env


def pip_problem(log_path):
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            output = f.read()
    except OSError:
        return "it wrote nothing"
    missing = NO_MATCH.search(output)
    if UNREACHABLE.search(output):
        return "the package index could not be reached"
    if missing:
        return "{} is not on the package index, or none there fits this Python".format(
            (missing.group(1) or missing.group(2)).rstrip(")"))
    return last_line(output)


def last_line(output):
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def version_text():
    return "{}.{}.{}".format(*sys.version_info[:3])


def clock(seconds):
    return time.strftime("%H:%M:%S", time.localtime(seconds if isinstance(seconds, (int, float)) else 0))


def read_json(path):
    """The document in `path`; None when there is none to read."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path, document):
    """Whole or not at all: a reader never sees half a file, and a write that
    fails (a full disk) leaves no temporary behind."""
    temporary = "{}.{}.tmp".format(path, os.getpid())
    try:
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(document, f)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.remove(temporary)
        except OSError:
            pass
        raise


def failure_line(problem, data=None):
    """The one line a failure is logged as: what went wrong, and what to do about it."""
    line = "lich-control cannot set up its Python environment: {}.".format(problem)
    if data:
        line += " To try again: {} (the next session tries again too).".format(retry_command(data))
    return line + (" Or set the plugin's python option to an interpreter that has lich-control installed, "
                   "or install it by hand (docs/install.md)")


def retry_command(data):
    """The command that builds the environment in `data`, as a shell takes it:
    on Windows as cmd takes it, each part with a space in double quotes
    (PowerShell takes it too, with `& ` before it when the first part is quoted)."""
    argv = [sys.executable, os.path.join(HERE, "lich_runtime.py"), "--data", data]
    if WINDOWS:
        return subprocess.list2cmdline(argv)
    return " ".join(shlex.quote(part) for part in argv)


# --- for the bin/ tools -------------------------------------------------------


def chosen_python(environ=os.environ):
    """The interpreter the daemon runs with, as far as a tool can tell: the one
    the relay named for the session, else the newest private environment."""
    named = environ.get(PYTHON_VARIABLE)
    if named and os.path.exists(named):
        return named
    if sys.prefix != getattr(sys, "base_prefix", sys.prefix):
        return None  # run from a virtual environment: that one was chosen
    return private_python(environ)


def data_folders(environ=os.environ):
    """This plugin's data folders: the one Claude Code named, else every one it keeps."""
    if environ.get("CLAUDE_PLUGIN_DATA"):
        return [environ["CLAUDE_PLUGIN_DATA"]]
    return sorted(glob.glob(os.path.join(plugins_data(environ), "lich-control-*")))


def plugins_data(environ=os.environ):
    config = environ.get("CLAUDE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".claude")
    return os.path.join(config, "plugins", "data")


def setup_states(environ=os.environ):
    """What the setups in this plugin's data folders are doing, for a person:
    for each that is building now, or whose last build failed,
    {"data", "state": "running" or "failed", "text": one line}."""
    states = []
    for data in data_folders(environ):
        running = read_json(os.path.join(data, RUNNING))
        failed = read_json(os.path.join(data, FAILURE))
        if isinstance(running, dict) and lock_held(os.path.join(data, LOCK)):
            states.append({"data": data, "state": "running", "text": (
                "a setup of lich-control's Python environment is running in {} (since {}, pid {}); the daemon "
                "starts when it is done".format(data, clock(running.get("started")), running.get("pid")))})
        elif isinstance(failed, dict):
            states.append({"data": data, "state": "failed", "text": (
                "the last setup of lich-control's Python environment in {} failed at {}: {}. To try again: {}".format(
                    data, clock(failed.get("at")), failed.get("error"), retry_command(data)))})
    return states


def lock_held(path):
    """Whether a run holds the setup's lock: a build is running (a crashed one
    leaves its records, never its lock)."""
    try:
        f = open(path)
    except OSError:
        return False
    with f:
        try:
            if not try_lock(f, shared=True):
                return True
        except OSError:
            return True
        unlock(f)
    return False


def private_python(environ=os.environ):
    """The ready interpreter recorded in a data folder of this plugin, this
    folder's own first, then the newest."""
    folders = data_folders(environ)
    found = []
    for folder in folders:
        try:
            with open(os.path.join(folder, CURRENT), encoding="utf-8") as f:
                current = json.load(f)
            mtime = os.path.getmtime(os.path.join(folder, CURRENT))
        except (OSError, ValueError):
            continue
        python = current.get("python")
        if python and os.path.exists(python):
            found.append((current.get("root") == PLUGIN_ROOT, mtime, python))
    return max(found)[2] if found else None


def inside_lich(environ=os.environ):
    """Whether lich started this session: each of its variables set. Read
    before anything that needs the environment, which outside lich is never built."""
    return all(environ.get(name) for name in LICH_VARIABLES)


def entry_point(tool, module):
    """`module`'s main; with the package's dependencies missing (no environment
    built yet), the tool ends here with the one line that says what to do."""
    try:
        return importlib.import_module(module).main
    except ModuleNotFoundError as missing:
        if (missing.name or "").split(".")[0] == "lich_control":
            raise  # the plugin's own files: not a missing environment
        states = setup_states()
        if states:  # building, or failed: what is going on, said as lich-mod-status says it
            for state in states:
                sys.stdout.write("{}\n".format(state["text"]))
            sys.exit(1 if any(state["state"] == "failed" for state in states) else 0)
        folders = data_folders()
        # Where Claude Code keeps it when installed as the README says (lich-control@lich-control).
        data = folders[0] if folders else os.path.join(plugins_data(), "lich-control-lich-control")
        sys.stderr.write(
            "{}: lich-control's Python environment is not built yet (no {} here); a session inside lich builds it "
            "as it starts, or build it now: {} (or install lich-control into a Python of your own, "
            "docs/install.md)\n".format(tool, missing.name, retry_command(data)))
        sys.exit(1)


def reexec(script, argv=None):
    """Runs `script` again under the daemon's interpreter, when that is not this one."""
    python = None if os.environ.get(REEXEC_GUARD) else chosen_python()
    # Not compared through symbolic links: an environment's python is one, to
    # the very interpreter that made it, and running it is what makes it that environment.
    if not python or os.path.abspath(python) == os.path.abspath(sys.executable):
        return
    os.environ[REEXEC_GUARD] = "1"
    args = sys.argv[1:] if argv is None else argv
    if WINDOWS:  # whose execv starts a new process and ends this one: the shell would not wait for it
        sys.exit(subprocess.call([python, script] + list(args)))
    os.execv(python, [python, script] + list(args))


# --- as a program -------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(prog="lich_runtime.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=os.environ.get("CLAUDE_PLUGIN_DATA"),
                        help="the plugin's data folder (default: $CLAUDE_PLUGIN_DATA)")
    args = parser.parse_args(argv)
    if not args.data:
        return failed("it has no data folder to keep it in (--data DIR, or CLAUDE_PLUGIN_DATA as Claude Code sets it)")
    data = os.path.abspath(args.data)

    def say(text):
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    end_with_signals()
    runtime = Runtime(data, Plugin(PLUGIN_ROOT), say, building=lambda env: tell({"building": env}))
    try:
        python, built = runtime.ensure()
    except SetupFailed as failure:
        return failed(str(failure), data, failure.short)
    except OSError as error:  # the data folder itself: unwritable, full
        return failed("{} ({})".format(error.strerror, error.filename), data)
    return answer({"ok": True, "python": python, "built": built})


def failed(problem, data=None, short=None):
    """`short`: the problem in few words, for a screen."""
    return answer({"ok": False, "error": failure_line(problem, data), "problem": short or problem,
                   "command": retry_command(data) if data else None})


def answer(result):
    tell(result)
    return 0 if result["ok"] else 1


def tell(document):
    sys.stdout.write(json.dumps(document) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
