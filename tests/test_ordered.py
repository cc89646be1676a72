"""OrderedThread: the one shape of "one ordered thread" (the worker's, the
asks', the acks'): jobs in order, a bug costing its job alone, nothing taken
after stop, and stop(timeout) saying whether the thread ended."""
import threading

from lich_control.ordered import OrderedThread

WAIT = 5.0


def test_jobs_run_one_at_a_time_in_order_and_a_failing_one_costs_itself_alone(caplog):
    ran = []
    jobs = OrderedThread("lich-test")
    for n in range(5):
        assert jobs.submit(f"job {n}", lambda n=n: ran.append(n) if n != 2 else 1 / 0)
    assert jobs.stop(WAIT)
    assert ran == [0, 1, 3, 4]
    assert "job 2 was lost" in caplog.text and "ZeroDivisionError" in caplog.text


def test_a_thread_never_given_a_job_is_never_started_and_stops_at_once():
    before = threading.active_count()
    jobs = OrderedThread("lich-test")
    assert jobs.stop(0) and threading.active_count() == before
    assert jobs.submit("late", lambda: None) is False


def test_stop_lets_queued_jobs_run_and_says_false_while_one_overruns_its_timeout():
    entered, release, ran = threading.Event(), threading.Event(), []
    jobs = OrderedThread("lich-test")
    jobs.submit("held", lambda: entered.set() or release.wait(WAIT))
    jobs.submit("queued", lambda: ran.append(jobs.stopping))
    assert entered.wait(WAIT)
    assert jobs.stop(0.05) is False  # the held job overran
    assert jobs.submit("after the stop", lambda: ran.append("never")) is False
    release.set()
    assert jobs.stop(WAIT)  # a second call only waits again
    assert ran == [True]  # the queued job ran, and could see the stop
