"""What the development lich holds: each session's mod and queue, each
command from queueing to its outcome, and the values it reports them as.

The mutable parts (`Queued`, `Mod`) are guarded by the lich's condition;
the values (`PollInfo`, `Outcome`) are frozen copies taken under it.
"""
from __future__ import annotations

import collections
import threading
from typing import Deque, Optional

import attrs

from .rules import reported_error

# What became of a command by the time its caller's wait ended, in lich's
# words (modcontrol.go ModOutcome) and one of the stub's own (dropped).
ACKED = "acked"  # the mod acked it: the ack says how it went
DELIVERED = "delivered"  # a poll carried it, and no ack came back yet
WITHDRAWN = "withdrawn"  # no poll collected it, so it was taken back and never runs
DROPPED = "dropped"  # it outlived the attach window in the queue, and no poll will carry it
ENDED = "ended"  # the lich closed first


@attrs.frozen
class PollInfo:
    session_id: str
    polls: int
    last_poll_age_s: Optional[float]  # since the last poll arrived; None: never
    parked: int  # polls held open right now
    hung_up: bool  # the last poll ended with the client gone, none since
    plugin: Optional[str]  # X-Lich-Plugin the mod last sent; None: none
    plugin_compatible: bool  # whether lich speaks the contract with that release


@attrs.frozen
class Outcome:
    """What became of one queued command."""

    id: str
    kind: str
    session_id: str
    state: str  # ACKED, DELIVERED, WITHDRAWN, DROPPED or ENDED
    delivered: bool
    ack: Optional[dict] = None  # the ack body as the mod sent it
    dropped: Optional[str] = None  # why it was never delivered
    took_s: Optional[float] = None  # queued to acked

    @property
    def acked(self) -> bool:
        return self.ack is not None

    @property
    def ok(self) -> bool:
        return self.ack is not None and self.ack.get("ok") is True

    @property
    def error(self) -> Optional[str]:
        """A failed ack's error as lich tells whoever issued the command."""
        return reported_error(self.ack)

    def to_json(self) -> dict:
        return attrs.asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> "Outcome":
        return cls(**{f.name: doc.get(f.name) for f in attrs.fields(cls)})


class Queued:
    """One command from queueing to its outcome; guarded by the lich's condition."""

    __slots__ = ("command", "session_id", "queued_at", "delivered", "state", "dropped", "ack", "acked_at", "wait_ended", "settled")

    def __init__(self, command: dict, session_id: str, now: float):
        self.command, self.session_id, self.queued_at = command, session_id, now
        self.delivered = False
        self.state: Optional[str] = None  # set once it is settled for good
        self.dropped: Optional[str] = None
        self.ack: Optional[dict] = None
        self.acked_at: Optional[float] = None
        self.wait_ended = False  # its caller stopped waiting: nobody takes an ack for it any more
        self.settled = threading.Event()  # acked, dropped, or the lich closed

    def outcome(self, closed: bool) -> Outcome:
        if self.ack is not None:
            state = ACKED
        elif self.state is not None:
            state = self.state
        elif closed:
            state = ENDED
        else:
            state = DELIVERED if self.delivered else WITHDRAWN
        took = None if self.acked_at is None else round(self.acked_at - self.queued_at, 3)
        return Outcome(
            id=self.command["id"],
            kind=str(self.command.get("kind")),
            session_id=self.session_id,
            state=state,
            delivered=self.delivered,
            ack=self.ack,
            dropped=self.dropped,
            took_s=took,
        )


class Mod:
    """What the lich knows of one session's mod; guarded by the lich's condition."""

    def __init__(self):
        self.waiting: Deque[Queued] = collections.deque()
        self.polls = 0
        self.last_poll: Optional[float] = None  # the lich's clock when the last poll arrived
        self.parked = 0
        self.hung_up = False
        # Counts the commands queued for it: a held poll answers once this
        # moves, with whatever the queue then holds (lich wakes every held
        # poll, and one that finds the queue drained answers [] at once).
        self.queued = 0
