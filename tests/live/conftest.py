import pytest

from claude_world import claude_binary
from devlich import Unavailable


@pytest.fixture(scope="session")
def claude():
    """The pinned Claude Code's binary. Without it the live test fails: a
    check that cannot run is a failed check, never a skip."""
    try:
        return claude_binary()
    except Unavailable as exc:
        pytest.fail(str(exc), pytrace=False)
