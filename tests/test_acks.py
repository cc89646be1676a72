"""The ack value, encoded within lich's limit, and Acks sending it: over a
real LichClient with mocked HTTP (responses), one attempt per ack, and what
the status and the log say of each. The token would show in any text built
from the URL."""
import json
import logging
import threading
from concurrent.futures import Future
from urllib.parse import quote

import pytest
import requests
import responses

from lich_control.acks import ANSWER_UNITS, MAX_BODY_BYTES, TRUNCATED, Ack, Acks, cut_answer
from lich_control.bridge import CallResult, Turns
from lich_control.config import Config
from lich_control.lich import LichClient
from lich_control.activity import Activity

TOKEN = "ack/tok+en&x=1"
URL = f"http://127.0.0.1:4312/mod/acks?token={quote(TOKEN, safe='')}"


def ack(answer=None, error=None, ok=True):
    return Ack("s1", "m9", "ask", ok=ok, error=error, answer=answer)


def test_an_ack_carries_exactly_the_contract_fields():
    assert json.loads(Ack("s1", "m2", "abort", ok=True).body()) == {"session_id": "s1", "id": "m2", "kind": "abort", "ok": True}
    failed = json.loads(Ack("s1", "m5", "effort", ok=False, error="unknown effort").body())
    assert failed == {"session_id": "s1", "id": "m5", "kind": "effort", "ok": False, "error": "unknown effort"}


@pytest.mark.parametrize(
    "text, sent",
    [
        ("a" * ANSWER_UNITS, "a" * ANSWER_UNITS),  # exactly 16,000: whole
        ("a" * (ANSWER_UNITS + 1), "a" * ANSWER_UNITS + TRUNCATED),
        ("😀" * 8000, "😀" * 8000),  # units are UTF-16 units, not code points
        ("😀" * 8001, "😀" * 8000 + TRUNCATED),
        ("a" + "😀" * 8000, "a" + "😀" * 7999 + TRUNCATED),  # unit 16,000 is a pair's high half: never split
    ],
    ids=["exactly-16000", "one-more", "emoji-whole", "emoji-one-more", "no-split-pair"],
)
def test_an_answer_is_cut_at_16000_utf16_units_and_marked(text, sent):
    assert cut_answer(text) == sent


@pytest.mark.parametrize(
    "field, text",
    [
        ("answer", "\x01" * 20000),  # each escapes to six bytes in JSON
        ("answer", '"' * 40000),  # two bytes each
        ("answer", "\\" * 40000),
        ("answer", "字" * 40000),  # three bytes each in UTF-8
        ("answer", "😀" * 20000),
        ("answer", "\ud800" * 20000),  # lone surrogates, escaped
        ("answer", "\x00é字😀\ud83d" * 5000),
        ("error", "\x02" * 100000),  # a failed ack's error is cut the same way
    ],
    ids=lambda value: value if value in ("answer", "error") else f"{value[:4]!r}x{len(value)}",  # short: pytest puts the id in the environment, which Windows caps at 32,767
)
def test_the_body_stays_under_64_kib_whatever_its_text_holds(field, text):
    body = ack(**{field: text, "ok": field == "answer"}).body()
    assert len(body) < MAX_BODY_BYTES
    sent = json.loads(body.decode("utf-8"))
    assert sent[field].endswith(TRUNCATED)
    assert text.startswith(sent[field][: -len(TRUNCATED)])


def test_a_body_cut_for_size_keeps_as_much_as_fits():
    body = ack("\x01" * 20000).body()
    sent = json.loads(body)
    # One more escaped character (six bytes) would not have fitted.
    assert len(body) + 6 >= MAX_BODY_BYTES
    assert len(sent["answer"]) < ANSWER_UNITS


def test_lone_surrogates_travel_as_json_escapes_in_valid_utf8():
    body = ack("a\udc80b").body()
    body.decode("utf-8")  # valid UTF-8
    assert b"\\udc80" in body
    assert json.loads(body)["answer"] == "a\udc80b"


# -- sending ----------------------------------------------------------------------


@pytest.fixture
def mocked():
    with responses.RequestsMock() as rsps:
        yield rsps


@pytest.fixture
def acks():
    activity = Activity("s1", "fake", Turns())
    activity.received("m1", "abort")
    # The ack thread starts with the first ack submitted: a test that submits one stops it.
    return Acks(lambda: LichClient(Config(port=4312, token=TOKEN, session_id="s1", run_dir="/tmp/x")), activity), activity


