"""The token appears in request URLs only: rerun the integration, lifetime and
fault suites with a distinctive token, then look for it in everything the
daemons printed, wrote, or were started with."""
import os
import subprocess
import sys
import tempfile
from urllib.parse import quote

from relay import ROOT

TOKEN = "Zq7-lich/scan+token&x=1"
SUITES = ["tests/test_integration.py", "tests/test_lifetime.py", "tests/test_faults.py"]


def test_the_token_is_in_no_output_file_or_argv_of_any_daemon():
    with tempfile.TemporaryDirectory(prefix="ts") as scan:
        env = dict(os.environ, LICH_TEST_TOKEN=TOKEN, LICH_TEST_SCAN_DIR=scan)
        run = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={scan}/t", *SUITES],
            cwd=ROOT,
            env=env,
            capture_output=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stdout.decode()[-3000:]
        assert b" passed" in run.stdout
        files = [os.path.join(d, n) for d, _, names in os.walk(scan) for n in names]
        kept = [f for f in files if f.endswith((".stdout", ".stderr", ".argv"))]
        logs = [f for f in files if f.endswith(".log")]
        assert len(kept) >= 3 * 40 and logs  # the suites' daemons really left their traces
        forms = [TOKEN.encode(), quote(TOKEN, safe="").encode(), quote(TOKEN).encode()]
        found = []
        for path in files:
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                data = f.read()
            found += [(path, form) for form in forms if form in data]
        for stream in (run.stdout, run.stderr):
            found += [("pytest output", form) for form in forms if form in stream]
        assert found == []
