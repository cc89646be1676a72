"""Poller over a real LichClient with mocked HTTP (responses): what each class
of answer makes of the poll loop, what is handed on, the backoff schedule, and
stopping. `poll_once` returns the wait before the next poll, so no test waits
out a backoff."""
import collections
import json
import logging
import threading

import pytest
import responses
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import SCAN_TOKEN
from fakes import FakeEngine, ScriptedClient
from lich_control.acks import Acks
from lich_control.json_reader import MAX_VALUES
from lich_control.config import Config
from lich_control.bridge import Turns
from lich_control.lich import LichClient
from lich_control.poller import Backoff, Poller
from lich_control.worker import Asks, Worker
from lich_control.activity import Activity

URL = "http://127.0.0.1:4312/mod/commands"
HUGE = b"9" * 5000  # past the 4,300 digits int() reads


class Rig:
    """A Poller whose commands land in lists."""

    def __init__(self, client=None, on_crash=lambda reason: None):
        self.client = client or LichClient(Config(port=4312, token=SCAN_TOKEN, session_id="s1", run_dir="/tmp/x"))
        self.ordered, self.asks = [], []
        self.handed = threading.Event()
        self.activity = Activity("s1", "fake", Turns())
        self.poller = Poller(self.client, self._submit, self.asks.append, self.activity, on_crash=on_crash)

    def _submit(self, command):
        self.ordered.append(command)
        self.handed.set()

    @property
    def poll(self):
        return self.activity.snapshot()["poll"]

    @property
    def errors(self):
        return [e["what"] for e in self.activity.snapshot()["errors"]]


@pytest.fixture
def mocked():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        yield rsps


def answer(mocked, *bodies, **kw):
    for body in bodies:
        mocked.get(URL, body=body if isinstance(body, (Exception, bytes, str)) else json.dumps(body), **kw)


def abort(cid):
    return {"id": cid, "kind": "abort"}


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "lich_control.poller" and r.levelname == "WARNING"]


# -- each class of answer -------------------------------------------------------------------


def test_a_200_array_hands_every_command_on_and_polls_again_at_once(mocked):
    rig = Rig()
    answer(mocked, [{"id": "m1", "kind": "prompt", "text": "x"}, {"id": "m9", "kind": "ask", "question": "q"}])
    assert rig.poller.poll_once() == 0
    assert [c.id for c in rig.ordered] == ["m1"] and [c.id for c in rig.asks] == ["m9"]
    assert (rig.poll["state"], rig.poll["failures"]) == ("polling", 0)


FAILED = {
    "not-an-array": ({"a": 1}, {}, "lich's answer is JSON but not an array"),
    "not-json": (b"[{", {}, "lich's answer is not JSON"),
    "nested-too-deep": (b"[" * 5000 + b"]" * 5000, {}, "lich's answer is nested deeper than Python reads"),
    "too-many-values": (b"[" + b",".join([b"{}"] * MAX_VALUES) + b"]", {}, f"lich's answer was not read: the body holds more than {MAX_VALUES:,} JSON values"),
    "500": (b"oops", {"status": 500}, "lich answered 500"),
}


@pytest.mark.parametrize("body, kw, reason", list(FAILED.values()), ids=list(FAILED))
def test_any_other_answer_is_one_failed_poll_a_backoff_and_nothing_handed_on(mocked, body, kw, reason):
    rig = Rig()
    answer(mocked, body, **kw)
    assert rig.poller.poll_once() == 1.0
    assert rig.ordered == [] and rig.asks == []
    assert (rig.poll["state"], rig.poll["failures"], rig.poll["backoff"], rig.poll["reason"]) == ("backing off", 1, 1.0, reason)


def test_an_answer_that_is_not_json_keeps_its_cause_in_the_debug_log(mocked, caplog):
    caplog.set_level(logging.DEBUG, logger="lich_control.poller")
    answer(mocked, b"[{")
    Rig().poller.poll_once()
    [reading] = [r.exc_info[1] for r in caplog.records if r.exc_info]
    assert isinstance(reading, json.JSONDecodeError) and reading.pos == 2  # where the answer broke


