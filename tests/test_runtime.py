"""hooks/lich_runtime.py: the private environment the relay runs the daemon from.

Its decisions (build, reuse, rebuild, remember a failure, take turns) run
against a plugin folder made here and a builder that writes a stand-in
environment; its program is run as the relay runs it, with a Python that
has no lich_control and a plugin folder that asks for more than it has.
"""
import concurrent.futures
import glob
import importlib.util
import json
import os
import subprocess
import sys
import threading

import pytest

from fakes import Clock
from setup_plugin import ROOT, SCRIPT, WINDOWS, copy_of_the_script, make_plugin, run_script, write

import lich_children  # noqa: I100 (from the hooks folder setup_plugin puts on the path)
import lich_package
import lich_runtime as runtime
from lich_system import SYSTEM

if not WINDOWS:
    import resource

HOUR = 3600


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
        write(SYSTEM.env_python(env), "")

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


def test_the_first_run_clears_what_a_build_cut_short_left_builds_and_the_next_reuses(plugin, data):
    env = os.path.join(data, "env-" + plugin.key())
    write(os.path.join(data, "build-k3j2h1", "lich-control", "setup.cfg"), "")
    write(os.path.join(env, "lib", "half-installed"), "")
    setup = StandIn(data, plugin)
    python, built = setup.ensure()
    assert (python, built) == (SYSTEM.env_python(env), True)
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
    monkeypatch.setattr(lich_package, "base_python", lambda: "/opt/python/bin/python3")
    monkeypatch.setattr(lich_package, "bundled_pips", lambda: ["/lib/ensurepip/_bundled/pip-24.0-py3-none-any.whl"])
    setup = Steps(os.path.dirname(env), plugin, {
        "/usr/bin/python3": (1, "/usr/bin/python3: No module named pip\n"),
        "/opt/python/bin/python3": (2, "Usage: ...\nno such option: --python\n"),
    })
    setup.install(SYSTEM.env_python(env))
    tail = ["install", "--disable-pip-version-check", "--no-input", "--progress-bar", "off", "attrs>=22.2", "requests>=2.28"]
    assert setup.ran == [
        ["/usr/bin/python3", "-m", "pip", "--python", SYSTEM.env_python(env)] + tail,
        ["/opt/python/bin/python3", "-m", "pip", "--python", SYSTEM.env_python(env)] + tail,
        [SYSTEM.env_python(env), os.path.join("/lib/ensurepip/_bundled/pip-24.0-py3-none-any.whl", "pip")] + tail,
    ]
    with open(os.path.join(SYSTEM.env_site_packages(env), "lich_control", "__init__.py")) as f:
        assert f.read() == "VALUE = 1\n"
    with open(os.path.join(os.path.dirname(env), runtime.LOG)) as f:
        assert "no such option: --python" in f.read()


def test_with_no_pip_anywhere_ensurepip_gives_the_environment_one(needing, monkeypatch):
    plugin, env = needing
    monkeypatch.setattr(lich_package, "base_python", lambda: "/usr/bin/python3")
    monkeypatch.setattr(lich_package, "bundled_pips", lambda: [])
    setup = Steps(os.path.dirname(env), plugin, {"/usr/bin/python3": (1, "No module named pip")})
    setup.install(SYSTEM.env_python(env))
    assert [argv[:3] for argv in setup.ran] == [
        ["/usr/bin/python3", "-m", "pip"], [SYSTEM.env_python(env), "-m", "ensurepip"], [SYSTEM.env_python(env), "-m", "pip"]]


def test_a_pip_that_fails_at_its_job_is_the_failure_and_no_other_is_tried(needing):
    plugin, env = needing
    setup = Steps(os.path.dirname(env), plugin, {"/usr/bin/python3": (
        1, "ERROR: No matching distribution found for attrs>=22.2\n")})
    with pytest.raises(runtime.SetupFailed, match="attrs>=22.2 is not on the package index") as failed:
        setup.install(SYSTEM.env_python(env))
    assert failed.value.short == "pip: attrs>=22.2 is not on the package index, or none there fits this Python"
    assert len(setup.ran) == 1


def test_a_real_build_of_a_package_that_needs_nothing_runs_no_pip_and_imports(tmp_path, data, monkeypatch):
    # A real venv, offline: the package's own files copied in are what makes it run.
    monkeypatch.setenv("PYTHONPATH", windows_build_env()["PYTHONPATH"])  # a venv where the Python has none
    plugin = make_plugin(str(tmp_path / "plugin"))
    write(os.path.join(plugin.root, "lich_control", "daemon.py"), "")
    setup = runtime.Runtime(data, plugin, lambda text: None)
    python, built = setup.ensure()
    assert built and lich_children.imports_daemon(python)
    assert not os.path.exists(os.path.join(os.path.dirname(os.path.dirname(python)), "bin", "pip"))


# --- the program, as a relay runs it -------------------------------------------


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
    assert sorted(os.listdir(data)) == [runtime.FAILURE]  # recorded, and no environment


def test_a_python_too_old_to_read_the_daemons_lock_is_told_it_is_too_old(tmp_path, data):
    # lich_control's lock modules need 3.7 (their annotations); a Python 3.6 reads the setup's own files.
    plugin = make_plugin(str(tmp_path / "plugin"), requires=">=99.0")
    for name in ("posix.py", "windows.py"):
        write(os.path.join(plugin.root, "lich_control", name), "this is no Python this interpreter reads\n")
    code, result, stderr = run_script(copy_of_the_script(plugin), "--data", data)
    assert code == 1 and result["problem"].endswith("and lich-control needs 99.0 or later"), stderr
    assert runtime.FAILURE in os.listdir(data)


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
    env = os.path.join(data, "env-" + lich_package.Plugin(ROOT).key())
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
    python = SYSTEM.env_python(env)
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


