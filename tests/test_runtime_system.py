"""hooks/lich_system.py: what differs between POSIX and Windows, each
system's implementation tested wherever the suite runs."""
import os

from setup_plugin import ROOT

import lich_system  # noqa: I100 (from the hooks folder setup_plugin puts on the path)


def test_on_windows_a_command_is_quoted_as_cmd_reads_it():
    argv = [r"C:\Program Files\Python313\python.exe", r"C:\Users\Ann Lee\plugins\lich-control\hooks\lich_runtime.py",
            "--data", r"C:\Users\Ann Lee\plugins\data\lich-control"]
    assert lich_system.Windows().quote(argv) == (
        r'"C:\Program Files\Python313\python.exe" "C:\Users\Ann Lee\plugins\lich-control\hooks\lich_runtime.py" '
        r'--data "C:\Users\Ann Lee\plugins\data\lich-control"')


def test_on_posix_a_command_is_quoted_as_sh_reads_it():
    assert lich_system.Posix().quote(["/usr/bin/python3", "/home/ann/the plugin's folder/x.py"]) == (
        "/usr/bin/python3 '/home/ann/the plugin'\"'\"'s folder/x.py'")


def test_the_environments_interpreter_is_where_venv_puts_it_on_each_system():
    assert lich_system.Windows().env_python("env") == os.path.join("env", "Scripts", "python.exe")
    assert lich_system.Windows().env_site_packages("env") == os.path.join("env", "Lib", "site-packages")
    assert lich_system.Posix().env_python("env") == os.path.join("env", "bin", "python")


def test_the_lock_is_the_daemons_own_file_loaded_once():
    daemons = os.path.join(ROOT, "lich_control", "windows.py" if os.name == "nt" else "posix.py")
    assert os.path.samefile(lich_system.SYSTEM.lock().__file__, daemons)
    assert lich_system.SYSTEM.lock() is lich_system.SYSTEM.lock()


def test_on_macos_pip_caches_where_lichs_profile_lets_it_unless_named():
    env = {}
    lich_system.MacOS().pip_settings(env)
    assert env["PIP_CACHE_DIR"] == os.path.join(os.path.expanduser("~"), ".cache", "pip")
    for named in ({"PIP_CACHE_DIR": "/mine"}, {"PIP_NO_CACHE_DIR": "1"}):
        env = dict(named)
        lich_system.MacOS().pip_settings(env)
        assert env == named
    env = {}
    lich_system.Posix().pip_settings(env)
    assert env == {}
