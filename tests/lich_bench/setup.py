"""What the plugin's setup (hooks/lich_runtime.py) costs a session: CPU and wall time.

    python -m lich_bench.setup [--runs N] [--plugin DIR] [--python PYTHON] [--json FILE]

Each run is the setup's program as a relay runs it, with the interpreter a
relay would use (`python3` on PATH, or --python):
- **first session**: a data folder and a pip cache both new, as a person's
  first session inside lich meets them (pip's settings of this machine
  apply: its index, its proxy);
- **next session**: the same data folder again, its environment ready.

CPU is the user and system time of the setup and every process it waited
for (getrusage of the children), wall the time to its exit. --plugin names
another plugin folder to measure (a checkout of an older commit, to compare
with). Not part of make test (`make bench-setup`): it downloads packages.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def measure(argv: List[str], env: Dict[str, str]) -> Dict[str, object]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                          timeout=600)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    result = json.loads(done.stdout.splitlines()[-1]) if done.stdout.strip() else {}
    if done.returncode != 0 or not result.get("ok"):
        raise SystemExit("the setup failed: {}".format(result.get("error") or done.stderr.strip()))
    return {"wall_s": wall, "cpu_s": user + system, "user_s": user, "sys_s": system, "built": result["built"]}


def one_run(plugin: str, python: str, scratch: str) -> Dict[str, Dict[str, object]]:
    data = tempfile.mkdtemp(prefix="data-", dir=scratch)
    env = {name: value for name, value in os.environ.items() if not name.startswith(("LICH_", "CLAUDE_"))}
    env["PIP_CACHE_DIR"] = tempfile.mkdtemp(prefix="pip-cache-", dir=scratch)
    argv = [python, os.path.join(plugin, "hooks", "lich_runtime.py"), "--data", data]
    first = measure(argv, env)
    assert first["built"], "a new data folder's setup did not build"
    return {"first session": first, "next session": measure(argv, env)}


def load() -> float:
    return os.getloadavg()[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lich_bench.setup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--plugin", default=ROOT, help="the plugin folder whose setup runs (default: this checkout)")
    parser.add_argument("--python", default=shutil.which("python3") or sys.executable,
                        help="the interpreter that runs the setup (default: python3 on PATH)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)

    scratch = tempfile.mkdtemp(prefix="lich-bench-setup-")
    loads = [load()]
    runs = []
    try:
        for _ in range(args.runs):
            runs.append(one_run(os.path.abspath(args.plugin), args.python, scratch))
            loads.append(load())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    summary = {}
    print("{:<15} {:>10} {:>10} {:>10} {:>10}   (median of {}; min-max)".format(
        "setup", "cpu s", "user s", "sys s", "wall s", args.runs))
    for case in ("first session", "next session"):
        figures = {key: [run[case][key] for run in runs] for key in ("cpu_s", "user_s", "sys_s", "wall_s")}
        summary[case] = {key: {"median": statistics.median(v), "min": min(v), "max": max(v)} for key, v in figures.items()}
        print("{:<15} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f}   cpu {:.2f}-{:.2f}, wall {:.2f}-{:.2f}".format(
            case, *(summary[case][key]["median"] for key in ("cpu_s", "user_s", "sys_s", "wall_s")),
            min(figures["cpu_s"]), max(figures["cpu_s"]), min(figures["wall_s"]), max(figures["wall_s"])))
    machine = {"cpus": os.cpu_count(), "python": args.python, "platform": platform.platform(),
               "load_1min": {"min": min(loads), "max": max(loads)}}
    print("machine: {} cpus, 1-minute load {:.2f}-{:.2f} during the runs".format(
        machine["cpus"], machine["load_1min"]["min"], machine["load_1min"]["max"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "plugin": args.plugin, "summary": summary, "runs": runs}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
