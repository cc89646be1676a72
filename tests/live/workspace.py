"""A throwaway root for a live session, and what a first run of Claude Code
would have left in its home."""
from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
from typing import Callable, Iterable, List, Optional, Sequence

CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGIN_NAME = "lich-control"
# Set to keep the throwaway folder (its path is printed) for a post-mortem.
KEEP_ENV = "LICH_LIVE_KEEP"

# Folders and files of a checkout that are not the plugin: the virtual
# environments, caches, and what an earlier load of the plugin wrote.
_NOT_THE_PLUGIN = {".git", ".venv", ".venv-bench", "node_modules", "build", "dist", ".pytest_cache",
                   ".hypothesis", ".claude-types", "__pycache__", "tsconfig.json"}


def python_option(interpreter: str) -> dict:
    """Settings that set the plugin's `python` option."""
    return {"pluginConfigs": {PLUGIN_NAME: {"options": {"python": interpreter}}}}


def new_api_key() -> str:
    return "sk-ant-api03-live-" + secrets.token_hex(24)


class Workspace:
    """A throwaway root holding everything a session touches:

    home/   $HOME: .claude.json, .claude/settings.json, what Claude Code writes
    work/   the folder the session runs in (trusted)
    run/    the daemons' run folder (LICH_CONTROL_RUN_DIR of the session)
    lich/   the development lich's own run folder: its runtime file holds the token
    tmp/    TMPDIR of everything started here
    logs/   debug logs, the lich's output
    """

    def __init__(self, prefix: str = "lich-live-"):
        # Short, under /tmp: a Unix socket's path has room for about 100 bytes.
        self.root = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
        for name in ("home", "work", "run", "lich", "tmp", "logs"):
            os.makedirs(os.path.join(self.root, name), mode=0o700)
        self.home = self.path("home")
        self.work = self.path("work")
        self.run_dir = self.path("run")
        self.lich_run_dir = self.path("lich")
        self.tmp = self.path("tmp")
        self.logs = self.path("logs")

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def debug_log(self, name: str) -> str:
        """Where the Claude Code run called `name` writes its debug log."""
        return self.path("logs", f"{name}.debug.log")

    def copy_checkout(self, name: str = "plugin", edit: Optional[Callable[[str], None]] = None) -> str:
        """A copy of this checkout as a plugin folder (never the working tree:
        loading a plugin writes into its folder); `edit(folder)` may change it."""
        folder = self.path(name)

        def ignore(directory: str, names: List[str]) -> Iterable[str]:
            skipped = {n for n in names if n in _NOT_THE_PLUGIN or n.endswith(".egg-info") or n.endswith(".pyc")}
            if os.path.basename(directory) == ".claude-plugin":
                skipped.add("types")
            return skipped

        shutil.copytree(CHECKOUT, folder, ignore=ignore, symlinks=True)
        if edit is not None:
            edit(folder)
        return folder

    def write_claude_json(self, api_key: str, extra: Optional[dict] = None) -> None:
        """~/.claude.json as after a first run: onboarding done, the key
        approved, the work folder trusted (a mod loads only in a trusted one)."""
        doc = {
            "hasCompletedOnboarding": True,
            "customApiKeyResponses": {"approved": [api_key[-20:]], "rejected": []},
            "projects": {self.work: {"hasTrustDialogAccepted": True}},
        }
        doc.update(extra or {})
        self._write_json(os.path.join(self.home, ".claude.json"), doc)

    def write_settings(self, settings: dict) -> None:
        """~/.claude/settings.json, merged one level deep into what is there."""
        path = os.path.join(self.home, ".claude", "settings.json")
        try:
            with open(path) as f:
                doc = json.load(f)
        except FileNotFoundError:
            doc = {}
        for key, value in settings.items():
            if isinstance(value, dict) and isinstance(doc.get(key), dict):
                doc[key] = {**doc[key], **value}
            else:
                doc[key] = value
        self._write_json(path, doc)

    def write_file(self, relative: str, text: str) -> str:
        path = self.path(relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def left_by_the_run(self) -> List[str]:
        """The folders of everything the run left, but the development lich's
        own, whose runtime file holds its token by design."""
        return [self.path(name) for name in sorted(os.listdir(self.root)) if self.path(name) != self.lich_run_dir]

    def files_holding(self, secret: str, folders: Sequence[str]) -> List[str]:
        """Every file under `folders` whose bytes hold `secret`."""
        needle = secret.encode()
        found = []
        for folder in folders:
            for dirpath, _, filenames in os.walk(folder):
                for filename in filenames:
                    path = os.path.join(dirpath, filename)
                    try:
                        with open(path, "rb") as f:
                            if needle in f.read():
                                found.append(path)
                    except OSError:
                        continue  # a socket, or gone meanwhile
        return found

    def remove(self) -> None:
        if os.environ.get(KEEP_ENV):
            print(f"live test: kept {self.root}", file=sys.stderr)
            return
        shutil.rmtree(self.root, ignore_errors=True)

    @staticmethod
    def _write_json(path: str, doc: dict) -> None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(doc, f, indent=2)