def test_an_ack_lich_takes_is_sent_once_and_recorded_as_sent(mocked, acks, caplog):
    acks, activity = acks
    mocked.post(URL, status=204)
    caplog.set_level(logging.INFO, logger="lich_control")
    assert acks.send(Ack("s1", "m1", "abort", ok=False, error="no turn is running")) is True
    assert len(mocked.calls) == 1
    recent = activity.snapshot()["recent"][-1]
    assert (recent["id"], recent["ok"], recent["error"], recent["ack"]) == ("m1", False, "no turn is running", "sent")
    assert "acked m1 (abort): failed: no turn is running" in caplog.text


@pytest.mark.parametrize(
    "status, body, said",
    [
        (400, "unknown kind: rewind", "lich refused the ack for m1 (abort): lich refused it: 400 unknown kind: rewind"),
        (503, "busy", "dropped the ack for m1 (abort): lich refused it: 503 busy"),
        (None, requests.ConnectionError(f"Max retries exceeded with url: /mod/acks?token={quote(TOKEN, safe='')}"), "dropped the ack for m1 (abort): the exchange with lich failed"),
    ],
    ids=["refused", "5xx", "connection-error"],
)
def test_an_ack_that_does_not_land_is_dropped_not_retried_and_says_why(mocked, acks, caplog, status, body, said):
    acks, activity = acks
    mocked.post(URL, body=body, **({"status": status} if status else {}))
    assert acks.send(Ack("s1", "m1", "abort", ok=True)) is False
    assert len(mocked.calls) == 1
    snapshot = activity.snapshot()
    assert snapshot["recent"][-1]["ack"] == "dropped" and snapshot["counts"]["abort"]["unsent"] == 1
    assert said in caplog.text
    for text in (caplog.text, json.dumps(snapshot)):
        assert TOKEN not in text and quote(TOKEN, safe="") not in text


def test_an_ack_over_the_limit_even_cut_is_dropped_unsent(mocked, acks):
    acks, activity = acks
    assert acks.send(Ack("s1", "x" * MAX_BODY_BYTES, "abort", ok=True)) is False
    assert len(mocked.calls) == 0


def test_acks_sent_when_done_go_from_the_ack_thread_in_the_order_their_calls_settle(mocked, acks):
    acks, _ = acks
    mocked.post(URL, status=204)
    senders = []
    first, second = Future(), Future()
    for cid, future in (("m1", first), ("m2", second)):
        acks.send_when_done(future, lambda result, cid=cid: senders.append(threading.current_thread().name) or Ack("s1", cid, "prompt", ok=result.ok))
    assert len(mocked.calls) == 0  # not before they settle
    second.set_result(CallResult.answered(None))
    first.set_result(CallResult.answered(None))
    assert acks.stop(5)  # what was submitted before the stop goes
    assert [json.loads(call.request.body)["id"] for call in mocked.calls] == ["m2", "m1"]
    assert senders == ["lich-ack"] * 2


def test_stop_waits_for_an_ack_under_way_no_longer_than_its_timeout(mocked, acks):
    acks, _ = acks
    entered, release = threading.Event(), threading.Event()
    mocked.add_callback(responses.POST, URL, callback=lambda request: entered.set() or release.wait(5) and (204, {}, ""))
    future = Future()
    acks.send_when_done(future, lambda result: Ack("s1", "m1", "prompt", ok=True))
    future.set_result(CallResult.answered(None))
    assert entered.wait(5)
    assert acks.stop(0.05) is False
    release.set()
    for thread in threading.enumerate():
        if thread.name == "lich-ack":
            thread.join(5)  # the ack ends, then the stopped thread: before the mock does


def test_a_call_that_settles_after_stop_is_not_acked(mocked, acks):
    acks, _ = acks
    future = Future()
    acks.send_when_done(future, lambda result: Ack("s1", "m1", "prompt", ok=True))
    assert acks.stop(5)
    future.set_result(CallResult.answered(None))
    assert len(mocked.calls) == 0


def test_an_ack_whose_making_fails_is_lost_out_loud(acks, caplog):
    acks, _ = acks
    future = Future()
    acks.send_when_done(future, lambda result: 1 / 0)
    future.set_result(CallResult.answered(None))
    assert acks.stop(5)
    assert "an ack was lost" in caplog.text and "ZeroDivisionError" in caplog.text
