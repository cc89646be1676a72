"""What differs between POSIX and Windows for the plugin's setup and its bin/
tools, behind one interface with two implementations. `SYSTEM` is this
system's, chosen here and nowhere else:

- the file lock: the daemon's own (lich_control/posix.py or windows.py),
  loaded by its path, since the setup runs before the package is installed;
- how a build's step runs so that it, and what it starts, end with the setup;
- where venv puts an environment's interpreter and packages;
- how a command is quoted for a person's shell;
- how a tool hands itself over to another interpreter;
- what to install when Python has no venv module;
- on macOS, where pip may keep its cache.

Standard library only, and syntax an old python3 still reads (lich_runtime.py says why).
"""
import importlib.util
import os
import shlex
import signal
import subprocess
import sys

PLUGIN_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

# What leads each step's process group on POSIX, run as `python -c LEADER
# WATCHED STEP...`: it runs the step in its group and waits for it, and once
# WATCHED (a pipe only the setup holds the other end of, which the kernel
# closes however the setup ends) reaches its end, it kills the group whole:
# the step, and what the step started, which inherits neither the lock nor
# a death signal (pip re-runs itself so, as __pip-runner__). It exits as the
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


class _System:
    LOCK = None  # the daemon's module that holds this system's file lock

    def __init__(self):
        self._lock = None

    def lock(self):
        """lich_control's try_lock, wait_lock and unlock for this system (each
        takes a file descriptor), loaded by path at the first lock: a Python too
        old to read the package's files is told so before it needs one."""
        if self._lock is None:
            path = os.path.join(PLUGIN_ROOT, "lich_control", self.LOCK + ".py")
            spec = importlib.util.spec_from_file_location("lich_control_" + self.LOCK, path)
            self._lock = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(self._lock)
        return self._lock

    def pip_settings(self, env):
        """Changes to the environment pip runs with, on this system."""


class Posix(_System):
    LOCK = "posix"
    NO_VENV = ("{} has no venv module (on Debian and Ubuntu: apt install python3-venv)",
               "python3 has no venv module (on Debian and Ubuntu: apt install python3-venv)")

    def __init__(self):
        super().__init__()
        # The process groups of the steps running now, which a signal that
        # ends the setup ends too. Only the main thread touches it.
        self.running = set()

    def env_python(self, env):
        return os.path.join(env, "bin", "python")

    def env_site_packages(self, env):
        """Where a virtual environment made by this interpreter keeps its packages (venv's own layout)."""
        return os.path.join(env, "lib", "python{}.{}".format(*sys.version_info[:2]), "site-packages")

    def quote(self, argv):
        return " ".join(shlex.quote(part) for part in argv)

    def run_instead(self, python, argv):
        os.execv(python, [python] + argv)

    def run_child(self, argv, hold, **kwargs):
        """The step runs in a process group of its own, led by LEADER, which
        kills the group whole when the setup ends however it ends (SIGKILL
        included); end_children kills it on a signal that ends the setup, and
        once the step has ended, the setup kills the group for what the step
        left running. The leader and the step hold the descriptor `hold` (the
        setup's lock) while they live, so a next build waits until the group
        is ended instead of removing what it writes into."""
        watched, setup_end = os.pipe()
        try:
            child = subprocess.Popen([sys.executable, "-I", "-S", "-c", LEADER, str(watched)] + list(argv),
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     pass_fds=(watched,) if hold is None else (watched, hold), **kwargs)
        finally:
            os.close(watched)
        self.running.add(child.pid)
        try:
            if hasattr(os, "waitid"):
                # Ended but not yet reaped, its id is still its group's and no
                # other's: what it left running goes with it.
                os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
                kill_group(child.pid)
            return child.wait()
        finally:
            self.running.discard(child.pid)
            os.close(setup_end)

    def end_children(self):
        for group in list(self.running):
            kill_group(group)


def kill_group(group):
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class MacOS(Posix):
    def pip_settings(self, env):
        """pip caches in ~/Library/Caches/pip, which lich's profile denies:
        unless the person named a cache, it caches in ~/.cache/pip, which the
        profile lets a session write (a cache-dir in a pip config file is
        overridden by this; PIP_CACHE_DIR is not)."""
        if not env.get("PIP_CACHE_DIR") and not env.get("PIP_NO_CACHE_DIR"):
            env["PIP_CACHE_DIR"] = os.path.join(os.path.expanduser("~"), ".cache", "pip")


class Windows(_System):
    LOCK = "windows"
    NO_VENV = ("{} has no venv module (the embeddable package has none: install Python from python.org)",
               "python has no venv module (install Python from python.org)")

    def __init__(self):
        super().__init__()
        self._job = None

    def env_python(self, env):
        return os.path.join(env, "Scripts", "python.exe")

    def env_site_packages(self, env):
        return os.path.join(env, "Lib", "site-packages")

    def quote(self, argv):
        """As cmd takes it, each part with a space in double quotes
        (PowerShell takes it too, with `& ` before it when the first part is quoted)."""
        return subprocess.list2cmdline(argv)

    def run_instead(self, python, argv):
        # Windows's execv starts a new process and ends this one: the shell would not wait for it.
        sys.exit(subprocess.call([python] + argv))

    def run_child(self, argv, hold, **kwargs):
        """Windows has no process groups, death signals or descriptors to hand
        on, and a relay stops the setup outright (TerminateProcess: no handler
        runs). The step, and what it starts, go in a job object of the setup's
        that kills them all once its last handle closes: when the setup ends,
        however it ends. What the step starts before it is put there (the
        moment after its creation) is not; venv and pip start nothing that
        soon. The lock goes with the setup: a next build finds it free only
        once the job has ended this one's steps."""
        child = subprocess.Popen(argv, stderr=subprocess.STDOUT, **kwargs)
        if self._job is None:
            self._job = _Job()
        self._job.assign(child)
        return child.wait()

    def end_children(self):
        """Nothing to do: the job ends them as the setup ends."""


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
            raise OSError(None, "a job object for the build's processes could not be made ({})".format(
                ctypes.FormatError(ctypes.get_last_error())))

    def assign(self, child):
        """Puts the child in the job; one that cannot be (gone already) is left to end as it does."""
        self._kernel32.AssignProcessToJobObject(self.handle, int(child._handle))


SYSTEM = Windows() if os.name == "nt" else MacOS() if sys.platform == "darwin" else Posix()
