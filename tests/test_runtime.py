"""hooks/lich_runtime.py: the private environment the relay runs the daemon from.

Its decisions (build, reuse, rebuild, remember a failure, take turns) run
against a plugin folder made here and a builder that writes a stand-in
environment; its program is run as the relay runs it, with a Python that
has no lich_control and a plugin folder that asks for more than it has.
"""
import concurrent.futures
import contextlib
import glob
import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading

import pytest

import lich_control
from fakes import Clock

WINDOWS = os.name == "nt"
if WINDOWS:
    import msvcrt

    from lich_control import windows
else:
    import fcntl
    import resource

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "hooks", "lich_runtime.py")

spec = importlib.util.spec_from_file_location("lich_runtime", SCRIPT)
runtime = importlib.util.module_from_spec(spec)
spec.loader.exec_module(runtime)

HOUR = 3600


def make_plugin(folder, version="0.1.0", requires=">=3.9", code="VALUE = 1\n"):
    """A plugin folder as far as the setup reads one."""
    write(os.path.join(folder, ".claude-plugin", "plugin.json"), json.dumps({"name": "lich-control", "version": version}))
    write(os.path.join(folder, "setup.cfg"), "[options]\npython_requires = {}\n".format(requires))
    write(os.path.join(folder, "lich_control", "__init__.py"), code)
    return runtime.Plugin(folder)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


class StandIn(runtime.Runtime):
    """Builds a stand-in environment (a file where the interpreter goes) and
    counts its builds; `fail_with` makes the next builds fail."""

    def __init__(self, data, plugin):
        self.said = []
        self.builds = 0
        self.fail_with = None
        self.broken = set()  # interpreters that no longer run the daemon
        super().__init__(data, plugin, self.said.append, now=Clock(1_800_000_000.0))

    def create_venv(self, env):
        self.builds += 1
        if self.fail_with:
            raise runtime.SetupFailed(self.fail_with)
        write(runtime.env_python(env), "")

    def install(self, python):
        pass

    def runs_daemon(self, python):
        return python not in self.broken


@pytest.fixture
def plugin(tmp_path):
    return make_plugin(str(tmp_path / "plugin"))


@pytest.fixture
def data(tmp_path):
    return str(tmp_path / "data")


def test_the_key_follows_the_package_and_the_version_not_the_rest_of_the_folder(plugin):
    first = plugin.key()
    assert first.startswith("0.1.0-")
    write(os.path.join(plugin.root, "docs", "install.md"), "edited\n")
    write(os.path.join(plugin.root, "README.md"), "edited\n")
    assert plugin.key() == first
    write(os.path.join(plugin.root, "lich_control", "__init__.py"), "VALUE = 2\n")
    assert plugin.key() != first
    make_plugin(plugin.root, version="0.2.0", code="VALUE = 2\n")
    assert plugin.key().startswith("0.2.0-")


def test_the_first_run_clears_what_a_build_cut_short_left_builds_and_the_next_reuses(plugin, data):
    env = os.path.join(data, "env-" + plugin.key())
    write(os.path.join(data, "build-k3j2h1", "lich-control", "setup.cfg"), "")
    write(os.path.join(env, "lib", "half-installed"), "")
    setup = StandIn(data, plugin)
    python, built = setup.ensure()
    assert (python, built) == (runtime.env_python(env), True)
    assert sorted(os.listdir(data)) == sorted([os.path.basename(env), runtime.CURRENT, runtime.LOCK])
    assert sorted(os.listdir(env)) == sorted(["Scripts" if WINDOWS else "bin", runtime.STAMP])
    assert setup.ensure() == (python, False)
    assert setup.builds == 1
    assert runtime.read_json(os.path.join(data, runtime.CURRENT)) == {"python": python, "key": plugin.key(), "root": plugin.root}


