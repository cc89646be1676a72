"""hooks/lich_children.py: the setup's steps end with it, and its lock.

A setup runs in a process of its own at one step of a build, and is ended
the ways a session ends it; the lock is probed from another process.
"""
import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys

import pytest

from setup_plugin import HOOKS, ROOT, WINDOWS

import lich_children as children  # noqa: I100 (from the hooks folder setup_plugin puts on the path)
import lich_system

if WINDOWS:
    import msvcrt

    from lich_control import windows
else:
    import fcntl


@pytest.fixture
def data(tmp_path):
    return str(tmp_path / "data")


# --- the build's children, when the setup ends mid-way -----------------------

# A setup in a process of its own, at one step of a build. The step starts
# a process of its own the way pip re-runs itself (__pip-runner__): one
# that holds neither the lock nor a death signal, and writes into the
# environment until it is ended. The step says both ids and its group's.
SETUP_AT_A_STEP = """
import os, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import lich_children as children
children.end_with_signals()
with children.Lock(sys.argv[2], print) as lock:
    children.run_child([sys.executable, "-c"] + sys.argv[3:], hold=lock.file.fileno())
"""
STEP = """
import os, subprocess, sys, time
started = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]])
print(os.getpid(), started.pid, getattr(os, "getpgrp", os.getpid)(), flush=True)
time.sleep(600)
"""
WRITES = """
import os, sys, time
n = 0
while True:
    with open(os.path.join(sys.argv[1], "site-packages-%d" % (n % 100)), "w") as f:
        f.write(str(n))
    n += 1
    time.sleep(0.01)
"""


class SetupAtAStep:
    def __init__(self, data):
        os.makedirs(data, exist_ok=True)
        self.lock = os.path.join(data, "setup.lock")
        self.env = os.path.join(data, "env-0.1.0-0123456789ab")
        os.makedirs(self.env)
        self.process = subprocess.Popen(
            [sys.executable, "-c", SETUP_AT_A_STEP, os.path.join(HOOKS, "lich_children.py"), self.lock, STEP, self.env, WRITES],
            stdout=subprocess.PIPE, universal_newlines=True)
        self.step, self.started, self.group = map(int, self.process.stdout.readline().split())

    def end(self, signum):
        self.process.send_signal(signum)
        assert self.process.wait(30) == (-signum if signum == signal.SIGKILL else 128 + signum)

    def all_end(self, timeout=10):
        """Whether the step, what it started and the group's leader all end within `timeout` seconds."""
        return all(ends(pid, timeout) for pid in {self.step, self.started, self.group})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if WINDOWS:
            for pid in (self.step, self.started):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGTERM)  # TerminateProcess
        else:
            lich_system.kill_group(self.group)
        self.process.stdout.close()


def ends(pid, timeout=30):
    """Whether the process `pid` (not ours to wait for) ends within `timeout` seconds."""
    if WINDOWS:
        return windows.Process(pid).ended(timeout)
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def lock_is_free(path):
    with open(path, "a") as f:
        if WINDOWS:
            f.seek(0)
            try:
                msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
            except OSError:
                return False
            msvcrt.locking(f.fileno(), msvcrt.LK_UNLCK, 1)
            return True
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


@pytest.mark.skipif(WINDOWS, reason="POSIX's signals; on Windows a relay ends the setup outright (the test below)")
@pytest.mark.parametrize("name", ["SIGTERM", "SIGHUP", "SIGKILL"])
def test_a_setup_that_ends_ends_its_build_step_what_that_started_and_frees_the_lock(data, name):
    # Killed outright, the setup runs no handler: pip's re-run of itself,
    # which holds no lock, went on writing into the environment the next
    # build removed ("Directory not empty").
    with SetupAtAStep(data) as setup:
        setup.end(getattr(signal, name))
        assert setup.all_end()
        assert lock_is_free(setup.lock)
        shutil.rmtree(setup.env)  # as the next build does: nothing writes into it any more
        assert not os.path.exists(setup.env)


@pytest.mark.skipif(WINDOWS, reason="the lock's descriptor held by the step's group is POSIX's; on Windows the lock goes with the setup")
def test_the_lock_stays_held_until_the_steps_group_is_ended(data):
    # The next build waits for the lock, then removes what a build cut short
    # left: it must not get it while anything of that build can still write.
    with SetupAtAStep(data) as setup:
        os.kill(setup.group, signal.SIGSTOP)  # the group's leader held in the moment before it acts on the setup's end
        setup.end(signal.SIGKILL)
        assert not lock_is_free(setup.lock)
        os.kill(setup.group, signal.SIGCONT)
        assert setup.all_end()
        assert lock_is_free(setup.lock)


@pytest.mark.skipif(not WINDOWS, reason="Windows's job object; POSIX's process groups are tested above")
def test_on_windows_a_setup_ended_outright_ends_its_build_step_what_that_started_and_the_lock(data):
    with SetupAtAStep(data) as setup:
        setup.process.kill()  # TerminateProcess: what a relay's kill() does there; no handler runs
        setup.process.wait(30)
        assert ends(setup.step)
        assert ends(setup.started)
        assert lock_is_free(setup.lock)


def test_the_setups_lock_shuts_out_another_process_until_it_is_released(data):
    # flock on POSIX, msvcrt's byte lock on Windows: the status tool in another process sees a build running.
    os.makedirs(data, exist_ok=True)
    path = os.path.join(data, "setup.lock")
    probe = "import sys; sys.path.insert(0, sys.argv[1]); import lich_children; print(lich_children.lock_held(sys.argv[2]))"

    def held_elsewhere():
        return subprocess.run([sys.executable, "-c", probe, HOOKS, path], stdout=subprocess.PIPE,
                              universal_newlines=True, timeout=60).stdout.strip()

    with children.Lock(path, print):
        assert held_elsewhere() == "True"
    assert held_elsewhere() == "False"



# --- lich's macOS confinement: no /dev/null, no temporary folder -------------


@pytest.mark.skipif(WINDOWS, reason="the suite's Windows Python has lich_control on its path only, which -I leaves out; and no /dev/null")
def test_the_import_check_needs_no_dev_null(monkeypatch):
    # lich's macOS profile lets a session open no /dev/null for writing.
    monkeypatch.setattr(os, "devnull", os.path.join(ROOT, "no-such-folder", "null"))
    assert children.imports_daemon(sys.executable)


def test_a_steps_temporary_files_and_its_childrens_are_in_the_folder_it_is_given(data, monkeypatch):
    # lich's macOS profile lets a session write no temporary folder.
    monkeypatch.setattr(children.tempfile, "tempdir", os.path.join(ROOT, "no-such-folder"))
    scratch = os.path.join(data, "tmp")
    code, output = children.run_captured([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"], scratch)
    assert (code, output.strip()) == (0, scratch)

