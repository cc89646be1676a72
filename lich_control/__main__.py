"""`python -m lich_control [--host claude-code|opencode]`: the daemon, and
the start-up work that must come before its imports (the relays and the
`lich-mod-daemon` script start it so)."""
import gc
import sys


def main() -> int:
    # The daemon's imports are most of the start (docs/performance.md), and
    # what they build lives as long as the process: the collector is off
    # while they load, and their objects are then left out of every
    # collection (gc.freeze), not walked again at the first ones.
    gc.disable()
    from .system import native

    # Read before the daemon's imports: a parent that dies while they run
    # leaves us a reaper's pid, and this one to compare with. A spawner that
    # names itself (LICH_CONTROL_PARENT_PID) closes the window before it too.
    started_by = native.started_by()
    from . import daemon

    gc.freeze()
    gc.enable()
    return daemon.main(started_by=started_by)


if __name__ == "__main__":
    sys.exit(main())
