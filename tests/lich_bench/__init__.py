"""The benchmark: the daemon against the development lich and a relay stand-in."""
