"""The opencode live test's world: a throwaway home, the development lich, a
fake OpenAI-compatible model API, and a real, interactive opencode under a
pseudo-terminal, with this project's relay installed as docs/opencode.md says.

What is not opencode's own comes from tests/live (world.py: the session
under a pseudo-terminal, its waits, the world that ends it all; the
workspace, the process watch, the development lich run through `lich-stub
serve|control|ask --json` and `lich-mod-status --json`, the fake API's
server). Nothing imports `lich_control`.

    with World(opencode_binary()) as world:
        session = world.session("oc-1")              # opencode in the work folder, inside lich
        session.wait_polling()
        world.lich.control("oc-1", "prompt", "hi")   # the outcome as JSON, "ok" and "error" added
        session.exit()
"""
from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
from typing import List, Optional, Tuple

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.append(os.path.join(CHECKOUT, "tests", "live"))

from devlich import Lich, python  # noqa: E402
from fakemodel import FakeModel  # noqa: E402
from world import HostSession, LiveWorld, lich_env, pinned_binary  # noqa: E402
from workspace import Workspace  # noqa: E402

RELAY = os.path.join(CHECKOUT, "hooks", "opencode", "lich-control.js")
OPENCODE_ENV = "LICH_LIVE_OPENCODE"  # the binary .ci/opencode-checks found; unset, ask .ci/opencode
PINNED = "1.18.33"
PROVIDER = "fake"
MODELS = ("m1", "m2")


def opencode_binary() -> str:
    """The pinned opencode, as .ci/opencode gets it (installing it when missing)."""
    return pinned_binary(OPENCODE_ENV, "opencode", "opencode")


class Opencode:
    """opencode's side of the workspace: its home, configuration and database."""

    def __init__(self, ws: Workspace):
        self.ws = ws

    @property
    def config_dir(self) -> str:
        return os.path.join(self.ws.home, ".config", "opencode")

    @property
    def data_dir(self) -> str:
        return os.path.join(self.ws.home, ".local", "share", "opencode")

    @property
    def runtime_dir(self) -> str:
        """Where the relay keeps the daemon's private environment."""
        return os.path.join(self.data_dir, "lich-control")

    def env(self, lich: Optional[Lich], session_id: Optional[str]) -> dict:
        """What lich gives the program it starts: the throwaway home, and the
        three variables when `session_id` is given."""
        home = self.ws.home
        return lich_env(self.ws, lich, session_id, {
            "XDG_CONFIG_HOME": os.path.join(home, ".config"),
            "XDG_DATA_HOME": os.path.join(home, ".local", "share"),
            "XDG_CACHE_HOME": os.path.join(home, ".cache"),
            "XDG_STATE_HOME": os.path.join(home, ".local", "state"),
            # Offline: no model catalogue from models.dev, no update check.
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
        })

    def install(self, api: FakeModel, python_option: bool = True) -> None:
        """The user's configuration: the fake model as an OpenAI-compatible
        provider, and the relay as a plugin, as docs/opencode.md installs it:
        with its python option naming the interpreter that has the project
        installed, or, without, left to set its own environment up."""
        plugin = self.plugin(python_option)
        config = {
            "$schema": "https://opencode.ai/config.json",
            "autoupdate": False,
            "share": "disabled",
            "model": f"{PROVIDER}/{MODELS[0]}",
            "small_model": f"{PROVIDER}/{MODELS[0]}",
            "plugin": [plugin],
            "provider": {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "Fake",
                    "options": {"baseURL": api.base_url, "apiKey": "not-a-key"},
                    # reasoning: opencode gives such a model the variants low, medium, high.
                    "models": {name: {"name": name.upper(), "reasoning": True} for name in MODELS},
                }
            },
        }
        self.ws.write_file(os.path.relpath(os.path.join(self.config_dir, "opencode.json"), self.ws.root),
                           json.dumps(config, indent=2))
        for folder in (self.config_dir, os.path.join(self.ws.work, ".opencode")):
            provide_plugin_dependency(folder)

    def plugin(self, python_option: bool):
        """The relay's entry in the configuration's plugin list."""
        return [RELAY, {"python": python()}] if python_option else RELAY

    def sessions(self) -> List[tuple]:
        """(id, title, parent) of every session opencode keeps, from its database."""
        path = os.path.join(self.data_dir, "opencode.db")
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            return db.execute("SELECT id, title, parent_id FROM session ORDER BY time_created").fetchall()

    def log(self) -> str:
        folder = os.path.join(self.data_dir, "log")
        texts = []
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
            with open(os.path.join(folder, name), errors="replace") as f:
                texts.append(f.read())
        return "\n".join(texts)


def provide_plugin_dependency(folder: str) -> None:
    """At start, opencode makes sure each of its configuration folders has
    @opencode-ai/plugin installed for the plugins there, and fetches it from
    the npm registry unless the folder's package-lock.json already lists it
    (with a node_modules beside); offline, that fetch holds the start for
    over a minute. The relay imports nothing from it, so the lock is all
    opencode looks at."""
    os.makedirs(os.path.join(folder, "node_modules"), exist_ok=True)
    wanted = {"@opencode-ai/plugin": PINNED}
    with open(os.path.join(folder, "package.json"), "w") as f:
        json.dump({"dependencies": wanted}, f)
    with open(os.path.join(folder, "package-lock.json"), "w") as f:
        json.dump({"lockfileVersion": 3, "packages": {"": {"dependencies": wanted}}}, f)


class OpencodeSession(HostSession):
    """An interactive opencode in the work folder, as lich starts one."""

    POLL_WAIT = 60.0
    IDLE_WAIT = 30.0
    EXIT_WAIT = 20.0

    def __init__(self, world: "World", session_id: str):
        self.oc = world.oc
        self.started = time.monotonic()
        super().__init__(world.ws, world.argv(), world.oc.env(world.lich, session_id), session_id, world.watch)

    def log_lines(self) -> Tuple[str, List[str]]:
        return "opencode's log", [line for line in self.oc.log().splitlines() if "lich" in line or "level=ERROR" in line]


class World(LiveWorld):
    """opencode's world: its configuration names the fake model and the relay."""

    API = FakeModel
    WORKSPACE_PREFIX = "lich-oc-"

    def __init__(self, binary: str):
        self.binary = binary
        super().__init__()

    def prepare(self) -> None:
        self.oc = Opencode(self.ws)
        self.oc.install(self.api)

    def argv(self) -> List[str]:
        """How the interactive opencode is started."""
        return [self.binary]

    def session(self, session_id: str) -> OpencodeSession:
        return self.adopt(OpencodeSession(self, session_id))

    def run(self, prompt: str, session_id: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
        """`opencode run PROMPT` to its end, no terminal, inside lich."""
        return self.run_to_end([self.binary, "run", prompt], self.oc.env(self.lich, session_id), timeout)
