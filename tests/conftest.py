import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fakelich import FakeLich  # noqa: E402
from relay import Relay  # noqa: E402


# The token scan (test_secrets.py) reruns suites with its own token and a
# folder to collect everything the daemons wrote.
TOKEN = os.environ.get("LICH_TEST_TOKEN")


@pytest.fixture
def lich():
    server = FakeLich(token=TOKEN) if TOKEN else FakeLich()
    yield server
    server.close()


@pytest.fixture
def run_dir(tmp_path_factory):
    # Short: a Unix socket path has room for about 100 bytes.
    path = tmp_path_factory.mktemp("run")
    return str(path)


@pytest.fixture
def daemon_env(lich, run_dir):
    return {
        "LICH_PORT": str(lich.port),
        "LICH_TOKEN": lich.token,
        "LICH_SESSION_ID": "s1",
        "LICH_CONTROL_RUN_DIR": run_dir,
    }


@pytest.fixture
def relay(daemon_env):
    started = []

    def start(env=None, args=(), **kw):
        r = Relay(dict(daemon_env, **(env or {})), args=args, **kw)
        started.append(r)
        return r

    yield start
    for r in started:
        r.stop()