def test_a_new_release_builds_a_new_environment_and_keeps_one_before_it(plugin, data):
    envs = []
    for number, version in enumerate(["0.1.0", "0.2.0", "0.3.0"]):
        setup = StandIn(data, make_plugin(plugin.root, version=version))
        setup.ensure()
        envs.append("env-" + setup.plugin.key())
        os.utime(os.path.join(data, envs[-1], runtime.STAMP), (number * HOUR, number * HOUR))  # in build order
    assert sorted(os.listdir(data)) == sorted(envs[1:] + [runtime.CURRENT, runtime.LOCK])


def test_an_environment_that_no_longer_runs_the_daemon_is_built_again(plugin, data):
    setup = StandIn(data, plugin)
    setup.broken.add(setup.ensure()[0])
    with pytest.raises(runtime.SetupFailed, match="cannot import lich_control.daemon"):
        setup.ensure()  # rebuilt, and still broken: said so
    assert setup.builds == 2
    assert any("no longer runs the daemon; building it again" in line for line in setup.said)


def test_a_failure_is_recorded_each_run_tries_again_and_a_success_clears_the_record(plugin, data):
    setup = StandIn(data, plugin)
    setup.fail_with = "pip could not install what lich-control needs: the package index could not be reached"
    for _ in range(2):  # a session a minute later tries again, as the command the failure names does
        with pytest.raises(runtime.SetupFailed, match="^pip could not"):
            setup.ensure()
        setup.now.now += 60
    assert setup.builds == 2
    assert runtime.read_json(os.path.join(data, runtime.FAILURE)) == {
        "key": plugin.key(), "at": setup.now.now - 60, "error": setup.fail_with, "problem": setup.fail_with}
    setup.fail_with = None
    assert setup.ensure()[1] is True and setup.builds == 3
    assert sorted(os.listdir(data)) == sorted(["env-" + plugin.key(), runtime.CURRENT, runtime.LOCK])


def test_a_build_says_where_it_builds_and_records_that_it_runs_until_it_ends(plugin, data):
    seen = []
    setup = StandIn(data, plugin)
    setup.building = seen.append
    setup.install = lambda python: seen.append(runtime.read_json(os.path.join(data, runtime.RUNNING)))
    setup.ensure()
    assert seen == [os.path.join(data, "env-" + plugin.key()),
                    {"pid": os.getpid(), "started": setup.now.now, "key": plugin.key()}]
    assert not os.path.exists(os.path.join(data, runtime.RUNNING))
    setup.ensure()  # ready: nothing to tell
    assert len(seen) == 2


def test_two_runs_at_once_take_turns_and_the_second_uses_what_the_first_built(plugin, data):
    building = threading.Event()
    release = threading.Event()
    second_waits = threading.Event()

    first = StandIn(data, plugin)
    first.install = lambda python: (building.set(), release.wait(30))
    second = StandIn(data, plugin)
    second.say = lambda text: (second.said.append(text), second_waits.set())
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        built = pool.submit(first.ensure)
        assert building.wait(30)
        reused = pool.submit(second.ensure)
        assert second_waits.wait(30)
        assert second.said == ["another session is setting the environment up; waiting for it"]
        release.set()
        assert built.result(30)[1] is True
        assert reused.result(30) == (built.result()[0], False)


def test_a_run_that_waited_for_a_build_that_failed_answers_that_failure_without_building(plugin, data):
    building = threading.Event()
    release = threading.Event()
    second_waits = threading.Event()

    def fails_when_released(env):
        building.set()
        release.wait(30)
        raise runtime.SetupFailed("python3 has no venv module")

    first = StandIn(data, plugin)
    first.create_venv = fails_when_released
    second = StandIn(data, plugin)
    second.say = lambda text: second_waits.set()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        failed = pool.submit(first.ensure)
        assert building.wait(30)
        answered = pool.submit(second.ensure)
        assert second_waits.wait(30)
        release.set()
        with pytest.raises(runtime.SetupFailed, match="^python3 has no venv module$"):
            failed.result(30)
        with pytest.raises(runtime.SetupFailed, match="^python3 has no venv module$"):
            answered.result(30)
    assert second.builds == 0


