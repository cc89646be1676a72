"""lich-mod-status: what this user's daemons are doing, from their `GET /v1/status`.

    lich-mod-status [--json]            one line per daemon in the run folder
    lich-mod-status SESSION [--json]    everything one daemon tells

Exit 0 when it could say what each daemon is doing, none included; 1 when
the SESSION asked for has no daemon that answers, the run folder is
refused, or the plugin's setup failed. What it shows: docs/status.md.

A document is printed as the daemon gave it: the daemon made every string
in it safe as it entered. One this command cannot read is reported on its
daemon's row, never a crash that hides the others; `--json` is ASCII JSON
(json.dumps' default): any locale prints it, and a lone surrogate is the
escape that reads back as it.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import stat
import sys
from typing import Callable, List, Optional

import attrs

from . import __version__, run_folder
from .config import ADDRESS, BadConfig, run_dir, session_path
from .bridge_server import DaemonConnection, read_address

TIMEOUT = 2.0
NARROWEST = 4  # a column is never cut narrower than this
# What a document this command cannot read raises as it is formatted.
READ_FAULTS = (LookupError, TypeError, ValueError, AttributeError)


@attrs.frozen
class Found:
    """One socket in the run folder: its daemon's status, or why none answered."""

    socket: str
    status: Optional[dict] = None
    stale: Optional[str] = None

    @property
    def session(self) -> str:
        named = self.status["daemon"].get("session_id") if self.status is not None else None
        return named if isinstance(named, str) else os.path.splitext(os.path.basename(self.socket))[0]

    def to_json(self) -> dict:
        return {"socket": self.socket, "session_id": self.session, "status": self.status, "stale": self.stale}


def ask(path: str, timeout: float = TIMEOUT) -> Found:
    try:
        address = read_address(path)
    except FileNotFoundError:
        return Found(path, stale="stale socket: nothing answers")
    except (OSError, ValueError, LookupError, TypeError) as exc:
        return Found(path, stale=f"its address file cannot be read ({type(exc).__name__})")
    conn = DaemonConnection(address, timeout)
    try:
        status, body = conn.exchange("GET", "/v1/status")
    except (ConnectionRefusedError, FileNotFoundError):
        return Found(path, stale="stale socket: nothing answers")
    except socket.timeout:
        return Found(path, stale=f"stale socket: no answer within {timeout:g} s")
    except (OSError, http.client.HTTPException) as exc:
        return Found(path, stale=f"stale socket: {type(exc).__name__}")
    finally:
        conn.close()
    if status != 200:
        return Found(path, stale=f"the socket answered {status}")
    try:
        doc = json.loads(body)
    except ValueError:
        return Found(path, stale="the socket answered with something that is not JSON")
    if not isinstance(doc, dict) or not isinstance(doc.get("daemon"), dict) or not isinstance(doc.get("poll"), dict):
        return Found(path, stale="the socket answered with something that is not a daemon's status")
    return Found(path, status=doc)


def sockets(folder: str) -> List[str]:
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(folder, name)
        try:
            if name.endswith(f".{ADDRESS}") and (ADDRESS != "sock" or stat.S_ISSOCK(os.lstat(path).st_mode)):
                found.append(path)
        except OSError:
            continue  # removed while we looked
    return found


def age(seconds: Optional[float], suffix: str = " ago") -> str:
    if seconds is None:
        return "never"
    if seconds < 10:
        return f"{seconds:.1f} s{suffix}"
    if seconds < 90:
        return f"{seconds:.0f} s{suffix}"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min{suffix}"
    return f"{seconds / 3600:.1f} h{suffix}"


def state(status: dict) -> str:
    poll = status["poll"]
    if poll["state"] == "backing off":
        return f"backing off {poll['backoff']:g} s"
    if poll["state"] == "stopped":
        return f"stopped: {poll['reason']}"
    return poll["state"]


