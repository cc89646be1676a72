"""The daemon with Windows' bridge (loopback TCP behind its secret, an
address file) on this system, so the end-to-end tests run that path on
Linux too: `python -m lich_dev.loopback_daemon` as the relay would start
`lich_control`. Only the choice of listener differs."""
import sys

from lich_control import config, bridge_server

config.ADDRESS = "address"  # read by the daemon as it is imported below
bridge_server.listener_at = bridge_server.LoopbackListener

from lich_control.daemon import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
