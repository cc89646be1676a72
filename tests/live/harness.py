"""The live test's world: a throwaway home, the development lich, a fake
model API and a real, interactive Claude Code under a pseudo-terminal.

Everything is driven through the project's entry points as a user runs them
(`lich-stub serve|control|ask --json`, `lich-mod-status --json`, the daemon
as the relay starts it), never by importing `lich_control`: the test holds
whatever the package looks like inside.

    with World(claude_binary()) as world:            # also ends everything when a test fails
        plugin = world.ws.copy_checkout()            # the plugin as a copy: loading it writes there
        session = world.session("s1", plugin_dir=plugin)
        session.wait_polling()                       # lich-mod-status --json: the daemon polls
        world.lich.control("s1", "prompt", "hi")     # the Outcome as JSON, with "ok" and "error"
        world.api.wait_for(lambda r: "hi" in r.last_user_text, timeout=10)
        session.slash("/exit"); session.wait_exit()

World puts together a Workspace (a throwaway root: home/ with first-run
state, work/ trusted, run/ for the daemons, lich/ for the development lich),
a ProcessWatch (every process started, its argv, and its end), the fake
ModelAPI and the Lich (`lich-stub serve`).

A second way of installing the plugin (a marketplace, issue 12) starts its
session with `plugin_dir=None` and its own settings: nothing here assumes
`--plugin-dir`.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from typing import Callable, Dict, Mapping, Optional, Sequence

from devlich import Lich, Unavailable, daemon_status, python
from modelapi import ModelAPI
from processes import ProcessWatch, wait_until
from terminal import Terminal
from workspace import CHECKOUT, PLUGIN_NAME, Workspace, new_api_key, python_option

# Where .ci/plugin-checks says which Claude Code it checked; unset, the
# test asks .ci/claude-code itself (which installs it when missing).
CLAUDE_ENV = "LICH_LIVE_CLAUDE"


def claude_binary() -> str:
    """The pinned Claude Code, as .ci/plugin-checks gets it (installing it when missing)."""
    named = os.environ.get(CLAUDE_ENV)
    if named:
        if not os.access(named, os.X_OK):
            raise Unavailable(f"{CLAUDE_ENV} names {named}, which is not an executable")
        return named
    script = os.path.join(CHECKOUT, ".ci", "claude-code")
    done = subprocess.run([script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0 or not done.stdout.strip():
        raise Unavailable(f"no Claude Code to run: {done.stderr.strip() or '.ci/claude-code found none'}")
    return done.stdout.strip().splitlines()[-1]


def session_env(ws: Workspace, api: ModelAPI, api_key: str, lich: Optional[Lich], session_id: Optional[str],
                extra: Optional[Mapping[str, Optional[str]]] = None) -> Dict[str, str]:
    """What a session started inside lich gets: a home of its own, the model
    API on loopback, and the three LICH_* variables (none without a lich)."""
    env = {
        "HOME": ws.home,
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "TERM": "xterm-256color",
        "TMPDIR": ws.tmp,
        "ANTHROPIC_API_KEY": api_key,
        "ANTHROPIC_BASE_URL": api.base_url,
        # Keeps the flag service out, so mods keep their default: on.
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "LICH_CONTROL_RUN_DIR": ws.run_dir,
    }
    if lich is not None and session_id is not None:
        env.update({"LICH_PORT": str(lich.port), "LICH_TOKEN": lich.token, "LICH_SESSION_ID": session_id})
    for key, value in (extra or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


class ClaudeSession:
    """An interactive Claude Code under a pseudo-terminal, as lich starts one.

    `plugin_dir` adds `--plugin-dir`; None leaves the plugin to whatever the
    home has installed. `args` go on the command line after it; `env`
    changes the environment session_env() builds (None removes a variable).
    """

    def __init__(self, ws: Workspace, claude: str, api: ModelAPI, api_key: str, lich: Optional[Lich],
                 session_id: Optional[str], plugin_dir: Optional[str] = None, args: Sequence[str] = (),
                 env: Optional[Mapping[str, Optional[str]]] = None, watch: Optional[ProcessWatch] = None,
                 name: Optional[str] = None):
        self.ws = ws
        self.session_id = session_id
        self.debug_log = ws.debug_log(name or session_id or "claude")
        argv = [claude]
        if plugin_dir is not None:
            argv += ["--plugin-dir", plugin_dir]
        argv += ["--debug-file", self.debug_log, *args]
        self.argv = argv
        self.env = session_env(ws, api, api_key, lich, session_id, env)
        self.terminal = Terminal(argv, self.env, ws.work)
        if watch is not None:
            watch.track(self.terminal.pid)

    def __enter__(self) -> "ClaudeSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pid(self) -> int:
        return self.terminal.pid

    def status(self) -> Optional[dict]:
        return daemon_status(self.ws.run_dir, self.session_id)

    def wait_status(self, check: Callable[[dict], object], timeout: float, what: str = "the daemon's status") -> dict:
        """The daemon's status document once `check(status)` holds."""
        last = {}

        def look():
            last["status"] = self.status()
            return last["status"] if last["status"] is not None and check(last["status"]) else None

        try:
            return wait_until(look, timeout, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the last status: {json.dumps(last.get('status'))[:1500]}\n{self.diagnosis()}") from None

    def wait_polling(self, timeout: float = 30.0) -> dict:
        return self.wait_status(lambda s: s["poll"]["state"] == "polling" and s["poll"]["last_poll_age_s"] is not None,
                                timeout, f"a daemon polling for {self.session_id}")

    def wait_idle(self, timeout: float = 20.0) -> dict:
        """No turn running and no command in flight, as the daemon sees it."""
        return self.wait_status(lambda s: s["turn"] is None and not s["in_flight"], timeout, "the session to be idle")

    def debug_text(self) -> str:
        try:
            with open(self.debug_log, errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def wait_debug(self, words: str, timeout: float = 10.0) -> str:
        """The first debug log line holding `words`, once it is written."""

        def find():
            return next((line for line in self.debug_text().splitlines() if words in line), None)

        try:
            return wait_until(find, timeout, f"a line with {words!r} in {self.debug_log}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnosis()}") from None

    def diagnosis(self) -> str:
        """What to read when the session did not do what it should: the
        plugin's and the errors' lines of the debug log, and the screen."""
        lines = [line for line in self.debug_text().splitlines() if PLUGIN_NAME in line or "[ERROR]" in line]
        screen = " ".join(self.terminal.text.split())[-600:]
        return "\n".join([f"debug log {self.debug_log}, the plugin's and the errors' lines:", *lines[-20:], f"screen: {screen}"])

    def slash(self, command: str, timeout: float = 10.0) -> None:
        """Type a slash command at the prompt and press Enter, as a person does:
        the Enter waits until the command shows, so the menu has caught up."""
        mark = self.terminal.mark()
        self.terminal.type(command)
        self.terminal.wait_for_text(command, timeout, since=mark)
        self.terminal.type("\r")

    def wait_exit(self, timeout: float = 15.0) -> int:
        return self.terminal.wait_exit(timeout)

    def close(self) -> None:
        self.terminal.close()


class World:
    """Everything a live session needs, started together and ended together
    (also when a test fails): a workspace with first-run state written, a
    process watch, the fake model API and the development lich.

    `settings` go to ~/.claude/settings.json (default: the plugin's `python`
    option naming the interpreter that has the project installed; `{}` for
    none, as a marketplace install would start).
    """

    def __init__(self, claude: str, settings: Optional[dict] = None):
        self.claude = claude
        self._stack = contextlib.ExitStack()
        try:
            self.ws = Workspace()
            self._stack.callback(self.ws.remove)
            self.api_key = new_api_key()
            self.ws.write_claude_json(self.api_key)
            self.ws.write_settings(python_option(python()) if settings is None else settings)
            self.watch = self._stack.enter_context(ProcessWatch())
            self.api = self._stack.enter_context(ModelAPI())
            self.lich = self._stack.enter_context(Lich(self.ws, self.watch))
        except BaseException:
            self._stack.close()
            raise

    def __enter__(self) -> "World":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def session(self, session_id: Optional[str], plugin_dir: Optional[str] = None, args: Sequence[str] = (),
                env: Optional[Mapping[str, Optional[str]]] = None, name: Optional[str] = None) -> ClaudeSession:
        """An interactive session inside lich; closed with the world at the latest."""
        session = ClaudeSession(self.ws, self.claude, self.api, self.api_key, self.lich, session_id,
                                plugin_dir=plugin_dir, args=args, env=env, watch=self.watch, name=name)
        self._stack.callback(session.close)
        return session

    def run(self, args: Sequence[str], session_id: Optional[str] = None,
            env: Optional[Mapping[str, Optional[str]]] = None, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """`claude ARGS` to its end, with no terminal, in the work folder and
        the session's environment (with the LICH_* variables when
        `session_id` is given): `-p`, `plugin marketplace add`, `plugin install`."""
        argv = [self.claude, *args]
        proc = subprocess.Popen(argv, env=session_env(self.ws, self.api, self.api_key, self.lich, session_id, env),
                                cwd=self.ws.work, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.watch.track(proc.pid)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise AssertionError(f"claude {' '.join(args)[:80]} still ran after {timeout:g} s") from None
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def print_run(self, session_id: str, prompt: str, plugin_dir: Optional[str] = None) -> subprocess.CompletedProcess:
        """`claude -p PROMPT` inside lich; its debug log is ws.debug_log(session_id)."""
        plugin = ["--plugin-dir", plugin_dir] if plugin_dir is not None else []
        return self.run(["-p", prompt, *plugin, "--debug-file", self.ws.debug_log(session_id)], session_id=session_id)

    def close(self) -> None:
        # In reverse: sessions, the lich, the API, the watch (which ends
        # whatever is left of every process), and last the folder.
        self._stack.close()
