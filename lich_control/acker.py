"""Sending acks: one attempt each, and a thread for the ones that settle late.

An ack is sent once. One that cannot be sent is dropped and logged (with
lich's reason when lich refused it), never retried: lich resolves a wait
with the first ack it gets, and the next command must not wait on this one.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Optional

from .ack import Ack, AckTooLarge
from .activity import Activity
from .lich import AckFailed, LichClient

log = logging.getLogger("lich_control.acker")


def send_ack(client: LichClient, activity: Activity, ack: Ack) -> bool:
    """Post one ack; True when lich took it. Never raises, so a caller's
    catch-all never mistakes a sent ack for one still owed."""
    try:
        client.ack(ack)
    except (AckFailed, AckTooLarge) as exc:
        if getattr(exc, "refused", False):
            log.warning("lich refused the ack for %s (%s): %s", ack.id, ack.kind, exc)
        else:
            log.warning("dropped the ack for %s (%s): %s", ack.id, ack.kind, exc)
        sent: Optional[str] = str(exc)
    except Exception:
        # A bug, not lich: the ack may have gone out, so it is not sent again.
        log.exception("sending the ack for %s (%s) failed", ack.id, ack.kind)
        sent = "the daemon failed to send it (see its log)"
    else:
        log.info("acked %s (%s): %s", ack.id, ack.kind, "ok" if ack.ok else f"failed: {ack.error}")
        sent = None
    try:
        activity.acked(ack.id, ack.kind, ack.ok, ack.error, sent=sent)
    except Exception:  # the status is bookkeeping: the ack's fate is settled
        log.exception("recording the ack for %s (%s) failed", ack.id, ack.kind)
    return sent is None


class OneAck:
    """The right to send one command's ack, taken once.

    Two threads may race for it (a fork's answer and its deadline), or one
    thread may hold it across a failure (the worker's catch-all): whoever
    takes it first sends the ack, and nobody else does.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._taken = False

    def take(self) -> bool:
        with self._lock:
            taken, self._taken = self._taken, True
        return not taken

    @property
    def taken(self) -> bool:
        return self._taken


_STOP = object()


class Acker:
    """Sends the acks of prompts and slash commands as they settle.

    Their futures settle on whatever thread delivered the session's answer;
    `submit` only queues, so that thread never waits on lich. The queue and
    the thread are this object's alone, and the lich client the thread's.
    """

    def __init__(self, client_factory: Callable[[], LichClient], activity: Activity):
        self._client_factory = client_factory
        self._activity = activity
        self._queue: "queue.Queue" = queue.Queue()  # unbounded: put never blocks
        self._thread = threading.Thread(target=self._run, name="lich-acker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, ack: Ack) -> None:
        self._queue.put(ack)

    def stop(self, timeout: float) -> bool:
        """Finish what is queued within `timeout`; True if the thread ended."""
        self._queue.put(_STOP)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        client: Optional[LichClient] = None
        try:
            for ack in iter(self._queue.get, _STOP):
                try:
                    if client is None:
                        client = self._client_factory()  # made here: the thread's own session
                    send_ack(client, self._activity, ack)
                except Exception:  # a bug costs this ack, never the thread and the acks after it
                    log.exception("the ack for %s (%s) was lost", ack.id, ack.kind)
        finally:
            if client is not None:
                client.close()
