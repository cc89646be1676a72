"""lich-stub's command line: `serve` runs a StubLich, `control` and `ask` drive one.

`serve` writes `lich-stub.json` (port, token, pid; mode 0600) in the run
folder (`config.run_dir`'s rules) and removes it when it stops; `control`
and `ask` read it, so the token need not cross argv or a terminal (`--token`
is there for a stub started elsewhere, and puts it on the command line). They
queue one command through the stub's `/stub/control`, which answers once
the command is acked or the time is up, and print what became of it.

`--port`, `--token`, `--timeout` and `--json` are taken wherever they are
written: before the verb, after it, or after the command's words.
"""
from __future__ import annotations

import argparse
import http.client
import json
import logging
import os
import signal
import sys
import threading
from typing import Optional
from urllib.parse import quote

import attrs

from lich_control import __version__
from lich_control.config import BadConfig, run_dir
from lich_control.run_folder import ensure as ensure_run_dir
from .control import DEFAULT_TIMEOUT
from .lich import HOLD_SECONDS, StubLich
from .state import DELIVERED, DROPPED, ENDED, Outcome

RUNTIME_NAME = "lich-stub.json"


class Failed(Exception):
    """One line for stderr, after `lich-stub: `."""


@attrs.frozen
class Target:
    port: int
    token: str = attrs.field(repr=False)


def runtime_path(env=os.environ) -> str:
    return os.path.join(run_dir(env), RUNTIME_NAME)


def write_runtime(path: str, port: int, token: str) -> None:
    """Written 0600 from the first byte, then renamed into place."""
    ensure_run_dir(os.path.dirname(path))
    temp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"port": port, "token": token, "pid": os.getpid()}, out)
    os.replace(temp, path)


def remove_runtime(path: str) -> None:
    """Remove the file only if it is still this process's."""
    try:
        with open(path) as f:
            if json.load(f).get("pid") != os.getpid():
                return
        os.unlink(path)
    except (OSError, ValueError):
        pass


def _alive(pid) -> bool:
    try:
        if os.name == "nt":  # os.kill(pid, 0) there is TerminateProcess
            from lich_control import windows

            return not windows.Process(int(pid)).ended(0)
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError):
        return False
    return True


def find_target(port: Optional[int], token: Optional[str], path: Optional[str] = None) -> Target:
    if port is not None and token is not None:
        return Target(port, token)
    path = path or runtime_path()
    try:
        with open(path) as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise Failed(f"no lich-stub serve is running (no {path}); start one, or pass --port and --token") from None
    except (OSError, ValueError) as exc:
        raise Failed(f"cannot read {path} ({type(exc).__name__}); pass --port and --token") from None
    if not _alive(doc.get("pid")):
        raise Failed(f"the lich-stub serve that wrote {path} (pid {doc.get('pid')}) is gone; start one again")
    if port is not None and port != doc.get("port"):
        raise Failed(f"the running lich-stub serve listens on port {doc.get('port')}, not {port}; pass --token for that one")
    return Target(int(doc["port"]), token or doc["token"])


