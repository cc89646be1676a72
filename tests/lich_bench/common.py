"""What every part of the benchmark shares: one clock, one deadline, one error."""
from __future__ import annotations

import statistics
import time
from typing import Dict, List

# Every timestamp of a run comes from this one clock, in one process, so an
# enqueue and the moment its call line or its ack arrives are read side by side.
CLOCK = time.perf_counter
WAIT = 60.0  # the longest any one step may take before the run is called broken


class BenchError(Exception):
    """A scenario did not complete: the daemon missed a command or an ack."""


def floor_figures(took_ms: List[float]) -> Dict[str, float]:
    """A floor's round trips: the median, and the rate back to back."""
    return {"p50_ms": statistics.median(took_ms), "per_s": len(took_ms) / (sum(took_ms) / 1000)}
