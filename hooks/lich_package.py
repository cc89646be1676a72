"""The plugin's Python package as the setup sees it: its files, the key of
the environment made from them, what it needs (setup.cfg), and the pips
that can install that, cheapest first, with what their output means.

Standard library only, and syntax an old python3 still reads (lich_runtime.py says why).
"""
import configparser
import glob
import hashlib
import json
import os
import re
import sys

# What the environment is made from: the package's own folder, copied in,
# and setup.cfg, which names what it needs. The rest of the plugin's folder
# (tests, docs, a developer's .venv) is neither copied nor part of the key,
# and nor are the texts setup.cfg only quotes, so editing them rebuilds nothing.
PACKAGE_FILES = ("setup.cfg", "pyproject.toml", "README.md", "LICENSE")
QUOTED_FILES = ("README.md", "LICENSE")
PACKAGE_DIR = "lich_control"
# What a pip says when it cannot do this job (none there; one older than
# 22.3, which has no --python): the next way to a pip is tried.
NO_PIP = re.compile(r"No module named pip\b|no such option: --python")
# pip's words for a package index it cannot reach.
UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution"
    r"|Name or service not known|Network is unreachable|Connection refused|ProxyError|SSLError"
    r"|Max retries exceeded|timed out"
)
NO_MATCH = re.compile(r"No matching distribution found for (\S+)|Could not find a version that satisfies the requirement (\S+)")


class Plugin:
    """The plugin's folder as far as its Python package goes: what it is, and what it needs."""

    def __init__(self, root):
        self.root = root

    def version(self):
        with open(os.path.join(self.root, ".claude-plugin", "plugin.json"), encoding="utf-8") as f:
            return str(json.load(f).get("version", "0"))

    def requirements(self):
        """What the package needs installed, from setup.cfg's install_requires."""
        return [line.strip() for line in self.setup_cfg().get("options", "install_requires", fallback="").splitlines()
                if line.strip() and not line.strip().startswith("#")]

    def setup_cfg(self):
        parser = configparser.ConfigParser()
        parser.read(os.path.join(self.root, "setup.cfg"), encoding="utf-8")
        return parser

    def python_requires(self):
        """The oldest Python the package takes, from setup.cfg's `>=X.Y`; None if it names none."""
        wanted = self.setup_cfg().get("options", "python_requires", fallback="")
        found = re.search(r">=\s*(\d+)\.(\d+)", wanted)
        return (int(found.group(1)), int(found.group(2))) if found else None

    def sources(self):
        """The package's files, relative to the root, sorted: what is copied and hashed."""
        names = [name for name in PACKAGE_FILES if os.path.isfile(os.path.join(self.root, name))]
        for folder, dirs, files in os.walk(os.path.join(self.root, PACKAGE_DIR)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in files:
                if not name.endswith((".pyc", ".pyo")):
                    names.append(os.path.relpath(os.path.join(folder, name), self.root))
        return sorted(names)

    def key(self):
        """The plugin's version and a digest of its package's files: a new key, a new environment.

        The digest makes an edited folder (a developer's checkout, a marketplace
        read from a folder) rebuild too, where the version alone would not.
        """
        digest = hashlib.sha256()
        for name in [name for name in self.sources() if name not in QUOTED_FILES]:
            digest.update(name.replace(os.sep, "/").encode() + b"\0")
            with open(os.path.join(self.root, name), "rb") as f:
                digest.update(f.read())
            digest.update(b"\0")
        return "{}-{}".format(self.version(), digest.hexdigest()[:12])


def base_python():
    """The interpreter this one was made from, when it is a virtual environment; else itself."""
    return getattr(sys, "_base_executable", None) or sys.executable


def bundled_pips():
    """The pip wheels this Python ships for ensurepip: in its ensurepip
    package, or where a distribution keeps them instead (Debian:
    <prefix>/share/python-wheels)."""
    folders = [os.path.join(sys.base_prefix, "share", "python-wheels")]
    try:
        import ensurepip
        folders.insert(0, os.path.join(os.path.dirname(ensurepip.__file__), "_bundled"))
    except ImportError:
        pass
    wheels = []
    for folder in folders:
        wheels.extend(sorted(glob.glob(os.path.join(folder, "pip-*.whl")), reverse=True)[:1])
    return wheels


def unique(items):
    return [item for n, item in enumerate(items) if item not in items[:n]]


def pip_problem(log_path):
    try:
        with open(log_path, encoding="utf-8", errors="replace") as f:
            output = f.read()
    except OSError:
        return "it wrote nothing"
    missing = NO_MATCH.search(output)
    if UNREACHABLE.search(output):
        return "the package index could not be reached"
    if missing:
        return "{} is not on the package index, or none there fits this Python".format(
            (missing.group(1) or missing.group(2)).rstrip(")"))
    return last_line(output)


def last_line(output):
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"
