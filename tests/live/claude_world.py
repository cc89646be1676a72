"""The Claude Code live test's world: a throwaway home with the first-run
state written, the development lich, the fake Anthropic model API and a
real, interactive Claude Code under a pseudo-terminal. What is not Claude
Code's own is world.py's, shared with the opencode live test.

    with World(claude_binary()) as world:            # also ends everything when a test fails
        plugin = world.ws.copy_checkout()            # the plugin as a copy: loading it writes there
        session = world.session("s1", plugin_dir=plugin)
        session.wait_polling()                       # lich-mod-status --json: the daemon polls
        world.lich.control("s1", "prompt", "hi")     # the Outcome as JSON, with "ok" and "error"
        world.api.wait_for(lambda r: "hi" in r.last_user_text, timeout=10)
        session.exit()

The workspace (workspace.py) holds home/ with the first-run state, work/
trusted, run/ for the daemons, lich/ for the development lich. A second way
of installing the plugin (a marketplace) starts its session with
`plugin_dir=None` and its own settings: nothing here assumes `--plugin-dir`.
"""
from __future__ import annotations

import subprocess
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from devlich import python
from modelapi import ANSWER_PREFIX, ModelAPI
from terminal import ESC
from world import HostSession, LiveWorld, lich_env, pinned_binary
from workspace import PLUGIN_NAME, new_api_key, python_option

# Where .ci/plugin-checks says which Claude Code it checked; unset, the
# test asks .ci/claude-code itself (which installs it when missing).
CLAUDE_ENV = "LICH_LIVE_CLAUDE"
# The prompt's footer while "!" has it in shell (bash) mode, as every release
# the live test runs words it.
SHELL_MODE = "! for shell mode"


def claude_binary() -> str:
    """The pinned Claude Code, as .ci/plugin-checks gets it (installing it when missing)."""
    return pinned_binary(CLAUDE_ENV, "claude-code", "Claude Code")


def plugin_args(plugin_dir: Optional[str]) -> List[str]:
    """`--plugin-dir` for a plugin loaded from a folder; none for one the home has installed."""
    return ["--plugin-dir", plugin_dir] if plugin_dir is not None else []


class ClaudeSession(HostSession):
    """An interactive Claude Code, as lich starts one, writing its debug log."""

    def __init__(self, world: "World", session_id: Optional[str], plugin_dir: Optional[str] = None,
                 args: Sequence[str] = (), env: Optional[Mapping[str, Optional[str]]] = None, name: Optional[str] = None):
        self.debug_log = world.ws.debug_log(name or session_id or "claude")
        argv = world.session_argv([world.claude, *plugin_args(plugin_dir), "--debug-file", self.debug_log, *args])
        super().__init__(world.ws, argv, world.env(session_id, env), session_id, world.watch)

    def shell(self, command: str, timeout: float = 10.0) -> None:
        """Run `command` in bash mode, as a person does: "!" at the empty
        prompt, then the command once the footer shows the mode switched,
        so that a switch that did not happen fails here, saying so, and the
        command never goes to the model as a prompt."""
        self.terminal.type("!")
        self.wait_for_screen(SHELL_MODE, timeout)
        self.enter(command, timeout)

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

        return self.wait_for(find, bool, timeout, f"a line with {words!r} in {self.debug_log}")

    def set_in_config(self, row: str, value: str, timeout: float = 10.0) -> None:
        """Set a plugin's `userConfig` field in /config as a person does: the
        rows filtered down to `row` (its title, then the plugin's name, as the
        menu draws it), the row opened, what it holds replaced by `value`,
        Enter to save, and the menu closed. Each key waits for what the one
        before put on the screen (the menu redraws only what changed, so the
        stream alone does not say), in the words of 2.1.280 and 2.1.332."""

        def wait(what: str, holds: Callable[[str], bool]) -> None:
            self.wait_for(self.screen, holds, timeout, what, lambda text: f"the screen: {text}")

        def shows(*words: str) -> None:
            wait(f"{words!r} on the screen", lambda text: any(" ".join(w.split()) in " ".join(text.split()) for w in words))

        title = row.split(" · ")[0]
        self.slash("/config")
        shows("Search settings")
        self.terminal.type(title.split()[0].lower())
        shows(row)
        self.terminal.type("\r")
        shows("Enter to open", "Enter/Space to change")
        self.terminal.type("\r")
        shows("Enter to continue")
        # Ctrl+U first: the field opens holding the value it has now.
        self.terminal.type("\x15")
        wait(f"the field {title!r} emptied", lambda text: any(line.strip() == f"❯ {title}" for line in text.splitlines()))
        self.terminal.type(value)
        shows(f"{title} {value}")
        self.terminal.type("\r")
        shows(f"{row} {value}")
        self.terminal.type(ESC)

    def log_lines(self) -> Tuple[str, List[str]]:
        return (f"debug log {self.debug_log}",
                [line for line in self.debug_text().splitlines() if PLUGIN_NAME in line or "[ERROR]" in line])


