"""Poller over a real LichClient with mocked HTTP (responses): what each
answer class makes of the poll loop, and the backoff schedule on a frozen
clock. The wait between polls is injected, so no test waits in real time."""
import threading
import time

import pytest
import requests
import responses
from freezegun import freeze_time

from lich_control.config import Config
from lich_control.engine import Turns
from lich_control.lich import MAX_POLL_BODY, LichClient
from lich_control.poller import Poller
from lich_control.activity import Activity

from fakes import ScriptedClient

URL = "http://127.0.0.1:4312/mod/commands"


class Rig:
    """A Poller whose commands land in lists and whose waits are recorded."""

    def __init__(self, client=None, wait=None):
        self.client = client or LichClient(Config(port=4312, token="tok", session_id="s1", run_dir="/tmp/x"))
        self.ordered, self.asks, self.waits = [], [], []
        self.activity = Activity("s1", "fake", Turns())
        self.poller = Poller(self.client, self.ordered.append, self.asks.append, self.activity, wait=wait or self._wait)

    def _wait(self, delay):
        self.waits.append(delay)
        return False  # not stopped

    @property
    def poll(self):
        return self.activity.snapshot()["poll"]


@pytest.fixture
def mocked():
    with responses.RequestsMock() as rsps:
        yield rsps


def answer(mocked, *bodies, **kw):
    for body in bodies:
        if isinstance(body, (Exception, bytes, str)):
            mocked.get(URL, body=body, **kw)
        else:
            mocked.get(URL, json=body, **kw)


# -- each answer class ------------------------------------------------------------


def test_a_200_array_hands_every_command_on_and_polls_again_at_once(mocked):
    rig = Rig()
    answer(mocked, [{"id": "m1", "kind": "prompt", "text": "x"}, {"id": "m9", "kind": "ask", "question": "q"}])
    assert rig.poller.poll_once() is True
    assert [c.id for c in rig.ordered] == ["m1"] and [c.id for c in rig.asks] == ["m9"]
    assert rig.waits == []
    assert rig.poll["state"] == "polling" and rig.poll["failures"] == 0


FAILED = {
    "200-not-an-array": ({"a": 1}, {}),
    "200-not-json": (b"[{", {}),
    "200-not-json-from-the-start": (b"{", {}),
    "200-bad-utf8-outside-any-item": (b'\xff[{"id": "m1", "kind": "abort"}]', {}),
    "204": (b"", {"status": 204}),
    "400-with-a-reason": (b"session_id is required", {"status": 400}),
    "401": (b"wrong token", {"status": 401}),
    "500": (b"oops", {"status": 500}),
    "503": (b"busy", {"status": 503}),
    "connection-error": (requests.ConnectionError("refused"), {}),
    "read-timeout": (requests.ReadTimeout("slow"), {}),
    "oversize": (b"[" + b" " * MAX_POLL_BODY + b"]", {}),
}


@pytest.mark.parametrize("body, kw", list(FAILED.values()), ids=list(FAILED))
def test_any_other_answer_is_one_failed_poll_then_a_backoff_and_polling_goes_on(mocked, body, kw):
    rig = Rig()
    answer(mocked, body, **kw)
    assert rig.poller.poll_once() is True
    assert rig.waits == [1.0]
    assert rig.ordered == [] and rig.asks == []
    assert (rig.poll["state"], rig.poll["failures"], rig.poll["backoff"]) == ("backing off", 1, 1.0)
    assert rig.poll["reason"]


def test_a_404_ends_the_poll_loop_without_another_request(mocked):
    rig = Rig()
    answer(mocked, b"no such path", status=404)
    rig.poller.start()
    rig.poller.join(5)
    assert rig.poller.stopped and len(mocked.calls) == 1 and rig.waits == []
    assert (rig.poll["state"], rig.poll["reason"]) == ("stopped", "lich answered 404")


# -- the schedule, on a frozen clock ----------------------------------------------