def control(target: Target, session_id: str, command: dict, timeout: float) -> Outcome:
    """Queue one command on a running stub and wait for what becomes of it."""
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=timeout + 10)
    body = json.dumps({"session_id": session_id, "command": command, "timeout": timeout}).encode()
    try:
        conn.request("POST", f"/stub/control?token={quote(target.token, safe='')}", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
    except ConnectionRefusedError:
        raise Failed(f"nothing listens on port {target.port} (is lich-stub serve running?)") from None
    except (OSError, http.client.HTTPException) as exc:
        raise Failed(f"the stub on port {target.port} did not answer ({type(exc).__name__})") from None
    finally:
        conn.close()
    if resp.status == 401:
        raise Failed("the stub refused the token (a wrong --token, or another serve's runtime file)")
    try:
        doc = json.loads(raw)
    except ValueError:
        raise Failed(f"the stub answered {resp.status} with something that is not JSON") from None
    if resp.status != 200:
        raise Failed(doc.get("error") or f"the stub answered {resp.status}")
    return Outcome.from_json(doc)


def describe_failure(outcome: Outcome, timeout: float) -> Optional[str]:
    """None when the command was acked ok, else the one line that says what went wrong."""
    what = f"{outcome.kind} {outcome.id}"
    if outcome.ok:
        return None
    if outcome.acked:
        return f"{what} failed: {outcome.error or 'no reason given'}"
    if outcome.state == DROPPED:
        return f"{what} was never delivered: {outcome.dropped}"
    if outcome.state == ENDED:
        return f"{what} was not acked: the stub stopped first"
    if outcome.state == DELIVERED:
        return f"{what} was delivered but not acked within {timeout:g} s"
    return (
        f"no poll took {what} within {timeout:g} s, so it was withdrawn and will not run: "
        f"is the mod for {outcome.session_id} still polling?"
    )


def build_command(args) -> dict:
    kind = args.kind
    if kind == "prompt":
        command = {"kind": "prompt", "text": " ".join(args.text)}
        if args.notify:
            command["notification"] = {"status": args.notify[0], "summary": args.notify[1]}
        return command
    if kind == "abort":
        return {"kind": "abort"}
    if kind in ("model", "effort"):
        return {"kind": kind, kind: args.value} if args.value is not None else {"kind": kind}
    if kind == "command":
        command = {"kind": "command", "name": args.name}  # lich drops one leading slash, and refuses /model
        if args.args:
            command["args"] = " ".join(args.args)
        return command
    return {"kind": "ask", "question": " ".join(args.question)}


def drive(args) -> int:
    command = build_command(args)
    try:
        outcome = control(find_target(args.port, args.token), args.session, command, args.timeout)
    except Failed as exc:
        if args.json:
            print(json.dumps({"ok": False, "error": str(exc)}))
        print(f"lich-stub: {exc}", file=sys.stderr)
        return 1
    problem = describe_failure(outcome, args.timeout)
    if args.json:
        print(json.dumps(dict(outcome.to_json(), ok=outcome.ok, error=problem), ensure_ascii=False))
    elif problem is None:
        if command["kind"] == "ask":
            print(outcome.ack.get("answer", ""))
        else:
            print(f"ok: {outcome.kind} {outcome.id} acked in {outcome.took_s:.2f} s")
    if problem is not None:
        print(f"lich-stub: {problem}", file=sys.stderr)
        return 1
    return 0


def serve(args) -> int:
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="lich-stub: %(message)s")
    path = runtime_path()
    try:
        with open(path) as f:
            other = json.load(f).get("pid")
        if other != os.getpid() and _alive(other):
            print(f"lich-stub: another serve (pid {other}) owns {path}; stop it first", file=sys.stderr)
            return 1
    except (OSError, ValueError):
        pass
    stop = threading.Event()
    for sig in (getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGBREAK") if hasattr(signal, name)):
        signal.signal(sig, lambda signum, frame: stop.set())
    try:
        lich = StubLich(token=args.token, port=args.port or 0, hold=args.hold)
    except OSError as exc:
        print(f"lich-stub: cannot listen on port {args.port or 0}: {exc.strerror}", file=sys.stderr)
        return 1
    with lich:
        try:
            write_runtime(path, lich.port, lich.token)
        except BadConfig as exc:
            print(f"lich-stub: {exc}", file=sys.stderr)
            return 1
        try:
            print(f"lich-stub: listening on 127.0.0.1:{lich.port} (token in {path}); Ctrl-C stops it", flush=True)
            stop.wait()
        finally:
            remove_runtime(path)
    return 0


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from 0 to 86400")
    return value


def _common(suppress: bool) -> argparse.ArgumentParser:
    """The options every verb takes, wherever they are written. Below the
    top level they default to nothing, so one written earlier stands."""
    default = (lambda value: argparse.SUPPRESS) if suppress else (lambda value: value)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--port", type=int, default=default(None), help="the stub's port (default: from its runtime file; serve: any free one)")
    common.add_argument("--token", default=default(None), help="the stub's token (default: from its runtime file; serve: a random one)")
    common.add_argument("--timeout", type=_seconds, default=default(DEFAULT_TIMEOUT), help="how long to wait for the ack (s)")
    common.add_argument("--json", action="store_true", default=default(False), help="print the outcome as one JSON line")
    return common


def parser() -> argparse.ArgumentParser:
    below = _common(suppress=True)
    top = argparse.ArgumentParser(
        prog="lich-stub", description="A development lich: serve the mod-control contract, and drive it.", parents=[_common(suppress=False)]
    )
    top.add_argument("--version", action="version", version=__version__)
    sub = top.add_subparsers(dest="verb", required=True)

    s = sub.add_parser("serve", parents=[below], help="run the stub until Ctrl-C")
    s.add_argument("--hold", type=_seconds, default=HOLD_SECONDS, help="how long a poll is held (s)")
    s.add_argument("--verbose", action="store_true", help="log every request (never the token)")

    c = sub.add_parser("control", parents=[below], help="queue one command and wait for its ack")
    c.add_argument("session")
    kinds = c.add_subparsers(dest="kind", required=True)
    p = kinds.add_parser("prompt", parents=[below], help="start a turn")
    p.add_argument("text", nargs="+")
    p.add_argument("--notify", nargs=2, metavar=("STATUS", "SUMMARY"), help="send it as a task notification")
    kinds.add_parser("abort", parents=[below], help="stop the running turn")
    for kind, levels in (("model", "NAME"), ("effort", "LEVEL")):
        k = kinds.add_parser(kind, parents=[below], help=f"set the {kind} override, or drop it when absent")
        k.add_argument("value", nargs="?", metavar=levels)
    k = kinds.add_parser("command", parents=[below], help="run a slash command once the session is idle")
    k.add_argument("name")
    k.add_argument("args", nargs="*")

    a = sub.add_parser("ask", parents=[below], help="ask a side question; prints the answer alone")
    a.add_argument("session")
    a.add_argument("question", nargs="+")
    a.set_defaults(kind="ask")
    return top


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.verb == "serve":
        return serve(args)
    return drive(args)


if __name__ == "__main__":
    sys.exit(main())
