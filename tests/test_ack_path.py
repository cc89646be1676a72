"""The ack path over a real LichClient with mocked HTTP (responses): one
attempt per ack, what the status document and the log say of each outcome,
and the Acker thread sending in order. The token would show in any text
built from the URL."""
import json
import logging
from urllib.parse import quote

import pytest
import requests
import responses

from lich_control.ack import Ack
from lich_control.acker import Acker, send_ack
from lich_control.config import Config
from lich_control.engine import Turns
from lich_control.lich import LichClient
from lich_control.activity import Activity

TOKEN = "ack/tok+en&x=1"
URL = f"http://127.0.0.1:4312/mod/acks?token={quote(TOKEN, safe='')}"


@pytest.fixture
def mocked():
    with responses.RequestsMock() as rsps:
        yield rsps


def client():
    return LichClient(Config(port=4312, token=TOKEN, session_id="s1", run_dir="/tmp/x"))


@pytest.fixture
def activity():
    activity = Activity("s1", "fake", Turns())
    activity.received("m1", "abort")
    return activity


def no_token_in(*texts):
    for text in texts:
        assert TOKEN not in text and quote(TOKEN, safe="") not in text


def test_an_ack_lich_takes_is_sent_once_and_recorded_as_sent(mocked, activity, caplog):
    mocked.post(URL, status=204)
    caplog.set_level(logging.INFO, logger="lich_control")
    assert send_ack(client(), activity, Ack("s1", "m1", "abort", ok=False, error="no turn is running")) is True
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
def test_an_ack_that_does_not_land_is_dropped_not_retried_and_says_why(mocked, activity, caplog, status, body, said):
    mocked.post(URL, body=body, **({"status": status} if status else {}))
    assert send_ack(client(), activity, Ack("s1", "m1", "abort", ok=True)) is False
    assert len(mocked.calls) == 1
    snapshot = activity.snapshot()
    assert snapshot["recent"][-1]["ack"] == "dropped" and snapshot["counts"]["abort"]["unsent"] == 1
    assert said in caplog.text
    no_token_in(caplog.text, json.dumps(snapshot))


def test_the_acker_sends_what_settles_in_order_and_drains_at_stop(mocked, activity):
    mocked.post(URL, status=204)
    acker = Acker(client, activity)
    acker.start()
    for n in range(5):
        acker.submit(Ack("s1", f"m{n}", "prompt", ok=True))
    assert acker.stop(timeout=5)  # what was queued before the stop is sent
    assert [json.loads(c.request.body)["id"] for c in mocked.calls] == [f"m{n}" for n in range(5)]