def test_a_404_ends_polling_for_good(mocked):
    rig = Rig()
    answer(mocked, b"no such path", status=404)
    assert rig.poller.poll_once() is None
    assert (rig.poll["state"], rig.poll["reason"]) == ("stopped", "lich answered 404")
    rig.poller.start()
    rig.poller._thread.join(5)
    assert not rig.poller._thread.is_alive() and len(mocked.calls) == 2  # the thread's one poll, no other


def test_failures_follow_the_backoff_schedule_and_an_answer_resets_it(mocked):
    rig = Rig()
    answer(mocked, *[b"busy"] * 6, status=503)
    answer(mocked, [])
    answer(mocked, b"busy", b"busy", status=500)
    assert [rig.poller.poll_once() for _ in range(9)] == [1, 2, 4, 8, 10, 10, 0, 1, 2]  # doubling from 1 s, capped at 10 s


# -- what is handed on ------------------------------------------------------------------------


def test_items_without_a_usable_id_are_skipped_in_one_line_and_the_rest_go_on(mocked, caplog):
    rig = Rig()
    answer(mocked, b'["junk", {"kind": "abort"}, ' + HUGE + b', {"id": -' + HUGE + b', "kind": "abort"}, {"id": "m2", "kind": "abort"}]')
    assert rig.poller.poll_once() == 0
    assert [c.id for c in rig.ordered] == ["m2"]
    assert warnings_of(caplog) == rig.errors == ["skipped items of lich's answer: 4 not an object with an id"]


def test_a_huge_integer_costs_the_field_holding_it_not_the_answer(mocked):
    rig = Rig()
    answer(mocked, b'[{"id": "m1", "kind": "model", "model": ' + HUGE + b'}, {"id": "m2", "kind": "abort", "n": ' + HUGE + b"}]")
    assert rig.poller.poll_once() == 0
    assert [(c.id, c.problem) for c in rig.ordered] == [
        ("m1", "model must be a string, not a number"),
        ("m2", None),  # a field no kind reads
    ]


def test_a_bad_ask_goes_to_the_worker_to_be_acked_in_order(mocked):
    rig = Rig()
    answer(mocked, [{"id": "m9", "kind": "ask"}])
    rig.poller.poll_once()
    assert rig.asks == [] and rig.ordered[0].problem == "the ask has no question"


def test_an_id_lich_sends_again_in_a_later_poll_is_applied_again(mocked):
    # lich never resends: the same id later is a lich that restarted and
    # counts from m1 again, and its command must not be skipped.
    rig = Rig()
    answer(mocked, [abort("m1")], [abort("m1")])
    rig.poller.poll_once()
    rig.poller.poll_once()
    assert [c.id for c in rig.ordered] == ["m1", "m1"]


def test_every_command_with_an_id_is_handed_on_however_many_the_value_bound_lets_in(mocked, caplog):
    # Each costs its braces and a comma (json_reader's count): 24,000 such
    # aborts are just within MAX_VALUES, and past the 10,000 this poller
    # once dropped unread, unacked.
    rig = Rig()
    answer(mocked, [abort(f"m{n}") for n in range(24_000)])
    assert rig.poller.poll_once() == 0
    assert [c.id for c in rig.ordered] == [f"m{n}" for n in range(24_000)]
    assert warnings_of(caplog) == [] and rig.poll["failures"] == 0


items = st.one_of(
    st.fixed_dictionaries({"id": st.sampled_from(["m1", "m2", "m3", "", 7, None]), "kind": st.sampled_from(["abort", "ask", "prompt", "rewind", 3])}),
    st.none() | st.integers() | st.text(max_size=4),
)
bodies = st.one_of(
    st.lists(items, max_size=6).map(lambda answer: json.dumps(answer).encode()),
    st.lists(items, max_size=6).map(lambda answer: json.dumps(answer).encode()).flatmap(lambda b: st.integers(0, len(b)).map(lambda n: b[:n])),
    st.binary(max_size=30),
)


