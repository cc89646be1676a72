"""The plugin folder the setup's tests build, and its setup run as a relay runs it.

The hooks folder goes on the path, as bin/ and the setup itself put it:
its modules import each other by name.
"""
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOOKS = os.path.join(ROOT, "hooks")
SCRIPT = os.path.join(HOOKS, "lich_runtime.py")
WINDOWS = os.name == "nt"
sys.path.insert(0, HOOKS)

import lich_package  # noqa: E402


def make_plugin(folder, version="0.1.0", requires=">=3.9", code="VALUE = 1\n"):
    """A plugin folder as far as the setup reads one, with the daemon's lock modules, which it loads."""
    write(os.path.join(folder, ".claude-plugin", "plugin.json"), json.dumps({"name": "lich-control", "version": version}))
    write(os.path.join(folder, "setup.cfg"), "[options]\npython_requires = {}\n".format(requires))
    write(os.path.join(folder, "lich_control", "__init__.py"), code)
    for name in ("posix.py", "windows.py"):
        shutil.copy(os.path.join(ROOT, "lich_control", name), os.path.join(folder, "lich_control", name))
    return lich_package.Plugin(folder)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def copy_of_the_script(plugin):
    """The setup's files in `plugin`'s hooks folder; the program's path."""
    os.makedirs(os.path.join(plugin.root, "hooks"))
    for name in os.listdir(HOOKS):
        if name.endswith(".py"):
            shutil.copy(os.path.join(HOOKS, name), os.path.join(plugin.root, "hooks"))
    return os.path.join(plugin.root, "hooks", "lich_runtime.py")


def run_script(script, *args, env=None, preexec_fn=None):
    result = subprocess.run([sys.executable, script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            universal_newlines=True, env=env, timeout=120, preexec_fn=preexec_fn)
    *told, last = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(set(line) == {"building"} for line in told), result.stdout
    return result.returncode, last, result.stderr

