"""How the bin/ tools start from the plugin's folder without installing:
in the daemon's interpreter (the one the relay named, else the plugin's
private environment), and with one line that says what to do when there
is none, or what the setup is doing.

    import lich_launch
    lich_launch.reexec(os.path.realpath(__file__))
    sys.exit(lich_launch.entry_point("lich-mod-status", "lich_control.status_cli")(...))

Standard library only, and syntax an old python3 still reads (lich_runtime.py says why).
"""
import glob
import importlib
import os
import sys
import time

from lich_children import lock_held
from lich_runtime import CURRENT, FAILURE, LOCK, RUNNING, read_json, retry_command
from lich_system import PLUGIN_ROOT, SYSTEM

# Where the relay puts the chosen interpreter for the session's own commands
# (bin/ on its PATH), and the guard that stops a tool re-running itself twice.
PYTHON_VARIABLE = "LICH_CONTROL_PYTHON"
REEXEC_GUARD = "LICH_CONTROL_REEXECUTED"
# What lich sets in a session it started; the daemon needs all three.
LICH_VARIABLES = ("LICH_PORT", "LICH_TOKEN", "LICH_SESSION_ID")


def inside_lich(environ=os.environ):
    """Whether lich started this session: each of its variables set. Read
    before anything that needs the environment, which outside lich is never built."""
    return all(environ.get(name) for name in LICH_VARIABLES)


def reexec(script, argv=None):
    """Runs `script` again under the daemon's interpreter, when that is not this one."""
    python = None if os.environ.get(REEXEC_GUARD) else chosen_python()
    # Not compared through symbolic links: an environment's python is one, to
    # the very interpreter that made it, and running it is what makes it that environment.
    if not python or os.path.abspath(python) == os.path.abspath(sys.executable):
        return
    os.environ[REEXEC_GUARD] = "1"
    SYSTEM.run_instead(python, [script] + list(sys.argv[1:] if argv is None else argv))


def chosen_python(environ=os.environ):
    """The interpreter the daemon runs with, as far as a tool can tell: the one
    the relay named for the session, else the newest private environment."""
    named = environ.get(PYTHON_VARIABLE)
    if named and os.path.exists(named):
        return named
    if sys.prefix != getattr(sys, "base_prefix", sys.prefix):
        return None  # run from a virtual environment: that one was chosen
    return private_python(environ)


def private_python(environ=os.environ):
    """The ready interpreter recorded in a data folder of this plugin, this
    folder's own first, then the newest."""
    found = []
    for folder in data_folders(environ):
        current = read_json(os.path.join(folder, CURRENT))
        python = current.get("python") if isinstance(current, dict) else None
        if python and os.path.exists(python):
            mtime = os.path.getmtime(os.path.join(folder, CURRENT))
            found.append((current.get("root") == PLUGIN_ROOT, mtime, python))
    return max(found)[2] if found else None


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


def clock(seconds):
    return time.strftime("%H:%M:%S", time.localtime(seconds if isinstance(seconds, (int, float)) else 0))


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
