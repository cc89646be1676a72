"""The token appears in request URLs only. Every daemon the `lich` fixture
served this session had a token that would show in any form a URL gives it;
this test runs last (conftest.py) and looks for it in everything those
daemons printed, wrote (logs included), or were started with."""
import os
from urllib.parse import quote

import pytest

from conftest import SCAN_TOKEN

FORMS = [SCAN_TOKEN.encode(), quote(SCAN_TOKEN, safe="").encode(), quote(SCAN_TOKEN).encode()]


def test_the_token_is_in_no_output_file_or_argv_of_any_daemon(daemon_traces, tmp_path_factory):
    kept = [entry.path for entry in os.scandir(daemon_traces)]
    if len(kept) < 3 * 40:
        pytest.skip("the daemon suites did not run in this session: nothing to scan")
    files = [os.path.join(d, n) for d, _, names in os.walk(tmp_path_factory.getbasetemp()) for n in names]
    assert any(f.endswith(".log") for f in files)  # the daemons' logs are among them
    found = []
    for path in files:
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        found += [(path, form) for form in FORMS if form in data]
    assert found == []
