"""OrderedThread: jobs run one at a time, in order, on a thread of their own:
the worker's commands, the asks' fork calls, the acks of settled calls."""
from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Optional

log = logging.getLogger("lich_control.ordered")

_STOP = object()


class OrderedThread:
    """The queue and the thread are this object's; the lock guards the
    thread's start and the stop flag. The thread starts with the first job,
    so one never given a job is never started."""

    def __init__(self, name: str):
        self._name = name
        self._lock = threading.Lock()
        self._jobs: "queue.SimpleQueue" = queue.SimpleQueue()  # unbounded: submit never blocks
        self._thread: Optional[threading.Thread] = None
        self.stopping = False

    def submit(self, what: str, job: Callable[..., Any], *args: Any) -> bool:
        """Queue `job(*args)` (`what`: the job, for the log if it fails);
        False, and the job dropped, once stopping."""
        with self._lock:
            if self.stopping:
                return False
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._jobs.put((what, job, args))
        return True

    def stop(self, timeout: float) -> bool:
        """Take nothing new; the jobs queued still run (each may read
        `stopping`) within `timeout`. True once the thread has ended. A
        second call only waits again."""
        with self._lock:
            if not self.stopping:
                self.stopping = True
                self._jobs.put(_STOP)
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _run(self) -> None:
        for what, job, args in iter(self._jobs.get, _STOP):
            try:
                job(*args)
            except Exception:  # the thread's one catch-all: a bug costs its job, said here, never the jobs after it
                log.exception("%s was lost", what)
