"""LichClient over real loopback HTTP (the development lich): what only a real socket
proves -- the kept connection, its replacement, the cut from another thread,
and the phrases for failures as urllib3 really nests them."""
import socket
import threading
from urllib.parse import quote

import pytest

from fakes import RawAnswer
from lich_control.acks import Ack
from lich_control.config import Config
from lich_dev.lich import Answer, StubLich
from lich_control.lich import AckFailed, Deadlines, LichClient, PollFailed
from lich_control.loopback import SocketWatch

TOKEN = "sekrit/+&token=1"
SESSION = "s 1"


@pytest.fixture
def server():
    with StubLich(token=TOKEN) as lich:
        yield lich


@pytest.fixture
def client(server):
    client = LichClient(Config(port=server.port, token=TOKEN, session_id=SESSION, run_dir="/tmp/x"))
    yield client
    client.close()


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_safe(exc):
    for form in (TOKEN, quote(TOKEN, safe=""), "token="):
        assert form not in str(exc)
    # Raised from no exception, or with the one it replaced hidden.
    assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)


def opened(client):
    """Every socket the client has opened and not closed."""
    return [s for s in client._adapter.sockets._socks if s.fileno() != -1]


def test_polls_and_acks_share_one_kept_alive_connection(server, client):
    for n in range(3):
        server.faults.deliver({"id": f"m{n}", "kind": "abort"})
        client.poll()
        client.ack(Ack(SESSION, f"m{n}", "abort", ok=True))
    assert len(opened(client)) == 1
    assert len(server.record.polls) == 3 and [a.answer for a in server.record.acks] == [204] * 3


def test_a_connection_lich_closed_is_replaced_before_the_request_goes_out(server, client):
    server.faults.deliver({"id": "m1", "kind": "abort"})
    client.poll()
    [kept] = opened(client)
    server.hang_up()  # lich closes the idle connection
    server.faults.deliver({"id": "m2", "kind": "abort"})
    assert list(client.poll()) == [{"id": "m2", "kind": "abort"}]
    assert len(server.record.polls) == 2  # sent once: nothing failed, nothing resent
    [new] = opened(client)
    assert new is not kept and kept.fileno() == -1


def test_nothing_listening_is_a_failed_poll_that_names_the_port():
    port = free_port()
    client = LichClient(Config(port=port, token=TOKEN, session_id="s1", run_dir="/tmp/x"))
    with pytest.raises(PollFailed, match=rf"^nothing listens on port {port} \(is lich running\?\)$") as caught:
        client.poll()
    assert_safe(caught.value)


def test_an_ack_with_nothing_listening_says_why_and_is_not_a_refusal():
    client = LichClient(Config(port=free_port(), token=TOKEN, session_id="s1", run_dir="/tmp/x"))
    with pytest.raises(AckFailed, match="nothing listens") as caught:
        client.ack(Ack("s1", "m1", "prompt", ok=True))
    assert not caught.value.refused
    assert_safe(caught.value)


def test_a_poll_lich_does_not_answer_in_time_is_a_failed_poll(server):
    client = LichClient(Config(port=server.port, token=TOKEN, session_id=SESSION, run_dir="/tmp/x"), Deadlines(poll=0.2))
    server.faults.script(Answer(body=[], delay=2.0))
    with pytest.raises(PollFailed, match=r"^lich did not answer within 0\.2 s$") as caught:
        client.poll()
    assert_safe(caught.value)
    client.close()


@pytest.mark.parametrize(
    "answer, phrase",
    [
        (Answer(drop=True), "^(the connection to lich broke|lich reset the connection)$"),
        (Answer(body=[{"id": "m1"}], reset_mid_body=True), "^(lich's answer broke off|lich reset the connection)$"),
        (Answer(raw=b'[{"id": "m1"}]', length=500), "^lich's answer broke off$"),
    ],
    ids=["dropped", "reset-mid-body", "truncated"],
)
def test_a_broken_answer_is_a_failed_poll_without_the_token(server, client, answer, phrase):
    server.faults.script(answer)
    with pytest.raises(PollFailed, match=phrase) as caught:
        client.poll()
    assert_safe(caught.value)
    assert len(server.record.polls) == 1  # not resent


def test_abandon_cuts_a_parked_poll_from_another_thread(server, client):
    failed = []

    def poll():
        try:
            client.poll()
        except PollFailed as exc:
            failed.append(exc)

    thread = threading.Thread(target=poll)
    thread.start()
    assert server.wait_polled(SESSION, 5, parked=True)
    client.abandon()
    thread.join(5)
    assert not thread.is_alive() and len(failed) == 1


def test_a_poll_after_abandon_is_cut_at_once(server, client):
    client.abandon()
    with pytest.raises(PollFailed):
        client.poll()  # its new connection is shut as it opens: it cannot park


def test_a_connection_opened_after_abandon_is_cut_at_once():
    watch = SocketWatch()
    watch.shut_all()
    left, right = socket.socketpair()
    try:
        watch.add(left)  # a poll that was already past its stop check
        assert left.recv(1) == b""  # shut: a read sees the end at once instead of parking
    finally:
        left.close()
        right.close()


NOT_HTTP = {
    "garbage": b"garbage\r\n\r\n",
    "bad-status-code": b"HTTP/1.1 2x0 OK\r\nContent-Length: 2\r\n\r\n[]",
    "no-status-line": b"[]",
    "too-many-headers": b"HTTP/1.1 200 OK\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(120)) + b"\r\n[]",
    "header-too-long": b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70000 + b"\r\n\r\n[]",
    "two-lengths": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n[]",
    "bad-chunk-size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n[]\r\n0\r\n\r\n",
    "huge-chunk-size": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\n[]\r\n0\r\n\r\n",
    "bad-gzip": b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nabcd",
}


@pytest.mark.parametrize("answer", list(NOT_HTTP.values()), ids=list(NOT_HTTP))
def test_an_answer_a_parser_refuses_is_a_failed_poll_never_an_escape(answer):
    raw = RawAnswer(answer)
    client = LichClient(Config(port=raw.port, token=TOKEN, session_id="s1", run_dir="/tmp/x"))
    try:
        with pytest.raises(PollFailed, match="^lich's answer (was not HTTP|broke off|could not be decoded)$") as caught:
            client.poll()
        assert_safe(caught.value)
    finally:
        client.close()
        raw.close()


def test_a_content_length_of_latin_1_digits_is_read_past_not_an_escape():
    # "\xb2" is "²" once decoded: a digit to str.isdigit, not to int(). Both
    # parsers below ignore such a length and read to the end; so must we.
    raw = RawAnswer(b"HTTP/1.1 400 Bad Request\r\nContent-Length: \xb2\r\n\r\nnope")
    client = LichClient(Config(port=raw.port, token=TOKEN, session_id="s1", run_dir="/tmp/x"))
    try:
        with pytest.raises(PollFailed, match="^lich answered 400$"):
            client.poll()
        with pytest.raises(AckFailed, match="^lich refused it: 400 nope$") as caught:
            client.ack(Ack("s1", "m1", "abort", ok=True))
        assert caught.value.refused
    finally:
        client.close()
        raw.close()