@settings(max_examples=200, deadline=None)
@given(body=bodies)
def test_any_body_is_commands_each_with_a_usable_id_handed_on_or_one_failed_poll(body):
    rig = Rig()
    with responses.RequestsMock() as mocked:
        answer(mocked, body)
        delay = rig.poller.poll_once()
    rig.client.close()
    try:
        read = json.loads(body)
    except ValueError:
        read = None
    if isinstance(read, list):
        wanted = [i["id"] for i in read if isinstance(i, dict) and isinstance(i.get("id"), str) and i["id"]]
        assert delay == 0 and collections.Counter(c.id for c in rig.ordered + rig.asks) == collections.Counter(wanted)
    else:
        assert delay == 1.0 and rig.ordered == rig.asks == [] and rig.poll["failures"] == 1


# -- the thread and stopping ------------------------------------------------------------------


def test_stop_cuts_a_parked_poll_and_ends_the_thread():
    client = ScriptedClient([])  # parks until abandoned, as a held poll does
    rig = Rig(client=client)
    rig.poller.start()
    assert rig.poller.stop(timeout=5)
    assert client.abandoned.is_set()


def test_commands_from_a_poll_that_returns_during_stop_are_still_handed_on(mocked):
    # lich handed them out once: the stopped worker acks each as never applied.
    rig = Rig()
    answer(mocked, [abort("m1")])
    rig.poller._stop.set()  # the stop arrived while the poll was out
    assert rig.poller.poll_once() is None
    assert [c.id for c in rig.ordered] == ["m1"]


def test_a_stop_while_an_answer_is_handed_on_leaves_every_command_acked_once(mocked):
    # The daemon's shutdown, in its order, begun after the first command of
    # 2,000 was handed on: the poller ends, the worker and the asks stop
    # taking work, the session's calls fail, and each thread finishes.
    client, engine = ScriptedClient(), FakeEngine()
    activity = Activity("s1", "fake", Turns())
    acks = Acks(lambda: client, activity)
    worker = Worker(engine, Turns(), acks, activity, "s1")
    asks = Asks(engine, acks, activity, "s1")
    poller = Poller(LichClient(Config(port=4312, token=SCAN_TOKEN, session_id="s1", run_dir="/tmp/x")), None, asks.submit, activity)

    def submit_then_stop(command):
        worker.submit(command)
        poller._stop.set()  # a SIGTERM, as the first command goes on

    poller._submit = submit_then_stop
    sent = [{"id": f"m{n}", "kind": "ask", "question": "q"} if n % 10 == 9 else {"id": f"m{n}", "kind": "prompt", "text": "x"} for n in range(2000)]
    answer(mocked, sent)
    assert poller.poll_once() is None
    worker.stop(0, "got SIGTERM")
    asks.stop(0, "got SIGTERM")
    engine.close("the daemon stopped before the session answered (got SIGTERM)")
    assert worker.stop(10) and asks.stop(10)
    client.wait_acks(2000, timeout=10)
    assert acks.stop(10)
    assert collections.Counter(a.id for a in client.acks) == collections.Counter(c["id"] for c in sent)
    assert all(not a.ok and "got SIGTERM" in a.error for a in client.acks)


def test_a_poll_whose_handling_fails_is_a_failed_poll_and_polling_goes_on():
    # One second of real backoff between the two polls: the thread's own wait.
    client = ScriptedClient([RuntimeError("a bug in the client"), [abort("m1")]])
    rig = Rig(client=client)
    rig.poller.start()
    try:
        assert rig.handed.wait(10)
    finally:
        assert rig.poller.stop(timeout=5)
    assert [c.id for c in rig.ordered] == ["m1"] and rig.poll["failures"] == 1


def test_a_poller_that_cannot_even_count_a_failure_says_so_and_ends(monkeypatch):
    crashed, escaped = [], []
    rig = Rig(client=ScriptedClient([RuntimeError("a bug in the client")]), on_crash=crashed.append)
    monkeypatch.setattr(rig.activity, "poll_failed", lambda reason, backoff: 1 / 0)
    monkeypatch.setattr(threading, "excepthook", lambda args: escaped.append(args.exc_type))
    rig.poller.start()
    rig.poller._thread.join(5)
    assert crashed == ["the poller failed"] and escaped == [ZeroDivisionError] and not rig.poller._thread.is_alive()