def check_answers_and_lich_is_refused(world: "World", session: ClaudeSession, marker: str, timeout: float) -> None:
    """A session no mod polls for: it answers a prompt typed into it, and
    lich refuses to control it with its "no mod has ever polled"."""
    # The prompt box is up once its footer shows (as releases word it); keys
    # typed before are lost.
    session.terminal.wait_for_text(("? for shortcuts", "shift+tab to cycle"), timeout)
    session.enter(f"are you there? {marker}")
    world.api.wait_for(lambda r: r.is_message and marker in r.last_user_text, timeout, "the typed prompt's request")
    session.terminal.wait_for_text(ANSWER_PREFIX, timeout)
    outcome = world.lich.control(session.session_id, "prompt", "anyone there?", timeout=5)
    assert outcome["ok"] is False and not outcome.get("delivered"), outcome
    assert "no mod has ever polled for it" in outcome["error"], outcome


class World(LiveWorld):
    """Claude Code's world. `settings` go to ~/.claude/settings.json
    (default: the plugin's `python` option naming the interpreter that has
    the project installed; `{}` for none, as a marketplace install would start);
    `claude_env` changes every session's environment as `env` does (what a
    release needs for its mod to run, releases.py)."""

    API = ModelAPI

    def __init__(self, claude: str, settings: Optional[dict] = None,
                 claude_env: Optional[Mapping[str, Optional[str]]] = None):
        self.claude = claude
        self.settings = settings
        self.claude_env = dict(claude_env or {})
        super().__init__()

    def prepare(self) -> None:
        self.api_key = new_api_key()
        self.ws.write_claude_json(self.api_key)
        self.ws.write_settings(python_option(python()) if self.settings is None else self.settings)

    def env(self, session_id: Optional[str], changes: Optional[Mapping[str, Optional[str]]] = None) -> Dict[str, str]:
        """A session's environment, inside lich when `session_id` is given."""
        return lich_env(self.ws, self.lich, session_id, {
            "ANTHROPIC_API_KEY": self.api_key,
            "ANTHROPIC_BASE_URL": self.api.base_url,
            # Keeps the flag service out, so mods keep their default, on: even a
            # `false` an earlier run cached in ~/.claude.json is then not read
            # (measured on 2.1.332; the debug log names the flag only when off).
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }, {**self.claude_env, **(changes or {})})

    def session_argv(self, argv: List[str]) -> List[str]:
        """How lich starts a session's program: as it is here; confined elsewhere (test_confined.py)."""
        return argv

    def command_argv(self, argv: List[str]) -> List[str]:
        """How a person runs `claude ARGS` in their terminal: as it is here."""
        return argv

    def session(self, session_id: Optional[str], plugin_dir: Optional[str] = None, args: Sequence[str] = (),
                env: Optional[Mapping[str, Optional[str]]] = None, name: Optional[str] = None) -> ClaudeSession:
        """An interactive session inside lich: `plugin_dir` adds
        `--plugin-dir` (None leaves the plugin to what the home has
        installed), `args` go after it, `env` changes its environment."""
        return self.adopt(ClaudeSession(self, session_id, plugin_dir, args, env, name))

    def run(self, args: Sequence[str], session_id: Optional[str] = None,
            env: Optional[Mapping[str, Optional[str]]] = None, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """`claude ARGS` to its end, with no terminal (with the LICH_*
        variables when `session_id` is given): `-p`, `plugin marketplace
        add`, `plugin install`."""
        return self.run_to_end(self.command_argv([self.claude, *args]), self.env(session_id, env), timeout)

    def print_run(self, session_id: str, prompt: str, plugin_dir: Optional[str] = None) -> subprocess.CompletedProcess:
        """`claude -p PROMPT` inside lich; its debug log is ws.debug_log(session_id)."""
        return self.run(["-p", prompt, *plugin_args(plugin_dir), "--debug-file", self.ws.debug_log(session_id)], session_id=session_id)