@pytest.mark.parametrize("output, problem", [
    ("WARNING: Retrying (Retry(total=0)) after connection broken by 'NewConnectionError(...)'\n"
     "ERROR: No matching distribution found for attrs>=22.2\n",
     "the package index could not be reached"),
    ("ERROR: Could not find a version that satisfies the requirement setuptools>=61 (from versions: none)\n",
     "setuptools>=61 is not on the package index, or none there fits this Python"),
    ("Processing ./lich-control\nerror: [Errno 28] No space left on device\n",
     "error: [Errno 28] No space left on device"),
])
def test_pips_output_is_told_in_a_phrase(tmp_path, output, problem):
    log = tmp_path / "setup.log"
    log.write_text(output)
    assert runtime.pip_problem(str(log)) == problem


class Steps(runtime.Runtime):
    """Answers each step of an install from `answers` (argv[0] -> (code, output)) and records its argv."""

    def __init__(self, data, plugin, answers):
        super().__init__(data, plugin, lambda text: None, python="/usr/bin/python3")
        self.answers = answers
        self.ran = []

    def run_captured(self, argv, **kwargs):
        self.ran.append(argv)
        return self.answers.get(argv[0], (0, ""))


@pytest.fixture
def needing(tmp_path):
    """A plugin whose package needs two packages, and its environment's folder."""
    plugin = make_plugin(str(tmp_path / "plugin"))
    write(os.path.join(plugin.root, "setup.cfg"), "[options]\ninstall_requires =\n    attrs>=22.2\n    # for the poll\n    requests>=2.28\n")
    os.makedirs(str(tmp_path / "data"))
    return plugin, str(tmp_path / "data" / "env")


