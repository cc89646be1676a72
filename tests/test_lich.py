"""LichClient with mocked HTTP (responses): what every request carries, and
what each class of answer or failure becomes. The token below would show in
any text built from a URL: no error may carry it."""
import http.client
import json
from urllib.parse import quote

import pytest
import requests
import responses
import urllib3

from lich_control import CONTRACT_RELEASE, __version__
from lich_control.acks import Ack
from lich_control.config import Config
from lich_control.lich import MAX_ACK_ANSWER, MAX_POLL_BODY, AckFailed, LichClient, LichGone, PollFailed

TOKEN = "sekrit/+&token=1"
SESSION = "s 1/é?"
PORT = 4312
POLL_URL = f"http://127.0.0.1:{PORT}/mod/commands?token={quote(TOKEN, safe='')}&session_id={quote(SESSION, safe='')}"
ACK_URL = f"http://127.0.0.1:{PORT}/mod/acks?token={quote(TOKEN, safe='')}"


@pytest.fixture
def mocked():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        yield rsps


@pytest.fixture
def client():
    client = LichClient(Config(port=PORT, token=TOKEN, session_id=SESSION, run_dir="/tmp/x"))
    yield client
    client.close()


def leaky(kind, url=POLL_URL):
    """An exception as requests words it: the URL, and so the token, in its text."""
    return kind(f"HTTPConnectionPool(host='127.0.0.1', port={PORT}): Max retries exceeded with url: {url}")


def assert_safe(exc):
    for form in (TOKEN, quote(TOKEN, safe=""), "token="):
        assert form not in str(exc)
    # Raised from no exception, or with the one it replaced hidden.
    assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)


# -- what goes out -------------------------------------------------------------


def test_a_poll_is_a_get_with_the_token_and_session_url_encoded(mocked, client):
    mocked.get(POLL_URL, json=[])
    client.poll()
    sent = mocked.calls[0].request
    assert sent.method == "GET" and sent.url == POLL_URL
    assert sent.body is None


def test_every_request_names_the_contract_release_not_the_package_version(mocked, client):
    mocked.get(POLL_URL, json=[])
    mocked.post(ACK_URL, status=204)
    client.poll()
    client.ack(Ack(SESSION, "m1", "abort", ok=True))
    for call in mocked.calls:
        assert call.request.headers["X-Lich-Plugin"] == CONTRACT_RELEASE == "0.16.0"
        assert call.request.headers["X-Lich-Plugin"] != __version__
        assert call.request.headers["Accept"] == "application/json"
        assert call.request.headers["User-Agent"] == f"lich-control/{__version__}"


def test_an_ack_posts_its_json_body(mocked, client):
    mocked.post(ACK_URL, status=204)
    client.ack(Ack(SESSION, "m2", "effort", ok=False, error="unknown effort"))
    sent = mocked.calls[0].request
    assert sent.method == "POST" and sent.url == ACK_URL
    assert sent.headers["Content-Type"] == "application/json"
    assert json.loads(sent.body) == {"session_id": SESSION, "id": "m2", "kind": "effort", "ok": False, "error": "unknown effort"}
    assert sent.headers["Content-Length"] == str(len(sent.body))


def test_each_ack_carries_its_own_body(mocked, client):
    mocked.post(ACK_URL, status=204)
    client.ack(Ack(SESSION, "m1", "abort", ok=True))
    client.ack(Ack(SESSION, "m2", "abort", ok=True))
    assert [json.loads(c.request.body)["id"] for c in mocked.calls] == ["m1", "m2"]


# -- poll answers ----------------------------------------------------------------


def test_a_200_array_is_the_commands_oldest_first(mocked, client):
    mocked.get(POLL_URL, json=[{"id": "m1", "kind": "abort"}, {"id": "m2", "kind": "abort"}])
    assert [c["id"] for c in client.poll()] == ["m1", "m2"]


@pytest.mark.parametrize(
    "body, why",
    [(b"{}", "not an array"), (b'"x"', "not an array"), (b"null", "not an array"), (b"{", "not JSON"), (b"", "not JSON"), (b"\xff[]", "not JSON")],
)
def test_a_200_that_is_not_a_json_array_is_a_failed_poll(mocked, client, body, why):
    mocked.get(POLL_URL, body=body)
    with pytest.raises(PollFailed, match=why) as caught:
        client.poll()
    assert_safe(caught.value)


def test_a_404_means_lich_predates_the_contract(mocked, client):
    mocked.get(POLL_URL, status=404, body="no such path")
    with pytest.raises(LichGone, match="lich answered 404"):
        client.poll()


@pytest.mark.parametrize("status", [204, 302, 400, 401, 403, 500, 502, 503])
def test_any_other_status_is_a_failed_poll_named_by_its_status(mocked, client, status):
    mocked.get(POLL_URL, status=status, body="" if status == 204 else f"reason for {status}", headers={"Location": "/elsewhere"} if status == 302 else {})
    with pytest.raises(PollFailed, match=f"^lich answered {status}$") as caught:
        client.poll()
    assert_safe(caught.value)
    assert len(mocked.calls) == 1  # a redirect is not followed, nothing is resent