def overrides(status: dict) -> str:
    chosen = [f"{k}={v}" for k, v in status["overrides"].items() if v is not None]
    return " ".join(chosen) or "-"


def counts(status: dict) -> str:
    parts = [f"{kind} {c['ok']}/{c['failed']}" for kind, c in sorted(status["counts"].items())]
    return " ".join(parts) or "-"


@attrs.frozen
class Paint:
    """ANSI colour on a terminal, plain text elsewhere (and under NO_COLOR)."""

    CODES = {"green": "32", "yellow": "33", "red": "31", "bold": "1"}
    enabled: bool

    def __call__(self, text: str, colour: str) -> str:
        return f"\033[{self.CODES[colour]}m{text}\033[0m" if self.enabled else text

    def state(self, text: str) -> str:
        colour = "green" if text == "polling" else "yellow" if text.startswith("backing") else "red"
        return self(text, colour)


def table(rows: List[List[str]], paint: Paint, coloured_column: Optional[int] = None, room: int = 0) -> List[str]:
    """Aligned columns cut to fit `room` (see fit), a cut cell ending in `…`;
    padding is measured before any colour is added."""
    widths = fit([max(len(row[i]) for row in rows) for i in range(len(rows[0]))], room)
    lines = []
    for n, row in enumerate(rows):
        cells = []
        for i, cell in enumerate(row):
            cell = cell if len(cell) <= widths[i] else cell[: widths[i] - 1] + "…"
            padded = cell.ljust(widths[i]) if i < len(row) - 1 else cell
            if n > 0 and i == coloured_column:
                padded = padded.replace(cell, paint.state(cell), 1)
            cells.append(padded)
        lines.append("  ".join(cells).rstrip())
    lines[0] = paint(lines[0], "bold")
    return lines


def fit(widths: List[int], room: int) -> List[int]:
    """Column widths whose sum, with two spaces between columns, fits in `room`
    (0: any): the widest is cut first."""
    while room and sum(widths) + 2 * (len(widths) - 1) > room and max(widths) > NARROWEST:
        widths[widths.index(max(widths))] -= 1
    return widths


def overview(found: List[Found], paint: Paint, room: int = 0) -> List[str]:
    rows = [["SESSION", "PID", "STATE", "LAST POLL", "TURN", "OVERRIDES", "IN FLIGHT", "DONE (ok/failed)", "UPTIME"]]
    for f in found:
        try:
            cells = summary(f.status) if f.status is not None else ["-", f.stale] + ["-"] * 6
        except READ_FAULTS as exc:
            cells = ["-", unreadable(exc)] + ["-"] * 6
        rows.append([f.session] + cells)
    return table(rows, paint, coloured_column=2, room=room)


def summary(s: dict) -> List[str]:
    return [
        str(s["daemon"]["pid"]),
        state(s),
        age(s["poll"].get("last_poll_age_s")),
        s["turn"] or "-",
        overrides(s),
        ", ".join(f"{e['kind']} {e['id']} ({e['waiting_on']})" for e in s["in_flight"]) or "-",
        counts(s),
        age(s["daemon"]["uptime_s"], ""),
    ]