def test_the_install_runs_the_cheapest_pip_there_is_and_copies_the_package_in(needing, monkeypatch):
    plugin, env = needing
    monkeypatch.setattr(runtime, "base_python", lambda: "/opt/python/bin/python3")
    monkeypatch.setattr(runtime, "bundled_pips", lambda: ["/lib/ensurepip/_bundled/pip-24.0-py3-none-any.whl"])
    setup = Steps(os.path.dirname(env), plugin, {
        "/usr/bin/python3": (1, "/usr/bin/python3: No module named pip\n"),
        "/opt/python/bin/python3": (2, "Usage: ...\nno such option: --python\n"),
    })
    setup.install(runtime.env_python(env))
    tail = ["install", "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "attrs>=22.2", "requests>=2.28"]
    assert setup.ran == [
        ["/usr/bin/python3", "-m", "pip", "--python", runtime.env_python(env)] + tail,
        ["/opt/python/bin/python3", "-m", "pip", "--python", runtime.env_python(env)] + tail,
        [runtime.env_python(env), os.path.join("/lib/ensurepip/_bundled/pip-24.0-py3-none-any.whl", "pip")] + tail,
    ]
    with open(os.path.join(runtime.env_site_packages(env), "lich_control", "__init__.py")) as f:
        assert f.read() == "VALUE = 1\n"
    with open(os.path.join(os.path.dirname(env), runtime.LOG)) as f:
        assert "no such option: --python" in f.read()


def test_with_no_pip_anywhere_ensurepip_gives_the_environment_one(needing, monkeypatch):
    plugin, env = needing
    monkeypatch.setattr(runtime, "base_python", lambda: "/usr/bin/python3")
    monkeypatch.setattr(runtime, "bundled_pips", lambda: [])
    setup = Steps(os.path.dirname(env), plugin, {"/usr/bin/python3": (1, "No module named pip")})
    setup.install(runtime.env_python(env))
    assert [argv[:3] for argv in setup.ran] == [
        ["/usr/bin/python3", "-m", "pip"], [runtime.env_python(env), "-m", "ensurepip"], [runtime.env_python(env), "-m", "pip"]]


def test_a_pip_that_fails_at_its_job_is_the_failure_and_no_other_is_tried(needing):
    plugin, env = needing
    setup = Steps(os.path.dirname(env), plugin, {"/usr/bin/python3": (
        1, "ERROR: No matching distribution found for attrs>=22.2\n")})
    with pytest.raises(runtime.SetupFailed, match="attrs>=22.2 is not on the package index") as failed:
        setup.install(runtime.env_python(env))
    assert failed.value.short == "pip: attrs>=22.2 is not on the package index, or none there fits this Python"
    assert len(setup.ran) == 1


def test_a_real_build_of_a_package_that_needs_nothing_runs_no_pip_and_imports(tmp_path, data, monkeypatch):
    # A real venv, offline: the package's own files copied in are what makes it run.
    monkeypatch.setenv("PYTHONPATH", windows_build_env()["PYTHONPATH"])  # a venv where the Python has none
    plugin = make_plugin(str(tmp_path / "plugin"))
    write(os.path.join(plugin.root, "lich_control", "daemon.py"), "")
    setup = runtime.Runtime(data, plugin, lambda text: None)
    python, built = setup.ensure()
    assert built and runtime.imports_daemon(python)
    assert not os.path.exists(os.path.join(os.path.dirname(os.path.dirname(python)), "bin", "pip"))


# --- the build's children, when the setup ends mid-way -----------------------

# A setup in a process of its own, at one step of a build. The step starts
# a process of its own the way pip re-runs itself (__pip-runner__): one
# that holds neither the lock nor a death signal, and writes into the
# environment until it is ended. The step says both ids and its group's.
SETUP_AT_A_STEP = """
import os, sys
sys.path.insert(0, os.path.dirname(sys.argv[1]))
import lich_runtime as runtime
runtime.end_with_signals()
with runtime._Lock(sys.argv[2], print) as lock:
    runtime.run_child([sys.executable, "-c"] + sys.argv[3:], hold=lock.file.fileno())
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
        self.lock = os.path.join(data, runtime.LOCK)
        self.env = os.path.join(data, "env-0.1.0-0123456789ab")
        os.makedirs(self.env)
        self.process = subprocess.Popen(
            [sys.executable, "-c", SETUP_AT_A_STEP, SCRIPT, self.lock, STEP, self.env, WRITES],
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
            runtime.kill_group(self.group)
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


# --- the program, as a relay runs it -------------------------------------------


def copy_of_the_script(plugin):
    os.makedirs(os.path.join(plugin.root, "hooks"))
    return shutil.copy(SCRIPT, os.path.join(plugin.root, "hooks"))


def run_script(script, *args, env=None, preexec_fn=None):
    result = subprocess.run([sys.executable, script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, env=env, timeout=120, preexec_fn=preexec_fn)
    *told, last = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(set(line) == {"building"} for line in told), result.stdout
    return result.returncode, last, result.stderr


@pytest.fixture
def too_new(tmp_path):
    """The setup's program, in a plugin that needs a later Python than this one."""
    return copy_of_the_script(make_plugin(str(tmp_path / "plugin"), requires=">=99.0"))


def test_the_program_answers_a_failure_in_one_json_line_that_says_what_to_do(too_new, data):
    code, result, stderr = run_script(too_new, env=dict(os.environ, CLAUDE_PLUGIN_DATA=data))
    assert code == 1
    problem = "{} is Python {}, and lich-control needs 99.0 or later".format(sys.executable, runtime.version_text())
    assert result == {"ok": False, "problem": problem, "command": "{} {} --data {}".format(sys.executable, too_new, data),
                      "error": result["error"]}
    assert "\n" not in result["error"]
    assert result["error"].startswith("lich-control cannot set up its Python environment: {}. To try again: {} "
                                      .format(problem, result["command"]))
    assert "set the plugin's python option" in result["error"] and "docs/install.md" in result["error"]
    assert "Traceback" not in stderr
    assert sorted(os.listdir(data)) == [runtime.FAILURE, runtime.LOCK]  # recorded, and no environment


def test_the_command_a_failure_names_works_as_printed_in_a_shell(tmp_path):
    # Folders with a space and a quote in their names, as a person's home may have.
    plugin = make_plugin(str(tmp_path / "the plugin's folder"), requires=">=99.0")
    write(os.path.join(plugin.root, "lich_control", "daemon.py"), "")
    script = copy_of_the_script(plugin)
    data = str(tmp_path / "data folder")
    _, result, _ = run_script(script, "--data", data)
    make_plugin(plugin.root)  # the cause mended
    # /bin/sh, or on Windows cmd.exe, as a person's shell takes the line.
    done = subprocess.run(result["command"], shell=True, stdout=subprocess.PIPE, universal_newlines=True, timeout=120)
    answer = json.loads(done.stdout.splitlines()[-1])
    if importlib.util.find_spec("venv") is None:
        # The shell gave the setup its script and its data folder whole: it got as far as the venv this Python lacks.
        assert answer["problem"] == "python has no venv module (install Python from python.org)", answer
        assert runtime.FAILURE in os.listdir(data)
        return
    assert done.returncode == 0
    assert answer["ok"] is True


def test_the_program_with_no_data_folder_says_so_and_offers_no_retry(too_new):
    env = {name: value for name, value in os.environ.items() if name != "CLAUDE_PLUGIN_DATA"}
    _, result, _ = run_script(too_new, env=env)
    assert "it has no data folder to keep it in (--data DIR, or CLAUDE_PLUGIN_DATA" in result["error"]
    assert result["command"] is None and "To try again" not in result["error"]


def windows_build_env(**changes):
    """Our environment for a real build on Windows, with a venv and a pip
    where the interpreter lacks them, as python.org's embeddable package (the
    Windows Python CI runs under Wine) does: the stand-in venv in
    tests/windows (its docstring says what it makes), and the pip wheel that
    .ci/wine-setup keeps beside the interpreter."""
    paths = []
    if importlib.util.find_spec("venv") is None:
        paths.append(os.path.join(ROOT, "tests", "windows"))
    if importlib.util.find_spec("pip") is None:
        paths.extend(glob.glob(os.path.join(os.path.dirname(sys.executable), "pip-*.whl"))[:1])
    paths += [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
    env.update(changes)
    return env


@pytest.mark.skipif(not WINDOWS, reason="Windows's build (Scripts\\python.exe, an msvcrt lock, a job object); POSIX's is built above")
def test_on_windows_the_plugins_environment_is_built_from_the_index_reused_and_a_failed_build_tried_again(data):
    env = os.path.join(data, "env-" + runtime.Plugin(ROOT).key())
    python = os.path.join(env, "Scripts", "python.exe")
    # No index, and none of this machine's pip settings that could stand in for one.
    offline = windows_build_env(PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull)
    offline.pop("PIP_FIND_LINKS", None)
    code, result, _ = run_script(SCRIPT, "--data", data, env=offline)
    assert code == 1 and result["problem"].startswith("pip: "), result
    assert "is not on the package index" in result["problem"], result
    assert runtime.read_json(os.path.join(data, runtime.FAILURE))["problem"] == result["problem"]

    code, result, stderr = run_script(SCRIPT, "--data", data, env=windows_build_env())
    assert (code, result) == (0, {"ok": True, "python": python, "built": True}), stderr
    assert runtime.FAILURE not in os.listdir(data)
    # Isolated (-I): the package and what it needs come from the environment's own site-packages.
    found = subprocess.run([python, "-I", "-c", "import lich_control.daemon, requests, attrs, sys; "
                            "print(sys.prefix); print(lich_control.__file__); print(requests.__file__)"],
                           stdout=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert found.returncode == 0
    site = os.path.join(env, "Lib", "site-packages")
    # normcase: 3.9's site names the folder lib\site-packages, which is the same folder.
    assert [os.path.normcase(line) for line in found.stdout.splitlines()] == [os.path.normcase(path) for path in (
        env, os.path.join(site, "lich_control", "__init__.py"), os.path.join(site, "requests", "__init__.py"))]

    assert run_script(SCRIPT, "--data", data, env=windows_build_env())[:2] == (
        0, {"ok": True, "python": python, "built": False})


@pytest.fixture
def ready(tmp_path, data):
    """What a finished build leaves in `data`, its interpreter a stand-in that
    imports anything: the plugin, the setup's program in it, the interpreter."""
    plugin = make_plugin(os.path.realpath(str(tmp_path / "plugin")))
    env = os.path.join(data, "env-" + plugin.key())
    python = runtime.env_python(env)
    write(python, "#!/bin/sh\nexit 0\n")
    os.chmod(python, 0o755)
    write(os.path.join(env, runtime.STAMP), json.dumps({"key": plugin.key()}))
    yield plugin, copy_of_the_script(plugin), python
    os.chmod(data, 0o755)


def full_disk():
    """In the child: every write into a file fails (EFBIG past a size limit
    of 0, as ENOSPC does on a full disk); its pipes still carry its answer."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))


@pytest.mark.skipif(WINDOWS, reason="a full disk is RLIMIT_FSIZE and a read-only folder its mode: POSIX's")
@pytest.mark.parametrize("read_only, recorded", [
    pytest.param(False, True, id="full-recorded"),
    pytest.param(False, False, id="full-not-recorded"),
    pytest.param(True, False, id="read-only", marks=pytest.mark.skipif(not WINDOWS and os.geteuid() == 0, reason=(
        "root writes into a folder whatever its mode; CI runs the suite again as an unprivileged user"))),
])
def test_a_ready_environment_is_used_from_a_data_folder_it_cannot_write_into(ready, data, read_only, recorded):
    plugin, script, python = ready
    if recorded:  # as the run that built it left it
        write(os.path.join(data, runtime.CURRENT), json.dumps({"python": python, "key": plugin.key(), "root": plugin.root}))
    before = sorted(os.listdir(data))
    os.chmod(data, 0o555 if read_only else 0o755)
    code, result, stderr = run_script(script, "--data", data, preexec_fn=None if read_only else full_disk)
    assert (code, result) == (0, {"ok": True, "python": python, "built": False}), stderr
    assert sorted(os.listdir(data)) == before  # no lock file, no current.json.<pid>.tmp
    if not recorded:
        assert "could not record the environment in {}".format(os.path.join(data, runtime.CURRENT)) in stderr


# --- the bin/ tools ---------------------------------------------------------------


def test_a_tool_finds_the_private_environment_in_claude_codes_data_folders(tmp_path, monkeypatch):
    config = tmp_path / "claude"
    mine = config / "plugins" / "data" / "lich-control-lich-control"
    other = config / "plugins" / "data" / "lich-control-inline"
    for folder, python, root in [(mine, tmp_path / "a" / "python", runtime.PLUGIN_ROOT),
                                 (other, tmp_path / "b" / "python", "/elsewhere")]:
        write(str(python), "")
        write(str(folder / runtime.CURRENT), json.dumps({"python": str(python), "root": root}))
    os.utime(str(other / runtime.CURRENT), (2_000_000_000, 2_000_000_000))  # newer, but another folder's
    environ = {"CLAUDE_CONFIG_DIR": str(config)}
    assert runtime.private_python(environ) == str(tmp_path / "a" / "python")
    (tmp_path / "a" / "python").unlink()
    assert runtime.private_python(environ) == str(tmp_path / "b" / "python")
    assert runtime.private_python({"CLAUDE_CONFIG_DIR": str(tmp_path / "none")}) is None


def run_tool(tmp_path, tool, *args, **lich):
    """bin/`tool` in a shell with no environment built anywhere (no interpreter named, no data
    folder), started by a Python that cannot import attrs (-S), as the system's python3 is."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("LICH_", "CLAUDE_")) and name != runtime.REEXEC_GUARD}
    env.update(CLAUDE_CONFIG_DIR=str(tmp_path / "claude"), LICH_CONTROL_RUN_DIR=str(tmp_path / "run"), **lich)
    return subprocess.run([sys.executable, "-S", os.path.join(ROOT, "bin", tool), *args], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, env=env, timeout=60)


@pytest.fixture
def named(tmp_path):
    """An interpreter that has lich-control, as the relay names one."""
    if WINDOWS:  # a batch file, which Windows runs by its name as it runs a program
        named = tmp_path / "python.bat"
        named.write_text('@"{}" %*\n'.format(sys.executable))
        return str(named)
    named = tmp_path / "python"
    named.write_text('#!/bin/sh\nexec "{}" "$@"\n'.format(sys.executable))
    named.chmod(0o755)
    return str(named)


def test_a_tool_runs_in_the_interpreter_the_relay_named(tmp_path, named):
    result = run_tool(tmp_path, "lich-mod-status", "--json", LICH_CONTROL_PYTHON=named)
    assert json.loads(result.stdout) == {"run_dir": str(tmp_path / "run"), "daemons": [], "setups": []}, result.stderr


@pytest.mark.parametrize("option, said", [("--version", lich_control.__version__ + "\n"), ("--help", "usage: lich-mod-daemon")])
def test_the_daemon_outside_lich_answers_what_it_is_asked_about_itself(tmp_path, named, option, said):
    result = run_tool(tmp_path, "lich-mod-daemon", option, LICH_CONTROL_PYTHON=named)
    assert result.returncode == 0 and result.stdout.startswith(said), result.stderr


LICH = {"LICH_PORT": "4100", "LICH_TOKEN": "secret-token", "LICH_SESSION_ID": "card-1"}


@pytest.mark.parametrize("unset", sorted(LICH))
def test_the_daemon_outside_lich_with_no_environment_exits_0_and_says_nothing(tmp_path, unset):
    result = run_tool(tmp_path, "lich-mod-daemon", **dict(LICH, **{unset: ""}))
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


@pytest.mark.parametrize("tool", ["lich-mod-daemon", "lich-mod-status"])
def test_a_tool_with_no_environment_says_in_one_line_what_to_do(tmp_path, tool):
    result = run_tool(tmp_path, tool, **LICH)
    assert (result.returncode, result.stdout) == (1, "")
    [line] = result.stderr.splitlines()
    assert line.startswith(tool + ": lich-control's Python environment is not built yet (no attrs here)")
    assert "{} --data".format(SCRIPT) in line
    assert "secret-token" not in result.stderr


@pytest.fixture
def kept(tmp_path):
    """A data folder where Claude Code keeps one, as the bin/ tools look for it."""
    folder = tmp_path / "claude" / "plugins" / "data" / "lich-control-lich-control"
    folder.mkdir(parents=True)
    return str(folder)


def test_a_setup_is_told_as_running_while_its_lock_is_held_and_as_failed_with_the_command_after(kept, tmp_path):
    environ = {"CLAUDE_CONFIG_DIR": str(tmp_path / "claude")}
    write(os.path.join(kept, runtime.RUNNING), json.dumps({"pid": 4242, "started": 0, "key": "0.1.0-x"}))
    assert runtime.setup_states(environ) == []  # its build is gone: no lock held
    with runtime._Lock(os.path.join(kept, runtime.LOCK), print):
        [state] = runtime.setup_states(environ)
    assert (state["data"], state["state"]) == (kept, "running")
    line = state["text"]
    assert line.startswith("a setup of lich-control's Python environment is running in {} (since ".format(kept))
    assert line.endswith(", pid 4242); the daemon starts when it is done")
    write(os.path.join(kept, runtime.FAILURE), json.dumps({"key": "0.1.0-x", "at": 0, "error": "python3 has no venv module"}))
    [state] = runtime.setup_states(environ)
    assert state["state"] == "failed"
    line = state["text"]
    assert " failed at " in line
    assert line.endswith(": python3 has no venv module. To try again: " + runtime.retry_command(kept))


def test_the_status_tool_with_no_environment_says_a_setup_is_running(kept, tmp_path):
    write(os.path.join(kept, runtime.RUNNING), json.dumps({"pid": 4242, "started": 0, "key": "0.1.0-x"}))
    with runtime._Lock(os.path.join(kept, runtime.LOCK), print):
        result = run_tool(tmp_path, "lich-mod-status")
    assert result.returncode == 0
    assert result.stdout.startswith("a setup of lich-control's Python environment is running in ")


def test_the_status_tool_with_no_environment_names_the_failure_and_the_command(kept, tmp_path):
    write(os.path.join(kept, runtime.FAILURE), json.dumps({"key": "0.1.0-x", "at": 0, "error": "python3 has no venv module"}))
    result = run_tool(tmp_path, "lich-mod-status")
    assert result.returncode == 1
    [line] = result.stdout.splitlines()
    assert "failed at" in line and "python3 has no venv module" in line
    assert line.endswith("To try again: {} {} --data {}".format(sys.executable, SCRIPT, kept))


# --- Windows's ways ------------------------------------------------------------


def test_the_setups_lock_shuts_out_another_process_until_it_is_released(data):
    # flock on POSIX, msvcrt's byte lock on Windows: the status tool in another process sees a build running.
    os.makedirs(data, exist_ok=True)
    path = os.path.join(data, runtime.LOCK)
    probe = "import sys; sys.path.insert(0, sys.argv[1]); import lich_runtime; print(lich_runtime.lock_held(sys.argv[2]))"

    def held_elsewhere():
        return subprocess.run([sys.executable, "-c", probe, os.path.dirname(SCRIPT), path], stdout=subprocess.PIPE,
                              universal_newlines=True, timeout=60).stdout.strip()

    with runtime._Lock(path, print):
        assert held_elsewhere() == "True"
    assert held_elsewhere() == "False"


def test_on_windows_the_retry_command_is_quoted_as_cmd_reads_it(monkeypatch):
    monkeypatch.setattr(runtime, "WINDOWS", True)
    monkeypatch.setattr(runtime.sys, "executable", r"C:\Program Files\Python313\python.exe")
    monkeypatch.setattr(runtime, "HERE", r"C:\Users\Ann Lee\plugins\lich-control\hooks")
    script = os.path.join(runtime.HERE, "lich_runtime.py")
    assert runtime.retry_command(r"C:\Users\Ann Lee\plugins\data\lich-control") == (
        r'"C:\Program Files\Python313\python.exe" "{}" --data "C:\Users\Ann Lee\plugins\data\lich-control"'.format(script))


def test_the_environments_interpreter_is_where_venv_puts_it_on_each_system(monkeypatch):
    monkeypatch.setattr(runtime, "WINDOWS", True)
    assert runtime.env_python("env") == os.path.join("env", "Scripts", "python.exe")
    assert runtime.env_site_packages("env") == os.path.join("env", "Lib", "site-packages")
    monkeypatch.setattr(runtime, "WINDOWS", False)
    assert runtime.env_python("env") == os.path.join("env", "bin", "python")


# --- lich's macOS confinement: no /dev/null, no temporary folder -------------


@pytest.mark.skipif(WINDOWS, reason="the suite's Windows Python has lich_control on its path only, which -I leaves out; and no /dev/null")
def test_the_import_check_needs_no_dev_null(monkeypatch):
    # lich's macOS profile lets a session open no /dev/null for writing.
    monkeypatch.setattr(os, "devnull", os.path.join(ROOT, "no-such-folder", "null"))
    assert runtime.imports_daemon(sys.executable)


def test_a_steps_temporary_files_and_its_childrens_are_in_the_data_folder(data, plugin, monkeypatch):
    # lich's macOS profile lets a session write no temporary folder.
    monkeypatch.setattr(runtime.tempfile, "tempdir", os.path.join(ROOT, "no-such-folder"))
    setup = runtime.Runtime(data, plugin, lambda text: None)
    code, output = setup.run_captured([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"])
    assert (code, output.strip()) == (0, os.path.join(data, "tmp"))


def test_on_macos_pip_caches_where_lichs_profile_lets_it_unless_named(monkeypatch):
    monkeypatch.delenv("PIP_CACHE_DIR", raising=False)
    monkeypatch.delenv("PIP_NO_CACHE_DIR", raising=False)
    monkeypatch.setattr(runtime.sys, "platform", "darwin")
    assert runtime.child_env()["PIP_CACHE_DIR"] == os.path.join(os.path.expanduser("~"), ".cache", "pip")
    monkeypatch.setenv("PIP_CACHE_DIR", "/mine")
    assert runtime.child_env()["PIP_CACHE_DIR"] == "/mine"
    monkeypatch.delenv("PIP_CACHE_DIR")
    monkeypatch.setattr(runtime.sys, "platform", "linux")
    assert "PIP_CACHE_DIR" not in runtime.child_env()
