"""The token appears in request URLs only. Every daemon the `lich` fixture
served this session had a token that would show in any form a URL gives it;
this test runs last (conftest.py) and looks for it in everything those
daemons printed, wrote (logs included), or were started with."""
import os
import tempfile
from urllib.parse import quote

import pytest

from conftest import SCAN_TOKEN

FORMS = [SCAN_TOKEN.encode(), quote(SCAN_TOKEN, safe="").encode(), quote(SCAN_TOKEN).encode()]


def leaks(folder):
    """(path, form) for each form of the token in each plain file under `folder`."""
    found = []
    for where, _, names in os.walk(folder):
        for path in (os.path.join(where, name) for name in names):
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                data = f.read()
            found += [(path, form) for form in FORMS if form in data]
    return found


def test_the_token_is_in_no_output_file_or_argv_of_any_daemon(daemon_traces, tmp_path_factory):
    # Each daemon a Relay stopped left its streams and argv here: the scan
    # runs whenever one daemon ran, and only a session that ran none skips.
    if not any(os.scandir(daemon_traces)):
        pytest.skip("no daemon ran in this session: nothing to scan")
    base = tmp_path_factory.getbasetemp()
    assert any(name.endswith(".log") for _, _, names in os.walk(base) for name in names)  # the daemons' logs are among them
    assert leaks(base) == []


@pytest.mark.parametrize("form", FORMS)
def test_the_scan_finds_the_token_in_each_form_a_daemon_could_leave(form):
    # Outside the pytest folder the scan above reads, so that it stays clean.
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "daemon-1.stderr")
        with open(path, "wb") as f:
            f.write(b"lich-control: GET /mod/commands?token=" + form + b" failed\n")
        assert leaks(folder) == [(path, form)]