def unreadable(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"its status has no {exc.args[0]!r}"
    return f"its status cannot be read ({type(exc).__name__})"


def detail(f: Found, paint: Paint) -> List[str]:
    s = f.status
    d, poll = s["daemon"], s["poll"]
    why = f" ({poll['reason']})" if poll["state"] == "backing off" and poll["reason"] else ""
    retry = f", next poll in {poll['retry_in_s']:g} s" if poll.get("retry_in_s") is not None else ""
    fields = [
        ["session", d["session_id"]],
        ["pid", f"{d['pid']} ({d['engine']} engine{' in ' + d['host'] if d.get('host') else ''}, version {d['version']}, contract {d.get('contract_release', '?')})"],
        ["state", paint.state(state(s) + why + retry)],
        ["last poll", f"sent {age(poll.get('last_poll_age_s'))}, last answered {age(poll['last_answer_age_s'])} ({poll['polls']} polls, {poll['failures']} failed)"],
        ["turn", s["turn"] or "none running"],
        ["overrides", overrides(s)],
        ["in flight", "; ".join(f"{e['kind']} {e['id']} waiting on {e['waiting_on']} for {age(e['age_s'], '')}" for e in s["in_flight"]) or "-"],
        ["done", counts(s) + "  (ok/failed per kind)"],
        ["uptime", age(d["uptime_s"], "")],
        ["socket", d.get("socket", f.socket)],
        ["log", d.get("log_file") or "-"],
    ]
    rows = [["ID", "KIND", "OUTCOME", "TOOK", "WHEN"]] + [recent_row(r) for r in reversed(s["recent"][-10:])]
    lines = [f"{paint(name.ljust(12), 'bold')}{value}" for name, value in fields]
    lines += ["", paint("recent commands", "bold")]
    lines += ["  " + line for line in table(rows, paint)] if s["recent"] else ["  none yet"]
    lines += ["", paint("last errors", "bold")]
    lines += [f"  {age(e['age_s']).ljust(12)}{e['what']}" for e in reversed(s["errors"][-5:])] or ["  none"]
    return lines


def recent_row(r: dict) -> List[str]:
    outcome = "ok" if r["ok"] else f"failed: {r['error']}"
    took = "-" if r["took_ms"] is None else f"{r['took_ms']:g} ms"
    return [r["id"], r["kind"], outcome if r["ack"] == "sent" else f"{outcome} (ack not delivered)", took, age(r["age_s"])]


def main(argv=None, setups: Callable[[], List[dict]] = lambda: []) -> int:
    """`setups`: what the plugin's setups are doing (bin/lich-mod-status passes hooks/lich_launch.setup_states)."""
    parser = argparse.ArgumentParser(prog="lich-mod-status", description="What this user's lich-mod-daemons are doing.")
    parser.add_argument("session", nargs="?", help="show everything about this session's daemon")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument("--version", action="version", version=__version__)
    args = parser.parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")  # a terminal that cannot show a character
    folder = run_dir(os.environ)
    paint = Paint(sys.stdout.isatty() and not os.environ.get("NO_COLOR"))
    try:
        if os.path.lexists(folder):
            # The daemon's own test: in a folder another user could write
            # in, any socket could be theirs, and so could what it answers.
            run_folder.check(folder)
    except BadConfig as exc:
        return _said(str(exc))

    if args.session is not None:
        path = session_path(folder, args.session, ADDRESS)
        if not os.path.exists(path):
            if args.json:
                print(json.dumps({"session_id": args.session, "socket": path, "status": None, "stale": "no socket"}))
            return _said(f"no daemon for session {args.session} (no {path})")
        found = ask(path)
        if args.json:
            print(json.dumps(found.to_json()))
        if found.status is None:
            return _said(f"session {args.session}: {found.stale} ({path})")
        if not args.json:
            try:
                print("\n".join(detail(found, paint)))
            except READ_FAULTS as exc:
                return _said(f"session {args.session}: {unreadable(exc)} ({path})")
        return 0

    everything = [ask(path) for path in sockets(folder)]
    everything.sort(key=lambda f: f.session)  # always a string: a document's own, or the socket's name
    building = setups()
    failed = 1 if any(setup["state"] == "failed" for setup in building) else 0
    if args.json:
        print(json.dumps({"run_dir": folder, "daemons": [f.to_json() for f in everything], "setups": building}))
        return failed
    if everything:
        # Off a terminal (a pipe, a file) nothing is cut, unless COLUMNS says how wide.
        print("\n".join(overview(everything, paint, room=shutil.get_terminal_size((0, 0)).columns)))
    if not any(f.status is not None for f in everything):
        print(f"no daemon is running: none answers in {folder}")
    for setup in building:
        print(setup["text"])
    return failed


def _said(problem: str) -> int:
    print(f"lich-mod-status: {problem}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
