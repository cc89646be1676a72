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

This file builds; beside it, lich_package.py says what the package is and
needs, lich_children.py runs the build's steps under the lock, and
lich_system.py holds what differs between POSIX and Windows. The bin/
tools start through lich_launch.py, which reads the records kept here.
Standard library only, and syntax an old python3 still reads, so that one
too old for the package is told so rather than failing to parse these files
(it is told before the first lock loads the daemon's lock module, which it may not read).
"""
import argparse
import glob
import json
import os
import shutil
import sys
import time

import lich_package as package
from lich_children import Lock, end_with_signals, imports_daemon, run_captured
from lich_system import PLUGIN_ROOT, SYSTEM

KEPT_ENVIRONMENTS = 2
STAMP = "lich-control-env.json"
CURRENT = "current.json"
FAILURE = "setup-failed.json"
RUNNING = "setup-running.json"
LOCK = "setup.lock"
LOG = "setup.log"
# The build's temporary files, its own and pip's (lich_children.run_captured says why).
SCRATCH = "tmp"
HERE = os.path.dirname(os.path.realpath(__file__))


class SetupFailed(Exception):
    """A problem a person can act on, said in one sentence; `short`, the same
    in few enough words for one line on a screen (no folders)."""

    def __init__(self, text, short=None):
        super().__init__(text)
        self.short = short or text


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
        try:  # before the lock: a Python too old for the package may not read the daemon's lock module either
            self.check_python()
        except SetupFailed as failure:
            self.remember_failure(key, failure)
            raise
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
        return Lock(self.path(LOCK), self.say)

    def ready(self, key):
        """The environment's interpreter when it was built whole for `key` and still runs."""
        env = self.env_dir(key)
        python = SYSTEM.env_python(env)
        stamp = read_json(os.path.join(env, STAMP))
        if not isinstance(stamp, dict) or stamp.get("key") != key or not os.path.exists(python):
            return None
        if not self.runs_daemon(python):
            self.say("the environment in {} no longer runs the daemon; building it again".format(env))
            return None
        return python

    def build(self, key):
        env = self.env_dir(key)
        # What a build cut short left: the lock, which its children held while
        # they lived, says nothing of it writes there any more.
        for scratch in glob.glob(self.path("build-*")) + [self.path(SCRATCH)]:
            shutil.rmtree(scratch, ignore_errors=True)
        if os.path.exists(env):  # no stamp
            shutil.rmtree(env)
        self.say("creating a virtual environment in {} with {} ({})".format(env, self.python, version_text()))
        self.create_venv(env)
        python = SYSTEM.env_python(env)
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
        if "No module named venv" in text or "ensurepip" in text:
            text, short = SYSTEM.NO_VENV
            raise SetupFailed(text.format(self.python), short)
        raise SetupFailed("{} -m venv failed: {}".format(self.python, package.last_line(text)))

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
                if code == 0 or not package.NO_PIP.search(text):
                    break
        if code != 0:
            problem = package.pip_problem(self.path(LOG))
            raise SetupFailed("pip could not install what lich-control needs into {}: {} (pip's output: {})".format(
                os.path.dirname(os.path.dirname(python)), problem, self.path(LOG)), "pip: " + problem)
        site = SYSTEM.env_site_packages(os.path.dirname(os.path.dirname(python)))
        for name in self.plugin.sources():
            if name.split(os.sep)[0] == package.PACKAGE_DIR:
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
        for interpreter in package.unique([self.python, package.base_python()]):
            yield [interpreter, "-m", "pip", "--python", python]
        for wheel in package.bundled_pips():
            yield [python, os.path.join(wheel, "pip")]
        code, text = self.run_captured([python, "-m", "ensurepip", "--default-pip"])
        if code != 0:
            raise SetupFailed("{} has no pip to install with, and cannot give a virtual environment one: its ensurepip "
                              "module is missing (on Debian and Ubuntu: apt install python3-venv)".format(self.python),
                              "python3 has no pip nor ensurepip (on Debian and Ubuntu: apt install python3-venv)")
        yield [python, "-m", "pip"]

    def run_captured(self, argv, **kwargs):
        """A step's exit code and its whole output; while this run builds, the step holds its lock."""
        hold = None if self.lock is None else self.lock.file.fileno()
        return run_captured(argv, self.path(SCRATCH), hold=hold, **kwargs)

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


def built_at(env):
    """When the environment was finished; 0 for one never finished."""
    try:
        return os.path.getmtime(os.path.join(env, STAMP))
    except OSError:
        return 0


def remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def version_text():
    return "{}.{}.{}".format(*sys.version_info[:3])


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
    """The command that builds the environment in `data`, as this system's shell takes it."""
    return SYSTEM.quote([sys.executable, os.path.join(HERE, "lich_runtime.py"), "--data", data])


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
    runtime = Runtime(data, package.Plugin(PLUGIN_ROOT), say, building=lambda env: tell({"building": env}))
    try:
        python, built = runtime.ensure()
    except SetupFailed as failure:
        return failed(str(failure), data, failure.short)
    except OSError as error:  # the data folder itself (unwritable, full), or no job object on Windows
        return failed("{}{}".format(error.strerror, " ({})".format(error.filename) if error.filename else ""), data)
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
