import threading

from freezegun import freeze_time

from lich_control.status import Activity
from lich_control.engine import Turns
from lich_control.lich import LichGone, PollFailed
from lich_control.poller import Poller

from fakes import ScriptedClient


def make(script):
    client = ScriptedClient(script)
    ordered, asks, waits = [], [], []
    activity = Activity("s1", "fake", Turns())

    def wait(delay):
        waits.append(delay)
        return False  # not stopped

    poller = Poller(client, ordered.append, asks.append, activity, wait=wait)
    return poller, client, ordered, asks, waits, activity


def test_a_200_hands_every_command_on_and_polls_again_at_once():
    poller, _, ordered, asks, waits, _ = make([[{"id": "m1", "kind": "prompt", "text": "x"}, {"id": "m9", "kind": "ask", "question": "q"}]])
    assert poller.poll_once() is True
    assert [c.id for c in ordered] == ["m1"]
    assert [c.id for c in asks] == ["m9"]
    assert waits == []  # no delay before the next poll


def test_failures_follow_the_backoff_schedule_and_a_200_resets_it():
    failures = [PollFailed("lich answered 503")] * 6
    poller, _, _, _, waits, _ = make(failures + [[]] + [PollFailed("lich answered 500")])
    for _ in range(8):
        assert poller.poll_once() is True
    assert waits == [1, 2, 4, 8, 10, 10, 1]


def test_a_404_stops_polling_for_good():
    poller, client, _, _, waits, activity = make([LichGone("lich answered 404"), []])
    assert poller.poll_once() is False
    assert client.polls == 1 and waits == []
    assert activity.snapshot()["poll"]["state"] == "stopped"
    assert activity.snapshot()["poll"]["reason"] == "lich answered 404"


def test_the_poll_loop_ends_after_a_404_without_another_request():
    poller, client, _, _, _, _ = make([LichGone("lich answered 404")])
    poller.start()
    poller.join(5)
    assert poller.stopped and client.polls == 1


def test_an_item_without_an_id_is_skipped_and_the_rest_still_go_on():
    poller, _, ordered, _, _, activity = make([["junk", {"kind": "abort"}, {"id": "m2", "kind": "abort"}]])
    assert poller.poll_once() is True
    assert [c.id for c in ordered] == ["m2"]
    errors = [e["what"] for e in activity.snapshot()["errors"]]
    assert any("not a JSON object" in e for e in errors) and any("no id" in e for e in errors)


def test_a_bad_ask_goes_to_the_worker_to_be_acked_in_order():
    poller, _, ordered, asks, _, _ = make([[{"id": "m9", "kind": "ask"}]])
    poller.poll_once()
    assert asks == [] and ordered[0].problem.startswith("question must be")


def test_a_command_delivered_twice_is_applied_once():
    poller, _, ordered, _, _, _ = make([[{"id": "m2", "kind": "abort"}], [{"id": "m2", "kind": "abort"}]])
    poller.poll_once()
    poller.poll_once()
    assert [c.id for c in ordered] == ["m2"]


def test_stop_cuts_a_parked_poll_and_ends_the_thread():
    poller, client, _, _, _, _ = make([])
    client_parked = threading.Event()
    original = client.poll

    def parked_poll():
        client_parked.set()
        return original()

    client.poll = parked_poll
    poller.start()
    assert client_parked.wait(5)
    assert poller.stop(timeout=5)
    assert client.abandoned.is_set()


def test_commands_from_a_poll_that_returns_during_stop_are_not_applied():
    poller, _, ordered, _, _, _ = make([[{"id": "m1", "kind": "abort"}]])
    poller._stop.set()  # the stop arrived while the poll was out
    assert poller.poll_once() is False
    assert ordered == []


def test_the_status_tells_how_long_until_the_next_poll():
    with freeze_time("2026-11-30 12:00:00") as clock:
        poller, _, _, _, _, activity = make([PollFailed("lich answered 503")] * 3)
        poller.poll_once()
        poller.poll_once()
        poller.poll_once()
        clock.tick(1.5)
        poll = activity.snapshot()["poll"]
    assert (poll["state"], poll["backoff"], poll["retry_in_s"]) == ("backing off", 4, 2.5)
    assert poll["reason"] == "lich answered 503" and poll["failures"] == 3