@pytest.mark.parametrize(
    "failure, phrase",
    [
        (leaky(requests.ConnectionError), "exchange with lich failed"),
        (leaky(requests.ConnectTimeout), f"could not connect to lich on port {PORT} in time"),
        (leaky(requests.ReadTimeout), "^lich did not answer within 30 s$"),
        (leaky(requests.exceptions.ChunkedEncodingError), "lich's answer broke off"),
        (leaky(urllib3.exceptions.ResponseNotChunked), "exchange with lich failed"),  # one requests lets through
        (leaky(http.client.LineTooLong), "lich's answer was not HTTP"),
    ],
    ids=["connection-error", "connect-timeout", "read-timeout", "broken-body", "urllib3-error", "http-client-error"],
)
def test_a_poll_that_fails_on_the_way_is_a_failed_poll_without_the_token(mocked, client, failure, phrase):
    mocked.get(POLL_URL, body=failure)
    with pytest.raises(PollFailed, match=phrase) as caught:
        client.poll()
    assert_safe(caught.value)
    assert len(mocked.calls) == 1  # never retried


def test_a_poll_body_over_the_limit_is_a_failed_poll(mocked, client):
    mocked.get(POLL_URL, body=b"[" + b" " * MAX_POLL_BODY + b"]")
    with pytest.raises(PollFailed, match="over 16 MiB") as caught:
        client.poll()
    assert_safe(caught.value)


def test_a_declared_length_over_the_limit_is_refused_before_reading(mocked, client):
    mocked.get(POLL_URL, body=b"[]", headers={"Content-Length": str(MAX_POLL_BODY + 1)})
    with pytest.raises(PollFailed, match="over 16 MiB"):
        client.poll()


# -- ack answers -----------------------------------------------------------------


@pytest.mark.parametrize("status", [200, 202, 204])
def test_a_2xx_ack_has_landed(mocked, client, status):
    mocked.post(ACK_URL, status=status)
    assert client.ack(Ack(SESSION, "m1", "abort", ok=True)) is None  # not an AckFailed, as a 4xx or 5xx is
    assert [call.response.status_code for call in mocked.calls] == [status]  # sent once


@pytest.mark.parametrize("status", [400, 401, 404, 409])
def test_a_4xx_ack_is_refused_with_lichs_reason(mocked, client, status):
    mocked.post(ACK_URL, status=status, body="  unknown\n kind: rewind  ")
    with pytest.raises(AckFailed) as caught:
        client.ack(Ack(SESSION, "m1", "rewind", ok=False, error="unknown kind"))
    assert caught.value.refused
    assert str(caught.value) == f"lich refused it: {status} unknown kind: rewind"


def test_a_refusal_without_a_body_gives_the_status_reason(mocked, client):
    mocked.post(ACK_URL, status=400, body="")
    with pytest.raises(AckFailed, match="lich refused it: 400 Bad Request"):
        client.ack(Ack(SESSION, "m1", "abort", ok=True))


@pytest.mark.parametrize("status", [500, 502, 503])
def test_a_5xx_ack_failed_but_was_not_refused(mocked, client, status):
    mocked.post(ACK_URL, status=status, body="busy")
    with pytest.raises(AckFailed) as caught:
        client.ack(Ack(SESSION, "m1", "abort", ok=True))
    assert not caught.value.refused


@pytest.mark.parametrize(
    "failure, phrase",
    [
        (leaky(requests.ConnectionError, ACK_URL), "exchange with lich failed"),
        (leaky(requests.ReadTimeout, ACK_URL), "^lich did not answer within 10 s$"),
    ],
)
def test_an_ack_that_fails_on_the_way_says_why_without_the_token(mocked, client, failure, phrase):
    mocked.post(ACK_URL, body=failure)
    with pytest.raises(AckFailed, match=phrase) as caught:
        client.ack(Ack(SESSION, "m1", "abort", ok=True))
    assert not caught.value.refused
    assert_safe(caught.value)
    assert len(mocked.calls) == 1


def test_an_ack_answer_over_its_limit_is_not_read_whole(mocked, client):
    mocked.post(ACK_URL, status=400, body=b"x" * (MAX_ACK_ANSWER + 1))
    with pytest.raises(AckFailed, match="over 64 KiB"):
        client.ack(Ack(SESSION, "m1", "abort", ok=True))


def test_a_long_refusal_is_cut_to_one_short_line(mocked, client):
    mocked.post(ACK_URL, status=400, body="why " * 200)
    with pytest.raises(AckFailed) as caught:
        client.ack(Ack(SESSION, "m1", "abort", ok=True))
    assert len(str(caught.value)) < 240 and str(caught.value).endswith("…")


def test_the_config_repr_leaves_the_token_out():
    assert TOKEN not in repr(Config(port=1, token=TOKEN, session_id="s1", run_dir="/tmp/x"))
