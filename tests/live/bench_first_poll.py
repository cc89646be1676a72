"""From launching Claude Code to the daemon's first poll, in a live session.

    PYTHONPATH=tests:tests/live python tests/live/bench_first_poll.py [--runs N] [--plugin DIR] [--json FILE]

The plugin installed as a person installs it (a marketplace, no python
option), sessions started as lich starts them (the pinned Claude Code under a
pseudo-terminal, the LICH_* variables of the development lich), with a
`python3` that has the standard library alone and pip's settings of this
machine. Each run measures:
- **first session**: the plugin's data folder and pip's cache both new, so
  the session sets up the daemon's Python first;
- **next session**: the environment ready.

The time is from just before the session's process starts to the moment the
daemon's first poll went out, which the daemon's own status gives (its age
of the last poll, read once its socket is there: lich holds that first poll
for 25 s, so it is still the last). Nothing polls the status meanwhile,
which would load the machine measured. --plugin installs another plugin
folder (a checkout of an older commit, to compare with) instead of this
checkout. `make bench-first-poll` runs it.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

from claude_world import World, claude_binary
from devlich import daemon_status, python
from processes import wait_until
from workspace import PLUGIN_NAME

MARKETPLACE = "lich-control"


def install(world: World, plugin: Optional[str]) -> None:
    if plugin is None:
        marketplace = world.ws.copy_checkout("marketplace")
    else:
        marketplace = shutil.copytree(plugin, world.ws.path("marketplace"))
    for args in (["plugin", "marketplace", "add", marketplace], ["plugin", "install", f"{PLUGIN_NAME}@{MARKETPLACE}"]):
        done = world.run(args)
        if done.returncode != 0:
            raise SystemExit(f"claude {' '.join(args)} failed: {done.stdout}{done.stderr}")


def session_env(bare: str, pip_cache: str) -> dict:
    env = {name: value for name, value in os.environ.items() if name.startswith("PIP_")}
    kept = [folder for folder in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
            if folder and not os.path.exists(os.path.join(folder, "lich-mod-status"))]
    env.update(PATH=os.pathsep.join([bare, *kept]), PIP_CACHE_DIR=pip_cache)
    return env


def first_poll(world: World, session_id: str, env: dict, timeout: float) -> float:
    """Seconds from launching the session to its daemon's first poll."""
    socket = os.path.join(world.ws.run_dir, f"{session_id}.sock")
    launched = time.monotonic()
    session = world.session(session_id, env=env)
    try:
        wait_until(lambda: os.path.exists(socket), timeout, f"the daemon's socket for {session_id}", interval=0.02)
        status = wait_until(lambda: daemon_status(world.ws.run_dir, session_id), 10, "its status",
                            holds=lambda s: s is not None and s["poll"]["last_poll_age_s"] is not None, interval=0.05)
        read = time.monotonic()
        return read - status["poll"]["last_poll_age_s"] - launched
    finally:
        session.exit()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="bench_first_poll.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--plugin", help="the plugin folder to install (default: a copy of this checkout)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    figures = {"first session": [], "next session": []}
    loads = [os.getloadavg()[0]]
    with World(claude_binary(), settings={}) as world:
        install(world, args.plugin)
        bare = world.ws.path("python3-without-lich-control")
        subprocess.run([python(), "-m", "venv", "--without-pip", bare], check=True, timeout=120)
        data = os.path.join(world.ws.home, ".claude", "plugins", "data", f"{PLUGIN_NAME}-{MARKETPLACE}")
        for n in range(args.runs):
            shutil.rmtree(data, ignore_errors=True)
            cache = tempfile.mkdtemp(prefix="pip-cache-", dir=world.ws.path("."))
            env = session_env(os.path.join(bare, "bin"), cache)
            figures["first session"].append(first_poll(world, f"first-{n}", env, timeout=120))
            figures["next session"].append(first_poll(world, f"next-{n}", env, timeout=60))
            loads.append(os.getloadavg()[0])

    print("{:<15} {:>10} {:>16}   (seconds from launching claude; median of {})".format(
        "session", "first poll", "min-max", args.runs))
    for case, seconds in figures.items():
        print("{:<15} {:>10.2f} {:>16}".format(case, statistics.median(seconds),
                                                "{:.2f}-{:.2f}".format(min(seconds), max(seconds))))
    print("machine: {} cpus, 1-minute load {:.2f}-{:.2f} during the runs".format(os.cpu_count(), min(loads), max(loads)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load_1min": [min(loads), max(loads)], "runs": figures}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
