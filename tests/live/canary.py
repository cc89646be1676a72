"""make canary: the live session check (test_session.py) on npm's newest
Claude Code, which CI, pinned to the release releases.py names, never runs.
Where check 1 fails (the mod did not load, or its daemon never polled: mods
may be off there) the degrade checks (test_degrade.py) run on it too, to say
whether the session at least works with lich refused.

    python tests/live/canary.py [VERSION]   VERSION: check this release instead (the pinned one too)

It prints one line: the release, and `pass` or the checks that failed with
where pytest's whole output is; it exits 1 on a failure, and 0, saying so,
when npm's newest is the pinned release (make plugin-check checks that one).
LICH_LIVE_KEEP=1 keeps the sessions' throwaway folders, as in the live test.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from typing import List, Mapping, Optional, Tuple

from devlich import Unavailable
from releases import PINNED, install
from workspace import CHECKOUT

PACKAGE = "@anthropic-ai/claude-code"
SESSION_TESTS = "tests/live/test_session.py"
DEGRADE_TESTS = "tests/live/test_degrade.py"
CHECK_1 = "test_1_the_module_loads_and_the_daemon_polls"


def newest() -> str:
    """The release npm serves as the package's latest."""
    try:
        done = subprocess.run(["npm", "view", PACKAGE, "version"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, stdin=subprocess.DEVNULL, timeout=120)
    except FileNotFoundError:
        raise Unavailable("npm is needed to ask the registry for the newest Claude Code, and there is none") from None
    version = done.stdout.strip()
    if done.returncode != 0 or not re.fullmatch(r"\d+\.\d+\.\d+", version):
        said = done.stderr.strip().splitlines()[-1:] or [version or "nothing"]
        raise Unavailable(f"npm view {PACKAGE} version: {said[0]}")
    return version


def failures(junit_xml: str) -> Tuple[List[str], int]:
    """The tests a pytest JUnit report has failed or in error, by name, and
    how many it ran."""
    cases = list(ElementTree.parse(junit_xml).iter("testcase"))
    failed = [case.get("name", "").split("[")[0] for case in cases
              if case.find("failure") is not None or case.find("error") is not None]
    return failed, len(cases)


def run_tests(path: str, changes: Mapping[str, str], log) -> Optional[str]:
    """Runs a live test file as .ci/plugin-checks runs tests/live, its
    output into `log`: None when it passed, else which of its tests failed."""
    with tempfile.TemporaryDirectory(prefix="lich-canary-") as folder:
        report = os.path.join(folder, "junit.xml")
        done = subprocess.run([sys.executable, "-m", "pytest", "-c", "tests/live/pytest.ini", path, f"--junitxml={report}"],
                              cwd=CHECKOUT, env={**os.environ, **changes}, stdout=log, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL)
        failed, ran = failures(report) if os.path.exists(report) else ([], 0)
    name = os.path.basename(path)
    if failed:
        return f"{name}, {len(failed)} of {ran}: " + ", ".join(failed)
    return f"{name}: pytest exited {done.returncode}" if done.returncode != 0 else None


def check(version: str) -> str:
    """The canary's verdict on one release, as its line ends."""
    try:
        binary = install(version)
    except Unavailable as exc:
        return f"failed: {exc}"
    log_path = os.path.join(tempfile.gettempdir(), f"lich-canary-{version}.log")
    with open(log_path, "w") as log:
        # The session fixture's pinned binary is only taken for the pinned
        # release; naming this one spares installing the pinned one beside it.
        live = {"LICH_LIVE_CLAUDE": binary}
        failed = run_tests(SESSION_TESTS, {**live, "LICH_LIVE_RELEASES": version}, log)
        if failed is None:
            return "pass"
        verdict = f"failed: {failed}"
        if CHECK_1 in failed:
            degrade = run_tests(DEGRADE_TESTS, {**live, "LICH_LIVE_DEGRADE": version}, log)
            verdict += "; with check 1 failed, the degrade checks " + (
                "passed: the mod does not run there" if degrade is None else f"failed too: {degrade}")
    return f"{verdict} (log: {log_path})"


def main(argv: List[str]) -> int:
    if argv:
        version = argv[0]
    else:
        try:
            version = newest()
        except Unavailable as exc:
            print(f"canary: no newest Claude Code to check: {exc}")
            return 1
        if version == PINNED:
            print(f"canary: Claude Code {version}, npm's newest, is already the pinned one "
                  "(make plugin-check checks it): nothing new to check")
            return 0
    verdict = check(version)
    print(f"canary: Claude Code {version}: {verdict}")
    return 0 if verdict == "pass" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
