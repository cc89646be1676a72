"""The setup's child processes (venv, pip, the import check) and the lock a
build holds: one run builds at a time, and what it started ends with it.

The lock is the daemon's own file lock (lich_system loads it); a lock held
is a build running, since a crashed one leaves its records, never its lock.
A step runs so that it, and every process it starts, ends with the setup
however the setup ends (each system's way: lich_system's run_child), and
with its output taken, never sent to /dev/null, which lich's macOS profile
does not let a session open for writing. Standard library only, and syntax
an old python3 still reads (lich_runtime.py says why).
"""
import os
import signal
import subprocess
import sys
import tempfile

from lich_system import SYSTEM


class Lock:
    """An exclusive lock on a file, held by one run at a time; released with the process too.
    `waited`: whether another run held it first."""

    def __init__(self, path, say):
        self.path = path
        self.say = say

    def __enter__(self):
        self.file = open(self.path, "a")
        self.waited = False
        if not SYSTEM.lock().try_lock(self.file.fileno()):
            self.say("another session is setting the environment up; waiting for it")
            SYSTEM.lock().wait_lock(self.file.fileno())
            self.waited = True
        return self

    def __exit__(self, *exc):
        SYSTEM.lock().unlock(self.file.fileno())
        self.file.close()


def lock_held(path):
    """Whether a run holds the lock in `path`: a build is running."""
    try:
        f = open(path)
    except OSError:
        return False
    with f:
        try:
            if not SYSTEM.lock().try_lock(f.fileno(), shared=True):
                return True
        except OSError:
            return True
        SYSTEM.lock().unlock(f.fileno())
    return False


def run_child(argv, hold=None, **kwargs):
    """Runs one step of a build to its end, its output to stdout=; its exit
    code. The step and every process it starts end with the setup, and
    while they live they hold the descriptor `hold` (the setup's lock) where
    the system hands descriptors on."""
    kwargs.setdefault("env", child_env())
    return SYSTEM.run_child(argv, hold, **kwargs)


def run_captured(argv, scratch, hold=None, **kwargs):
    """A step's exit code and its whole output; its temporary files, and its
    children's (TMPDIR), in `scratch`: lich's macOS profile lets a session
    write no temporary folder, and tempfile's fallback, the working
    directory, is the plugin's folder (read-only, or too deep)."""
    os.makedirs(scratch, exist_ok=True)
    with tempfile.TemporaryFile("w+", encoding="utf-8", dir=scratch) as output:
        code = run_child(argv, hold=hold, stdout=output, env=child_env(scratch), **kwargs)
        output.seek(0)
        return code, output.read()


def imports_daemon(python):
    """Whether `python`, isolated from the caller's folder and variables, has the daemon."""
    try:
        result = subprocess.run([python, "-I", "-c", "import lich_control.daemon"], capture_output=True,
                                env=child_env(), timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def child_env(scratch=None):
    """Our environment for pip and venv, less lich's (the token has no business
    there), and with pip's --user turned off: a virtual environment refuses it.
    `scratch`: the folder for their temporary files (TMPDIR)."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("LICH_")}
    env["PIP_USER"] = "0"
    if scratch:
        env["TMPDIR"] = scratch
    SYSTEM.pip_settings(env)
    return env


def end_with_signals():
    """A signal that ends the setup (the session that ran it ended) ends its children too."""
    def ended(signum, frame):
        SYSTEM.end_children()
        sys.exit(128 + signum)

    # Those this system has: Windows has no SIGHUP, and its SIGBREAK is Ctrl-Break.
    for name in ("SIGTERM", "SIGHUP", "SIGINT", "SIGBREAK"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), ended)
