"""Asks: side questions, answered by a fork beside the turn, outside the order.

An ask starts the moment its poll returns and is acked whenever its fork
answers. The pool's size bounds how many forks run at once; further asks
wait for a free thread and hold nothing else back.
"""
from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from .acker import send_ack
from .ack import Ack
from .status import Activity
from .commands import Command, ask_prompt
from .engine import CallResult, Engine
from .lich import LichClient

log = logging.getLogger("lich_control.asks")

POOL_SIZE = 32


class Asks:
    def __init__(
        self,
        engine: Engine,
        client_factory: Callable[[], LichClient],
        activity: Activity,
        session_id: str,
        size: int = POOL_SIZE,
    ):
        self._engine = engine
        self._client_factory = client_factory
        self._activity = activity
        self._session_id = session_id
        self._pool = ThreadPoolExecutor(max_workers=size, thread_name_prefix="lich-ask")
        self._local = threading.local()  # one lich client per pool thread

    def submit(self, command: Command) -> None:
        self._activity.waiting(command.id, "ask pool")
        future = self._pool.submit(self._answer, command)
        # A Future keeps its job's exception to itself: say it out loud.
        future.add_done_callback(_log_crash)

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _answer(self, command: Command) -> None:
        self._activity.waiting(command.id, "fork")
        try:
            result = self._engine.fork(ask_prompt(command.question)).result()
        except Exception:  # a bug, not the session: still one ack for lich
            log.exception("the fork for %s failed unexpectedly", command.id)
            result = CallResult.failed("the daemon could not run the fork (see its log)")
        send_ack(self._client(), self._activity, fork_ack(self._session_id, command, result))

    def _client(self) -> LichClient:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._client_factory()
        return client


def fork_ack(session_id: str, command: Command, result: CallResult) -> Ack:
    """The ack of an ask from what `$.model.fork` resolved to."""
    if not result.ok:
        return Ack(session_id, command.id, "ask", ok=False, error=result.error)
    reply = result.value if isinstance(result.value, dict) else {}
    if reply.get("isAnswered") is True:
        text = reply.get("text")
        return Ack(session_id, command.id, "ask", ok=True, answer=text if isinstance(text, str) else "")
    reason = reply.get("reason")
    if reason == "api-error":
        status = reply.get("status")
        reason = f"api-error {'null' if status is None else status} {reply.get('error', 'unknown')}"
    elif not isinstance(reason, str) or not reason:
        reason = "the fork answered in a shape this daemon does not know"
    return Ack(session_id, command.id, "ask", ok=False, error=reason)


def _log_crash(future) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.error("an ask failed unexpectedly", exc_info=future.exception())
