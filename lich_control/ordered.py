"""OrderedThread: jobs run one at a time, in order, on a thread of their own
that drains a `queue.Queue`: the worker's commands, the acks of settled calls.

Each job comes with its refusal: once the thread is stopped with a reason,
every job still queued or given later is refused with it instead of run
(the worker's refusal acks its command as never applied).
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Optional

log = logging.getLogger("lich_control.ordered")

_STOP = object()

Refusal = Callable[[Optional[str]], None]


class OrderedThread:
    """The queue and the thread are this object's; the lock guards the
    thread's start and the stop. The thread starts with the first job, so
    one never given a job is never started."""

    def __init__(self, name: str):
        self._name = name
        self._lock = threading.Lock()
        self._jobs: "queue.Queue" = queue.Queue()  # unbounded: put never blocks, so neither does submit
        self._thread: Optional[threading.Thread] = None
        self._stopped = False
        self.why: Optional[str] = None  # the stop's reason: the jobs still queued are refused with it

    def submit(self, what: str, job: Callable[[], object], refuse: Refusal) -> None:
        """Queue `job()` (`what` names it in the log if it fails). Once
        stopped, `refuse(why)` is called instead, here or in its turn."""
        with self._lock:
            if not self._stopped:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                    self._thread.start()
                self._jobs.put((what, job, refuse))
                return
        refuse(self.why)

    def stop(self, timeout: float, why: Optional[str] = None) -> bool:
        """Take nothing new. With `why` (the first given counts) the jobs
        still queued are refused with it; without, they still run. True once
        the thread has ended within `timeout`; a second call only waits again."""
        with self._lock:
            self.why = self.why or why
            if not self._stopped:
                self._stopped = True
                self._jobs.put(_STOP)
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _run(self) -> None:
        for what, job, refuse in iter(self._jobs.get, _STOP):
            try:
                if self.why is None:
                    job()
                else:
                    refuse(self.why)
            except Exception:  # the thread's one catch-all: a bug costs its job, said here, never the jobs after it
                log.exception("%s was lost", what)
            finally:
                self._jobs.task_done()
