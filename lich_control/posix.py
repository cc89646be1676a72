"""What the daemon and the plugin's setup ask of a POSIX system itself.

The setup imports this file by its path, with whatever Python runs it,
before the package is installed: it imports the standard library only,
never the package.
"""
from __future__ import annotations

import fcntl


def try_lock(fd: int, shared: bool = False) -> bool:
    """Take flock's lock on `fd` if no other open file holds it: whether it
    did. The kernel releases it however the process ends."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def wait_lock(fd: int) -> None:
    """Take the exclusive lock on `fd`, waiting as long as another holds it."""
    fcntl.flock(fd, fcntl.LOCK_EX)


def unlock(fd: int) -> None:
    fcntl.flock(fd, fcntl.LOCK_UN)
