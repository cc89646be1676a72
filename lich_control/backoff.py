"""The poll's retry delay as a value: failing gives the next one, a 200 the first."""
from __future__ import annotations

import attrs

FIRST_DELAY = 1.0
MAX_DELAY = 10.0


@attrs.frozen
class Backoff:
    """How long to wait before the next poll; 0 while lich answers."""

    delay: float = 0.0

    def failed(self) -> "Backoff":
        """1 s after the first failure, doubling, never over 10 s."""
        return Backoff(min(max(self.delay * 2, FIRST_DELAY), MAX_DELAY))

    def succeeded(self) -> "Backoff":
        return Backoff()
