import json

import pytest
import requests
import responses

from lich_control import __version__
from lich_control.acks import Ack
from lich_control.config import Config
from lich_control.lich import AckFailed, LichClient, LichGone, PollFailed, MAX_POLL_BODY

TOKEN = "sekrit/+&token"
CONFIG = Config(port=4242, token=TOKEN, session_id="s 1", run_dir="/tmp/x")
POLL = "http://127.0.0.1:4242/mod/commands"
ACKS = "http://127.0.0.1:4242/mod/acks"


@pytest.fixture
def client():
    return LichClient(CONFIG)


@responses.activate
def test_poll_sends_token_session_and_plugin_header(client):
    responses.get(POLL, json=[{"id": "m1", "kind": "abort"}])
    assert client.poll() == [{"id": "m1", "kind": "abort"}]
    request = responses.calls[0].request
    assert request.headers["X-Lich-Plugin"] == __version__
    assert "token=sekrit%2F%2B%26token" in request.url
    assert "session_id=s%201" in request.url


@responses.activate
def test_404_means_lich_predates_the_contract(client):
    responses.get(POLL, status=404)
    with pytest.raises(LichGone):
        client.poll()


@pytest.mark.parametrize("status", [500, 502, 503, 401, 400, 302, 204])
@responses.activate
def test_any_other_status_is_a_failed_poll(client, status):
    responses.get(POLL, status=status, body="")
    with pytest.raises(PollFailed, match=f"lich answered {status}"):
        client.poll()


@pytest.mark.parametrize("body, why", [("{}", "not an array"), ('"x"', "not an array"), ("{", "not JSON"), ("", "not JSON")])
@responses.activate
def test_a_200_that_is_not_a_json_array_is_a_failed_poll(client, body, why):
    responses.get(POLL, body=body, status=200)
    with pytest.raises(PollFailed, match=why):
        client.poll()


@responses.activate
def test_an_oversized_poll_body_is_a_failed_poll(client):
    responses.get(POLL, body=b"[" + b" " * (MAX_POLL_BODY + 10) + b"]", status=200)
    with pytest.raises(PollFailed, match="over 16 MiB"):
        client.poll()


@pytest.mark.parametrize(
    "exc, phrase",
    [
        (requests.ConnectTimeout("http://127.0.0.1:4242/mod/commands?token=" + TOKEN), "could not connect"),
        (requests.ReadTimeout("http://127.0.0.1:4242/mod/commands?token=" + TOKEN), "did not answer in time"),
        (requests.ConnectionError("Connection refused: url=/mod/commands?token=" + TOKEN), "nothing listens on port 4242"),
        (requests.exceptions.ChunkedEncodingError("token=" + TOKEN), "broke off"),
    ],
)
@responses.activate
def test_network_errors_become_phrases_without_the_url_or_token(client, exc, phrase):
    responses.get(POLL, body=exc)
    with pytest.raises(PollFailed) as caught:
        client.poll()
    assert phrase in str(caught.value)
    assert TOKEN not in str(caught.value) and "token" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


@responses.activate
def test_ack_posts_the_json_body_with_the_plugin_header(client):
    responses.post(ACKS, status=204)
    client.ack(Ack("s 1", "m2", "abort", ok=True))
    request = responses.calls[0].request
    assert json.loads(request.body) == {"session_id": "s 1", "id": "m2", "kind": "abort", "ok": True}
    assert request.headers["X-Lich-Plugin"] == __version__
    assert request.headers["Content-Type"] == "application/json"
    assert "token=sekrit%2F%2B%26token" in request.url


@responses.activate
def test_an_ack_lich_refuses_says_lichs_reason_and_is_marked_refused(client):
    responses.post(ACKS, status=400, body="only an answered ask carries an answer")
    with pytest.raises(AckFailed) as caught:
        client.ack(Ack("s1", "m1", "prompt", ok=True))
    assert caught.value.refused
    assert "400 only an answered ask carries an answer" in str(caught.value)


@responses.activate
def test_an_ack_that_cannot_be_sent_says_why_without_the_token(client):
    responses.post(ACKS, body=requests.ConnectionError("reset by peer ?token=" + TOKEN))
    with pytest.raises(AckFailed) as caught:
        client.ack(Ack("s1", "m1", "prompt", ok=True))
    assert not caught.value.refused
    assert TOKEN not in str(caught.value)


@responses.activate
def test_a_5xx_ack_is_a_failure_not_a_refusal(client):
    responses.post(ACKS, status=503, body="busy")
    with pytest.raises(AckFailed) as caught:
        client.ack(Ack("s1", "m1", "prompt", ok=True))
    assert not caught.value.refused


def test_the_config_repr_leaves_the_token_out():
    assert TOKEN not in repr(CONFIG)
