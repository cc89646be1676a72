"""The layout the architecture page describes: the daemon imports none of the
tools (they live beside the tests, out of what the plugin installs), no
module carries an HTTP parser of its own, no import cycle runs anywhere, and
the status command and each hook stay short enough to read alone."""
import ast
import graphlib
import os
import re
import subprocess
import sys

from lich_dev import procs
from lich_dev.procs import ROOT

TOOLS = ("lich_dev", "lich_bench")
# Each package, and the folder its dotted names are counted from.
PACKAGES = {"lich_control": ROOT, "lich_dev": os.path.join(ROOT, "tests"), "lich_bench": os.path.join(ROOT, "tests")}


def package_modules():
    """{dotted name: file} for every module of the daemon and the tools, packages included."""
    found = {}
    for package, base in PACKAGES.items():
        for folder, _, names in os.walk(os.path.join(base, package)):
            for name in names:
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    dotted = os.path.relpath(path, base)[:-3].replace(os.sep, ".")
                    found[dotted.removesuffix(".__init__")] = path
    return found


def imports_of(name, path, modules):
    """The package's modules that `name` imports, at its top or inside a
    function alike: `from . import x` names the module x where there is one."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in modules and target != name)
    return found


def import_graph():
    modules = package_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def modules_loaded_by(statement):
    code = f"import sys; {statement}; print('\\n'.join(sorted(m for m in sys.modules if m.startswith(('lich_control', 'requests')))))"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=procs.daemon_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


# -- what imports what -----------------------------------------------------------------


def test_no_module_of_the_daemon_names_a_tool():
    # Read from the source, so an import inside a function counts too.
    reaching = {
        (name, target)
        for name, targets in import_graph().items()
        if not name.startswith(TOOLS)
        for target in targets
        if target.startswith(TOOLS)
    }
    assert reaching == set()
    assert ("lich_dev.sim", "lich_control.daemon") in {(n, t) for n, ts in import_graph().items() for t in ts}


def test_the_development_tools_import_nothing_of_the_benchmark():
    graph = import_graph()
    assert [(n, t) for n, ts in graph.items() if n.startswith("lich_dev") for t in ts if t.startswith("lich_bench")] == []


def test_lich_mod_status_does_without_requests():
    # Only the daemon talks to lich: the status command pays no ~70 ms import for it.
    assert "requests" not in modules_loaded_by("import lich_control.status_cli")


def test_no_import_cycle_anywhere_in_the_package():
    graph = import_graph()
    assert "lich_dev.lich" in graph["lich_dev.demo"]  # the graph sees relative imports
    graphlib.TopologicalSorter(graph).prepare()  # a CycleError names the modules that import each other round


# -- each file ----------------------------------------------------------------------------


def test_no_module_of_the_package_parses_http_by_hand():
    # A chunk size read in hex, or a status line taken apart: a library's job.
    hand_parsing = re.compile(r"\bint\(.*,\s*16\)|startswith\(b[\"']HTTP/1\.")
    found = [path for path in package_modules().values() if hand_parsing.search(open(path, encoding="utf-8").read())]
    assert found == []


def test_only_the_platform_seam_asks_which_system_it_runs_on():
    # system.py picks posix.py or windows.py once; every other module calls `native`.
    asks = re.compile(r"os\.name|sys\.platform|\bWINDOWS\b|IS_WINDOWS")
    folder = os.path.join(ROOT, "lich_control")
    found = sorted(name for name in os.listdir(folder) if name.endswith(".py") and asks.search(open(os.path.join(folder, name), encoding="utf-8").read()))
    assert found == ["system.py"]


def test_no_module_of_the_package_orders_its_imports_around_code():
    # Start-up work that must come first is __main__.py's, inside its main.
    folder = os.path.join(ROOT, "lich_control")
    found = sorted(name for name in os.listdir(folder) if name.endswith(".py") and "noqa: E402" in open(os.path.join(folder, name), encoding="utf-8").read())
    assert found == []



def lines_in(path):
    with open(path, encoding="utf-8") as file:
        return sum(1 for _ in file)


def test_the_status_command_and_each_hook_stay_readable_alone():
    # Each read in one sitting: the status command at most 300 lines, a hook 400.
    assert lines_in(os.path.join(ROOT, "lich_control", "status_cli.py")) <= 300
    hooks = [os.path.join(folder, name) for folder, _, names in os.walk(os.path.join(ROOT, "hooks")) for name in names if name.endswith((".py", ".js"))]
    assert len(hooks) > 5 and {path: lines_in(path) for path in hooks if lines_in(path) > 400} == {}
