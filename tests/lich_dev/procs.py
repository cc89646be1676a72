"""Child processes of the tools and the tests: the environment a daemon is
started with, and the one way to stop a child.

    env = daemon_env(LICH_PORT="4312", LICH_TOKEN=token, LICH_SESSION_ID="s1")
    proc = subprocess.Popen([sys.executable, "-m", "lich_control"], cwd=ROOT, env=env, ...)
    code = stop(proc)        # SIGTERM, a bounded wait, then SIGKILL

The demo, the benchmark and the tests import this; the daemon never does.
"""
from __future__ import annotations

import os
import subprocess
from typing import Dict, Optional

# The folder that holds the lich_control package: a child runs from the
# checkout, whatever is installed; the tools (lich_dev, lich_bench) are in
# TOOLS beside the tests, never in what the plugin installs.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(ROOT, "tests")

STOP_GRACE = 5.0


def daemon_env(**lich: str) -> Dict[str, str]:
    """This process's environment without any `LICH_*` of its own, plus
    `lich`, with the package importable from the checkout.

    Scrubbed, because a tool run inside a lich session inherits that
    session's LICH_PORT, LICH_TOKEN and LICH_SESSION_ID: a child must see
    only the lich it was given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LICH_")}
    env.update(lich)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, TOOLS, env.get("PYTHONPATH", "")])
    return env


def stop(proc: "subprocess.Popen", grace: float = STOP_GRACE) -> Optional[int]:
    """End a child: SIGTERM, up to `grace` seconds for it to finish its way
    out, then SIGKILL. Its exit status (negative: the signal that ended it);
    None only if even SIGKILL did not end it within `grace`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            return proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        return None
