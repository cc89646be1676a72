import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import requests  # noqa: E402

from lich_dev.lich import StubLich  # noqa: E402
from relay import Relay  # noqa: E402


def _makes_symlinks():
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        link = os.path.join(folder, "link")
        try:
            os.symlink(folder, link)
        except OSError:
            return False
        return os.path.islink(link)


# Links planted where the daemon writes: Windows makes them only with a
# privilege, and Wine 8's os.symlink makes nothing at all.
symlinks = pytest.mark.skipif(not _makes_symlinks(), reason="this system makes no symbolic links (Wine 8; Windows without the privilege)")


# A token that would show in any form a URL gives it: every daemon the
# `lich` fixture serves gets it, and test_secrets.py, run last, looks for it
# in everything those daemons printed, wrote, or were started with.
SCAN_TOKEN = "Zq7-lich/scan+token&x=1"


def pytest_collection_modifyitems(session, config, items):
    # The token scan reads what the other tests' daemons left: it goes last.
    items.sort(key=lambda item: item.nodeid.startswith("tests/test_secrets.py"))


@pytest.fixture(scope="session", autouse=True)
def daemon_traces(tmp_path_factory):
    """The folder where every Relay leaves its daemon's streams and argv as it stops."""
    folder = tmp_path_factory.mktemp("traces")
    os.environ["LICH_TEST_SCAN_DIR"] = str(folder)
    yield folder
    os.environ.pop("LICH_TEST_SCAN_DIR", None)


@pytest.fixture
def lich():
    """The development lich the daemon under test polls, as a lich newer than
    the mod: it knows a kind `rewind`, which the daemon acks `unknown kind`."""
    server = StubLich(token=SCAN_TOKEN, newer_kinds={"rewind": ()}).start()
    yield server
    server.close()


@pytest.fixture
def http():
    """A requests session, for tests that speak to a lich themselves."""
    with requests.Session() as session:
        yield session


@pytest.fixture
def background():
    """Threads for what a test must not block on (a held poll, a held ack)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        yield pool


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
        r = Relay(dict(daemon_env, **dict({"LICH_CONTROL_PARENT_PID": str(os.getpid())}, **(env or {}))), args=args, **kw)
        started.append(r)
        return r

    yield start
    for r in started:
        r.stop()
