"""LichClient against a real loopback server (FakeLich): what goes out, and
how every kind of answer or failure comes back."""
import json
import socket
import threading

import pytest

from fakelich import Answer, FakeLich
from lich_control import __version__, lich as lich_module
from lich_control.ack import Ack
from lich_control.config import Config
from lich_control.lich import AckFailed, LichClient, LichGone, PollFailed, MAX_POLL_BODY

TOKEN = "sekrit/+&token"


@pytest.fixture
def server():
    fake = FakeLich(token=TOKEN, hold=5.0)
    yield fake
    fake.close()


@pytest.fixture
def client(server):
    client = LichClient(Config(port=server.port, token=TOKEN, session_id="s 1", run_dir="/tmp/x"))
    yield client
    client.close()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_safe(exc):
    assert TOKEN not in str(exc) and "token" not in str(exc)
    assert exc.__cause__ is None and exc.__suppress_context__


def test_poll_sends_token_session_and_plugin_header(server, client):
    server.send({"id": "m1", "kind": "abort"})
    assert client.poll() == [{"id": "m1", "kind": "abort"}]
    _, query, headers = server.polls[0]
    assert headers["X-Lich-Plugin"] == __version__
    assert query["token"] == [TOKEN] and query["session_id"] == ["s 1"]


def test_polls_reuse_one_connection_and_survive_lich_closing_it(server, client):
    server.send({"id": "m1", "kind": "abort"})
    client.poll()
    first = client._conn.sock
    server.send({"id": "m2", "kind": "abort"})
    client.poll()
    assert client._conn.sock is first
    first.shutdown(socket.SHUT_RDWR)  # as if lich closed the idle connection
    server.send({"id": "m3", "kind": "abort"})
    assert client.poll() == [{"id": "m3", "kind": "abort"}]


def test_404_means_lich_predates_the_contract(server, client):
    server.script(Answer(status=404, raw=b"no such path"))
    with pytest.raises(LichGone):
        client.poll()


@pytest.mark.parametrize("status", [500, 502, 503, 401, 400, 302, 204])
def test_any_other_status_is_a_failed_poll(server, client, status):
    server.script(Answer(status=status, raw=b""))
    with pytest.raises(PollFailed, match=f"lich answered {status}"):
        client.poll()


@pytest.mark.parametrize("body, why", [("{}", "not an array"), ('"x"', "not an array"), ("{", "not JSON"), ("", "not JSON")])
def test_a_200_that_is_not_a_json_array_is_a_failed_poll(server, client, body, why):
    server.script(Answer(raw=body.encode()))
    with pytest.raises(PollFailed, match=why):
        client.poll()


def test_an_oversized_poll_body_is_a_failed_poll(server, client):
    server.script(Answer(raw=b"[]", length=MAX_POLL_BODY + 10))
    with pytest.raises(PollFailed, match="over 16 MiB") as caught:
        client.poll()
    assert_safe(caught.value)


def test_nothing_listening_is_a_failed_poll_that_names_the_port():
    port = free_port()
    client = LichClient(Config(port=port, token=TOKEN, session_id="s1", run_dir="/tmp/x"))
    with pytest.raises(PollFailed, match=f"nothing listens on port {port}") as caught:
        client.poll()
    assert_safe(caught.value)


def test_a_poll_lich_does_not_answer_in_time_is_a_failed_poll(server, client, monkeypatch):
    monkeypatch.setattr(lich_module, "POLL_TIMEOUT", (3.0, 0.2))
    server.script(Answer(body=[], delay=2.0))
    with pytest.raises(PollFailed, match="did not answer in time") as caught:
        client.poll()
    assert_safe(caught.value)


@pytest.mark.parametrize("answer, phrase", [(Answer(drop=True), "connection to lich broke|reset"), (Answer(body=[{"id": "m1"}], reset_mid_body=True), "broke off|reset")])
def test_a_broken_answer_is_a_failed_poll_without_the_token(server, client, answer, phrase):
    server.script(answer)
    with pytest.raises(PollFailed, match=phrase) as caught:
        client.poll()
    assert_safe(caught.value)


def test_abandon_cuts_a_parked_poll_from_another_thread(server, client):
    failed = []

    def poll():
        try:
            client.poll()
        except PollFailed as exc:
            failed.append(exc)

    thread = threading.Thread(target=poll)
    thread.start()
    server.wait_parked()
    client.abandon()
    thread.join(5)
    assert not thread.is_alive() and len(failed) == 1


def test_ack_posts_the_json_body_with_the_plugin_header(server, client):
    client.ack(Ack("s 1", "m2", "abort", ok=True))
    _, body, headers, query = server.acks[0]
    assert body == {"session_id": "s 1", "id": "m2", "kind": "abort", "ok": True}
    assert headers["X-Lich-Plugin"] == __version__
    assert headers["Content-Type"] == "application/json"
    assert query["token"] == [TOKEN]


def test_an_ack_lich_refuses_says_lichs_reason_and_is_marked_refused(server, client):
    server.ack_status.append(400)
    with pytest.raises(AckFailed) as caught:
        client.ack(Ack("s1", "m1", "prompt", ok=True))
    assert caught.value.refused
    assert "400 refused: because the test said so" in str(caught.value)


def test_an_ack_that_cannot_be_sent_says_why_without_the_token():
    client = LichClient(Config(port=free_port(), token=TOKEN, session_id="s1", run_dir="/tmp/x"))
    with pytest.raises(AckFailed) as caught:
        client.ack(Ack("s1", "m1", "prompt", ok=True))
    assert not caught.value.refused
    assert_safe(caught.value)


def test_a_5xx_ack_is_a_failure_not_a_refusal(server, client):
    server.ack_status.append(503)
    with pytest.raises(AckFailed) as caught:
        client.ack(Ack("s1", "m1", "prompt", ok=True))
    assert not caught.value.refused


def test_the_config_repr_leaves_the_token_out():
    assert TOKEN not in repr(Config(port=1, token=TOKEN, session_id="s1", run_dir="/tmp/x"))


def test_a_connection_opened_after_abandon_is_cut_at_once():
    import socket as socket_module

    from lich_control.lich import _SocketWatch

    watch = _SocketWatch()
    watch.shut_all()
    left, right = socket_module.socketpair()
    try:
        watch.add(left)  # a poll that was already past its stop check
        assert left.recv(1) == b""  # shut: a read sees the end at once instead of parking
    finally:
        left.close()
        right.close()
