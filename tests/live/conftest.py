import pytest

from claude_world import claude_binary
from devlich import Unavailable
from releases import degrade_releases, install_releases, refusing_releases, release, session_releases


@pytest.fixture(scope="session")
def claude():
    """The pinned Claude Code's binary. Without it the live test fails: a
    check that cannot run is a failed check, never a skip."""
    try:
        return claude_binary()
    except Unavailable as exc:
        pytest.fail(str(exc), pytrace=False)


def installed(version, claude):
    try:
        return release(version, claude)
    except Unavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session", params=session_releases())
def session_release(request, claude):
    """Each release the session test runs on (releases.py), in turn."""
    return installed(request.param, claude)


@pytest.fixture(scope="session", params=install_releases())
def install_release(request, claude):
    """Each release the install check runs on, in turn."""
    return installed(request.param, claude)


@pytest.fixture(scope="session", params=degrade_releases())
def degrade_release(request, claude):
    """Each release that must skip the mod cleanly, in turn."""
    return installed(request.param, claude)


@pytest.fixture(scope="session", params=refusing_releases())
def refusing_release(request, claude):
    """Each release that refuses the relay's requests while nonessential traffic is off, in turn."""
    return installed(request.param, claude)
