"""OrderedThread: one ordered thread on a queue.Queue (the worker's, the
acks'): jobs in order, a bug costing its job alone, every job either run or
refused with the stop's reason, and stop(timeout) saying whether the thread ended."""
import threading

from lich_control.ordered import OrderedThread

WAIT = 5.0


def never_refused(why):
    raise AssertionError(f"refused: {why}")


def test_jobs_run_one_at_a_time_in_order_on_the_named_thread_and_a_failing_one_costs_itself_alone(caplog):
    ran = []
    jobs = OrderedThread("lich-test")
    for n in range(5):
        jobs.submit(f"job {n}", lambda n=n: ran.append((n, threading.current_thread().name)) if n != 2 else 1 / 0, never_refused)
    assert jobs.stop(WAIT)
    assert ran == [(n, "lich-test") for n in (0, 1, 3, 4)]
    assert "job 2 was lost" in caplog.text and "ZeroDivisionError" in caplog.text


def test_a_thread_never_given_a_job_is_never_started_and_stops_at_once():
    before = threading.active_count()
    jobs = OrderedThread("lich-test")
    assert jobs.stop(0) and threading.active_count() == before


def test_a_job_given_after_the_stop_is_refused_in_the_callers_thread_with_the_reason():
    refused = []
    jobs = OrderedThread("lich-test")
    jobs.stop(WAIT, "got SIGTERM")
    jobs.submit("late", lambda: refused.append("ran"), lambda why: refused.append((why, threading.current_thread().name)))
    assert refused == [("got SIGTERM", threading.current_thread().name)]


def test_a_stop_with_a_reason_refuses_every_queued_job_and_says_false_while_one_overruns():
    entered, release, seen = threading.Event(), threading.Event(), []
    jobs = OrderedThread("lich-test")
    jobs.submit("held", lambda: entered.set() or release.wait(WAIT), never_refused)
    for n in range(3):
        jobs.submit(f"queued {n}", lambda n=n: seen.append(("ran", n)), lambda why, n=n: seen.append((why, n)))
    assert entered.wait(WAIT)
    assert jobs.stop(0.05, "got SIGTERM") is False  # the held job overran
    assert jobs.stop(0, "a later reason") is False  # the first reason counts
    release.set()
    assert jobs.stop(WAIT)  # a second call only waits again
    assert seen == [("got SIGTERM", 0), ("got SIGTERM", 1), ("got SIGTERM", 2)]


def test_a_stop_without_a_reason_lets_the_queued_jobs_run():
    entered, release, ran = threading.Event(), threading.Event(), []
    jobs = OrderedThread("lich-test")
    jobs.submit("held", lambda: entered.set() or release.wait(WAIT), never_refused)
    jobs.submit("queued", lambda: ran.append("queued"), never_refused)
    assert entered.wait(WAIT)
    assert jobs.stop(0) is False
    release.set()
    assert jobs.stop(WAIT) and ran == ["queued"]
