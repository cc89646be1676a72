"""What every part of the benchmark shares: one clock, one deadline, one error."""
from __future__ import annotations

import os
import statistics
import time
from typing import Dict, List

# Every timestamp of a run comes from this one clock, in one process, so an
# enqueue and the moment its call line or its ack arrives are read side by side.
CLOCK = time.perf_counter
# The folder that holds the lich_control package.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WAIT = 60.0  # the longest any one step may take before the run is called broken


class BenchError(Exception):
    """A scenario did not complete: the daemon missed a command or an ack."""


def daemon_env(**lich: str) -> dict:
    """This process's environment without any LICH_* of its own, plus `lich`,
    with the package importable from the checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LICH_")}
    env.update(lich)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def floor_figures(took_ms: List[float]) -> Dict[str, float]:
    """A floor's round trips: the median, and the rate back to back."""
    return {"p50_ms": statistics.median(took_ms), "per_s": len(took_ms) / (sum(took_ms) / 1000)}
