"""The figures of a benchmark: each run's document reduced to medians, the
targets and the ratios to the floors, and the table that shows them."""
from __future__ import annotations

import os
import platform
import statistics
from typing import Dict, List, Optional

import attrs


def percentile(values: List[float], p: float) -> float:
    """Nearest rank: the smallest value with at least p % of the values at or below it."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


@attrs.frozen
class Figure:
    key: str  # a path into a run's document, or the idle/scale one
    label: str
    fmt: str
    target: Optional[float] = None
    at_most: bool = True  # the target is a ceiling (else a floor)
    reference: Optional[str] = None  # a same-run figure to divide by: the ratio
    ratio_target: Optional[float] = None  # when set, the verdict is on the ratio


RUN_FIGURES = [
    Figure("floor.requests.p50_ms", "floor: requests ack p50 (ms)", "{:.3f}"),
    Figure("floor.socket.p50_ms", "floor: socket trip p50 (ms)", "{:.3f}"),
    Figure("floor.sum_ms", "floor: sum of both (ms)", "{:.3f}"),
    Figure("dispatch_ms.p50", "dispatch p50 (ms)", "{:.3f}", 1.0),
    Figure("dispatch_ms.p90", "dispatch p90 (ms)", "{:.3f}"),
    Figure("dispatch_ms.p99", "dispatch p99 (ms)", "{:.3f}", 5.0),
    Figure("dispatch_ms.max", "dispatch max (ms)", "{:.3f}"),
    Figure("ack_ms.p50", "ack p50 (ms)", "{:.3f}", reference="floor.sum_ms", ratio_target=1.6),
    Figure("ack_ms.p99", "ack p99 (ms)", "{:.3f}", reference="floor.sum_ms"),
    Figure("burst.last_ack_s", "burst: last ack (s)", "{:.3f}"),
    Figure("burst.per_s", "burst: commands/s", "{:.0f}", 600, at_most=False, reference="floor.per_s"),
    Figure("burst.next_poll_ms", "burst: next poll out (ms)", "{:.1f}"),
    Figure("asks.wall_s", "asks: last ack (s)", "{:.3f}", 1.1),
]
ONCE_FIGURES = [
    Figure("idle.cpu_s", "idle: CPU s over window", "{:.3f}", 0.02),
    Figure("idle.rss_mb", "idle: RSS (MB)", "{:.1f}", 35.0),
    Figure("idle.threads", "idle: threads", "{:.0f}"),
    Figure("idle.threads_woken", "idle: threads woken", "{:.0f}"),
    Figure("idle.wakeups", "idle: wake-ups (ctxt sw.)", "{:.0f}"),
    Figure("idle.polls_in_window", "idle: polls in window", "{:.0f}"),
    Figure("scale.all_polling_s", "scale: all polling (s)", "{:.2f}"),
    Figure("scale.wall_s", "scale: last ack (s)", "{:.3f}"),
    Figure("scale.total_rss_mb", "scale: total RSS (MB)", "{:.0f}"),
    Figure("scale.total_pss_mb", "scale: total PSS (MB)", "{:.0f}"),
    Figure("scale.rss_per_daemon_mb", "scale: RSS/daemon (MB)", "{:.1f}", 35.0),
    Figure("scale.rss_max_mb", "scale: RSS max (MB)", "{:.1f}", 35.0),
]
STARTUP_TARGET_MS = 300.0


def dig(doc: dict, key: str):
    for part in key.split("."):
        doc = doc[part]
    return doc


def spread(values: List[float]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(runs: List[dict], once: dict) -> Dict[str, dict]:
    out: Dict[str, dict] = {}
    startups = [ms for run in runs for ms in run["startup_ms"]]
    out["startup.first_poll_ms"] = dict(spread(startups), label="startup: first poll (ms)", fmt="{:.1f}", target=STARTUP_TARGET_MS, at_most=True)
    for fig in RUN_FIGURES:
        entry = dict(spread([dig(run, fig.key) for run in runs]), label=fig.label, fmt=fig.fmt, target=fig.target, at_most=fig.at_most)
        if fig.reference is not None:
            ratios = [dig(run, fig.key) / dig(run, fig.reference) for run in runs if dig(run, fig.key) is not None]
            entry.update(ratio=statistics.median(ratios) if ratios else None, ratio_to=fig.reference, ratio_target=fig.ratio_target)
        out[fig.key] = entry
    for fig in ONCE_FIGURES:
        group, key = fig.key.split(".", 1)
        values = [dig(doc, key) for doc in once[group]]
        out[fig.key] = dict(spread(values), label=fig.label, fmt=fig.fmt, target=fig.target, at_most=fig.at_most)
    for entry in out.values():
        entry["met"] = verdict(entry)
    return out


def verdict(entry: dict) -> Optional[bool]:
    if entry.get("ratio_target") is not None:
        ratio = entry.get("ratio")
        return None if ratio is None else ratio <= entry["ratio_target"]
    target, value = entry["target"], entry["median"]
    if target is None or value is None:
        return None
    return value <= target if entry["at_most"] else value >= target


def flags(runs: List[dict], once: dict) -> Dict[str, Optional[bool]]:
    return {
        "burst_acks_in_order": all(run["burst"]["in_order"] for run in runs),
        "burst_next_poll_before_last_ack": all(
            run["burst"]["next_poll_ms"] is not None and run["burst"]["next_poll_ms"] < run["burst"]["last_ack_s"] * 1000 for run in runs
        ),
        "scale_all_acked_ok": all(doc["all_acked_ok"] for doc in once["scale"]) if once["scale"] else None,
    }


def table(summary: Dict[str, dict], checks: Dict[str, Optional[bool]], runs: int) -> str:
    lines = [
        f"lich-control benchmark: {runs} run(s); medians [min - max]",
        f"{'figure':<30} {'median':>10} {'[min - max]':>24} {'target':>10} {'ratio':>8}  verdict",
        "-" * 95,
    ]
    for entry in summary.values():
        fmt = entry["fmt"]
        show = (lambda v: "-" if v is None else fmt.format(v))
        rng = f"[{show(entry['min'])} - {show(entry['max'])}]"
        if entry.get("ratio_target") is not None:
            target = f"<= {entry['ratio_target']:g}x"
        else:
            target = "" if entry["target"] is None else ("<= " if entry["at_most"] else ">= ") + fmt.format(entry["target"])
        ratio = "" if entry.get("ratio") is None else f"{entry['ratio']:.2f}x"
        mark = {True: "met", False: "MISSED", None: ""}[entry["met"]]
        lines.append(f"{entry['label']:<30} {show(entry['median']):>10} {rng:>24} {target:>10} {ratio:>8}  {mark}")
    lines.append("-" * 95)
    for name, ok in checks.items():
        lines.append(f"{name.replace('_', ' '):<62} {'not run' if ok is None else 'yes' if ok else 'NO'}")
    lines.append(
        "ratios, to floors measured in the same run: ack latency in units of (a bare requests ack + a bare socket "
        "round trip); burst rate as a share of the rate those two allow back to back"
    )
    return "\n".join(lines)


def machine() -> dict:
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu": model,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
    }
