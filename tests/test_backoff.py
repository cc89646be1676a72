"""Backoff is a value: each caller keeps its own, and a reset is the first
state again. The schedule it gives the poll loop is tested on a frozen clock
in test_poller.py."""
from lich_control.backoff import Backoff


def test_backoff_is_a_value_each_caller_keeps_its_own():
    first = Backoff().failed()
    second = first.failed()
    assert (first.delay, second.delay) == (1, 2)
    assert second.succeeded() == Backoff() and second.succeeded().failed() == first
