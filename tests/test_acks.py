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


def units(text):
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def ack(answer=None, error=None, ok=True):
    return Ack("s1", "m9", "ask", ok=ok, error=error, answer=answer)


def test_an_ack_carries_exactly_the_contract_fields():
    assert json.loads(Ack("s1", "m2", "abort", ok=True).body()) == {"session_id": "s1", "id": "m2", "kind": "abort", "ok": True}
    failed = json.loads(Ack("s1", "m5", "effort", ok=False, error="unknown effort").body())
    assert failed == {"session_id": "s1", "id": "m5", "kind": "effort", "ok": False, "error": "unknown effort"}


def test_an_answer_of_exactly_16000_units_is_left_whole():
    text = "a" * ANSWER_UNITS
    assert cut_answer(text) == text


def test_an_answer_one_unit_longer_is_cut_and_marked():
    text = "a" * (ANSWER_UNITS + 1)
    assert cut_answer(text) == "a" * ANSWER_UNITS + TRUNCATED


def test_units_are_utf16_units_not_code_points():
    # 8,000 emoji are 16,000 units: whole. One more is over.
    assert cut_answer("😀" * 8000) == "😀" * 8000
    assert cut_answer("😀" * 8001) == "😀" * 8000 + TRUNCATED


def test_a_cut_never_splits_a_surrogate_pair():
    text = "a" + "😀" * 8000  # unit 16,000 is the high half of a pair
    cut = cut_answer(text)
    assert cut == "a" + "😀" * 7999 + TRUNCATED
    assert units(cut[: -len(TRUNCATED)]) == ANSWER_UNITS - 1


@pytest.mark.parametrize(
    "answer",
    [
        "\x01" * 20000,  # each escapes to six bytes in JSON
        '"' * 40000,  # two bytes each
        "\\" * 40000,
        "字" * 40000,  # three bytes each in UTF-8
        "😀" * 20000,
        "\ud800" * 20000,  # lone surrogates, escaped
        ("\x00é字😀\ud83d" * 5000),
    ],
)
def test_the_body_stays_under_64_kib_whatever_the_answer_holds(answer):
    body = ack(answer).body()
    assert len(body) < MAX_BODY_BYTES
    sent = json.loads(body.decode("utf-8"))
    assert sent["answer"].endswith(TRUNCATED)
    assert answer.startswith(sent["answer"][: -len(TRUNCATED)])


def test_a_body_cut_for_size_keeps_as_much_as_fits():
    body = ack("\x01" * 20000).body()
    sent = json.loads(body)
    # One more escaped character (six bytes) would not have fitted.
    assert len(body) + 6 >= MAX_BODY_BYTES
    assert len(sent["answer"]) < ANSWER_UNITS


def test_a_huge_error_is_cut_to_fit_too():
    body = Ack("s1", "m1", "prompt", ok=False, error="\x02" * 100000).body()
    assert len(body) < MAX_BODY_BYTES
    assert json.loads(body)["error"].endswith(TRUNCATED)


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
    acks = Acks(lambda: LichClient(Config(port=4312, token=TOKEN, session_id="s1", run_dir="/tmp/x")), activity)
    yield acks, activity
    acks.stop(5)


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


def test_an_ack_sent_when_done_goes_from_a_pool_thread_once_the_call_settles(mocked, acks):
    acks, _ = acks
    mocked.post(URL, status=204)
    senders = []
    future = Future()
    acks.send_when_done(future, lambda result: senders.append(threading.current_thread().name) or Ack("s1", "m1", "prompt", ok=result.ok))
    assert len(mocked.calls) == 0  # not before it settles
    future.set_result(CallResult.answered(None))
    assert acks.stop(5)  # what was handed on before the stop goes
    assert len(mocked.calls) == 1 and json.loads(mocked.calls[0].request.body)["id"] == "m1"
    assert senders[0].startswith("lich-ack") and senders[0] != threading.current_thread().name


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
