from lich_control.backoff import Backoff


def schedule(failures):
    backoff, delays = Backoff(), []
    for _ in range(failures):
        backoff = backoff.failed()
        delays.append(backoff.delay)
    return delays


def test_starts_at_one_second_and_doubles_to_a_ten_second_cap():
    assert schedule(7) == [1, 2, 4, 8, 10, 10, 10]


def test_a_success_resets_to_no_delay_and_the_next_failure_starts_over():
    backoff = Backoff().failed().failed().failed()
    assert backoff.delay == 4
    assert backoff.succeeded().delay == 0
    assert backoff.succeeded().failed().delay == 1


def test_backoff_is_a_value_each_caller_keeps_its_own():
    first = Backoff().failed()
    second = first.failed()
    assert (first.delay, second.delay) == (1, 2)