def test_failures_follow_the_backoff_schedule_and_a_200_resets_it(mocked):
    sent = []
    with freeze_time("2026-11-30 12:00:00") as clock:

        def wait(delay):
            clock.tick(delay)  # the wait passes on the frozen clock, at once
            return False

        rig = Rig(wait=wait)
        mocked.add_callback(responses.GET, URL, callback=lambda request: (sent.append(time.monotonic()), (503, {}, b"busy"))[1])
        for _ in range(7):
            rig.poller.poll_once()
        mocked.replace(responses.GET, URL, json=[])
        rig.poller.poll_once()
        mocked.replace(responses.GET, URL, body=b"busy", status=500)
        rig.poller.poll_once()
        rig.poller.poll_once()
    gaps = [round(b - a, 3) for a, b in zip(sent, sent[1:])]
    assert gaps == [1, 2, 4, 8, 10, 10]  # doubling from 1 s, capped at 10 s
    assert rig.poll["backoff"] == 2  # the 200 reset it: 1 s, then 2 s again


def test_the_status_tells_how_long_until_the_next_poll(mocked):
    answer(mocked, b"busy", b"busy", b"busy", status=503)
    with freeze_time("2026-11-30 12:00:00") as clock:
        rig = Rig()
        for _ in range(3):
            rig.poller.poll_once()
        clock.tick(1.5)
        poll = rig.poll
        clock.tick(30)
        later = rig.poll
    assert (poll["state"], poll["backoff"], poll["retry_in_s"]) == ("backing off", 4, 2.5)
    assert (poll["last_poll_age_s"], poll["last_answer_age_s"]) == (1.5, None)
    assert poll["reason"] == "lich answered 503" and poll["failures"] == 3
    assert (later["retry_in_s"], later["last_poll_age_s"]) == (0.0, 31.5)


# -- what is handed on --------------------------------------------------------------


def test_an_item_without_an_id_is_skipped_and_the_rest_still_go_on(mocked):
    rig = Rig()
    answer(mocked, ["junk", {"kind": "abort"}, {"id": "m2", "kind": "abort"}])
    assert rig.poller.poll_once() is True
    assert [c.id for c in rig.ordered] == ["m2"]
    errors = [e["what"] for e in rig.activity.snapshot()["errors"]]
    assert any("not a JSON object" in e for e in errors) and any("no id" in e for e in errors)


def test_a_bad_ask_goes_to_the_worker_to_be_acked_in_order(mocked):
    rig = Rig()
    answer(mocked, [{"id": "m9", "kind": "ask"}])
    rig.poller.poll_once()
    assert rig.asks == [] and rig.ordered[0].problem.startswith("question must be")


def test_an_id_lich_sends_again_in_a_later_poll_is_applied_again(mocked):
    # lich never resends: the same id later is a lich that restarted and
    # counts from m1 again, and its command must not be skipped.
    rig = Rig()
    answer(mocked, [{"id": "m1", "kind": "abort"}], [{"id": "m1", "kind": "abort"}])
    rig.poller.poll_once()
    rig.poller.poll_once()
    assert [c.id for c in rig.ordered] == ["m1", "m1"]


def test_an_id_repeated_within_one_answer_is_applied_once_with_one_line(mocked, caplog):
    rig = Rig()
    answer(mocked, [{"id": "m2", "kind": "abort"}, {"id": "m2", "kind": "model"}, {"id": "m3", "kind": "abort"}, {"id": "m2", "kind": "abort"}])
    rig.poller.poll_once()
    assert [(c.id, c.kind) for c in rig.ordered] == [("m2", "abort"), ("m3", "abort")]
    lines = [r.getMessage() for r in caplog.records if r.name == "lich_control.poller" and r.levelname == "WARNING"]
    assert len(lines) == 1 and "given twice" in lines[0] and "×2" in lines[0] and "'m2'" in lines[0]


# -- stopping -------------------------------------------------------------------------


def test_stop_cuts_a_parked_poll_and_ends_the_thread():
    client = ScriptedClient([])  # parks until abandoned, as a held poll does
    parked = threading.Event()
    original = client.poll

    def parked_poll():
        parked.set()
        return original()

    client.poll = parked_poll
    rig = Rig(client=client)
    rig.poller.start()
    assert parked.wait(5)
    assert rig.poller.stop(timeout=5)
    assert client.abandoned.is_set()


def test_commands_from_a_poll_that_returns_during_stop_are_not_applied(mocked):
    rig = Rig()
    answer(mocked, [{"id": "m1", "kind": "abort"}])
    rig.poller._stop.set()  # the stop arrived while the poll was out
    assert rig.poller.poll_once() is False
    assert rig.ordered == []
