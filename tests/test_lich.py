"""LichClient: what every request carries and what each answer or failure
becomes, with mocked HTTP (responses); over real loopback, what only a socket
proves: the kept connection, the deadline on an answer that never ends, the
owner check, `abandon` from another thread, and answers no server library
would send. No text may carry the token, and every failure keeps its cause."""
import http.client
import json
import os
import re
import socket
import sys
import threading
import tracemalloc
from urllib.parse import quote, quote_plus

import pytest
import requests
import responses
import urllib3

from conftest import SCAN_TOKEN
from fakes import RawAnswer
from lich_control import CONTRACT_RELEASE, __version__, lich
from lich_control.system import native as posix  # monkeypatched on POSIX only (POSIX_OWNER)
from lich_control.acks import Ack
from lich_control.config import Config
from lich_control.lich import MAX_ACK_ANSWER, MAX_POLL_BODY, AckFailed, ExchangeTimeouts, LichClient, LichGone, PollFailed
from lich_dev.lich import AckAnswer, Answer, StubLich

TOKEN = SCAN_TOKEN
SESSION = "s 1/é?"
PORT = 4312
POLL_URL = f"http://127.0.0.1:{PORT}/mod/commands?token={quote(TOKEN, safe='')}&session_id={quote(SESSION, safe='')}"
ACK_URL = f"http://127.0.0.1:{PORT}/mod/acks?token={quote(TOKEN, safe='')}"
ACK = Ack(SESSION, "m1", "abort", ok=True)
SHORT = ExchangeTimeouts(poll=0.3, ack=0.3)  # an answer that never ends: each such test waits this out
DRIP = 0.02  # far below a deadline: a per-read timeout alone would never fire


def client_for(port, timeouts=ExchangeTimeouts(), **kwargs):
    return LichClient(Config(port=port, token=TOKEN, session_id=SESSION, run_dir="/tmp/x"), timeouts, **kwargs)


@pytest.fixture
def mocked():
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        yield rsps


@pytest.fixture
def client():
    client = client_for(PORT)
    yield client
    client.close()


@pytest.fixture
def server():
    with StubLich(token=TOKEN) as stub:
        yield stub


@pytest.fixture
def near(server):
    """A client of the development lich, with short deadlines."""
    client = client_for(server.port, SHORT)
    yield client
    client.close()


@pytest.fixture
def raw():
    """A client of a port answering bytes of the test's choosing."""
    made = []

    def start(answer, timeouts=SHORT):
        made.append(RawAnswer(answer))
        made.append(client_for(made[-1].port, timeouts))
        return made[-1]

    yield start
    for thing in made:
        thing.close()


def assert_safe(exc):
    for form in (TOKEN, quote(TOKEN, safe=""), quote(TOKEN), quote_plus(TOKEN, safe=""), quote(TOKEN, safe="").lower()):
        assert form not in str(exc)


def leaky(kind, url=POLL_URL):
    """An exception as requests words it: the URL, and so the token, in its text."""
    return kind(f"HTTPConnectionPool(host='127.0.0.1', port={PORT}): Max retries exceeded with url: {url}")


# -- what goes out ---------------------------------------------------------------------------


def test_a_poll_gets_its_url_and_an_ack_posts_its_json_both_naming_the_contract_release(mocked, client):
    mocked.get(POLL_URL, body=b'[{"id": "m1", "kind": "abort"}]\n')
    mocked.post(ACK_URL, status=204)
    assert client.poll() == b'[{"id": "m1", "kind": "abort"}]\n'
    client.ack(Ack(SESSION, "m2", "effort", ok=False, error="unknown effort"))
    poll, ack = (call.request for call in mocked.calls)
    assert (poll.method, poll.url, poll.body) == ("GET", POLL_URL, None)
    assert (ack.method, ack.url, ack.headers["Content-Type"], ack.headers["Content-Length"]) == ("POST", ACK_URL, "application/json", str(len(ack.body)))
    assert json.loads(ack.body) == {"session_id": SESSION, "id": "m2", "kind": "effort", "ok": False, "error": "unknown effort"}
    for sent in (poll, ack):
        assert sent.headers["X-Lich-Plugin"] == CONTRACT_RELEASE != __version__
        assert (sent.headers["Accept"], sent.headers["User-Agent"]) == ("application/json", f"lich-control/{__version__}")


# -- what comes back ---------------------------------------------------------------------------


@pytest.mark.parametrize("status", [204, 302, 400, 404, 500, 503])
def test_a_poll_not_answered_200_is_named_by_its_status_and_sent_once(mocked, client, status):
    mocked.get(POLL_URL, status=status, body="" if status == 204 else "why", headers={"Location": "/elsewhere"} if status == 302 else {})
    with pytest.raises(LichGone if status == 404 else PollFailed, match=f"^lich answered {status}$"):  # 404: lich predates the contract
        client.poll()
    assert len(mocked.calls) == 1  # a redirect is not followed, nothing is resent


def test_a_401_says_the_token_is_wrong_and_what_to_do(mocked, client):
    mocked.get(POLL_URL, status=401, body="invalid token")
    mocked.post(ACK_URL, status=401, body="invalid token")
    wrong = re.escape("the token is wrong (LICH_TOKEN is not one lich knows: lich restarted?); start a new session from lich")
    with pytest.raises(PollFailed, match=f"^lich answered 401: {wrong}$"):
        client.poll()
    with pytest.raises(AckFailed, match=f"^lich refused it: 401 invalid token: {wrong}$") as caught:
        client.ack(ACK)
    assert caught.value.refused is True


WIRE_FAILURES = {
    "connection-error": (leaky(requests.ConnectionError), "^the exchange with lich failed \\(ConnectionError\\)$"),
    "connect-timeout": (leaky(requests.ConnectTimeout), f"^could not connect to lich on port {PORT} in time$"),
    "read-timeout": (leaky(requests.ReadTimeout), "^lich did not answer within 30 s$"),
    "broken-body": (leaky(requests.exceptions.ChunkedEncodingError), "^lich's answer broke off$"),
    "urllib3-error": (leaky(urllib3.exceptions.ResponseNotChunked), "^the exchange with lich failed \\(ResponseNotChunked\\)$"),
    "http-client-error": (leaky(http.client.LineTooLong), "^lich's answer was not HTTP$"),
}


@pytest.mark.parametrize("failure, phrase", list(WIRE_FAILURES.values()), ids=list(WIRE_FAILURES))
def test_a_failure_on_the_way_is_a_phrase_raised_from_the_original_without_the_token(mocked, client, failure, phrase):
    mocked.get(POLL_URL, body=failure)
    mocked.post(ACK_URL, body=failure)
    with pytest.raises(PollFailed, match=phrase) as polled:
        client.poll()
    with pytest.raises(AckFailed, match=phrase.replace("30 s", "10 s")) as acked:
        client.ack(ACK)
    for caught in (polled, acked):
        assert caught.value.__cause__ is failure
        assert_safe(caught.value)
    assert not acked.value.refused and len(mocked.calls) == 2  # never retried


def test_a_body_past_its_limit_is_a_failed_exchange(mocked, client):
    mocked.get(POLL_URL, body=b"[]", headers={"Content-Length": str(MAX_POLL_BODY + 1)})  # refused unread; streamed: below
    mocked.post(ACK_URL, status=400, body=b"x" * (MAX_ACK_ANSWER + 1))
    with pytest.raises(PollFailed, match="^lich's answer is over 16 MiB$"):
        client.poll()
    with pytest.raises(AckFailed, match="^lich's answer is over 64 KiB$"):
        client.ack(ACK)


@pytest.mark.parametrize("status", [200, 202, 204])
def test_a_2xx_ack_has_landed(mocked, client, status):
    mocked.post(ACK_URL, status=status)
    assert client.ack(ACK) is None
    assert len(mocked.calls) == 1


@pytest.mark.parametrize("status, body, said, refused", [(400, "  unknown\n kind: rewind  ", "unknown kind: rewind", True), (409, "", "Conflict", True), (503, "busy", "busy", False)])
def test_an_ack_lich_did_not_take_says_why_on_one_line_and_only_a_4xx_is_a_refusal(mocked, client, status, body, said, refused):
    mocked.post(ACK_URL, status=status, body=body)
    with pytest.raises(AckFailed, match=f"^lich refused it: {status} {said}$") as caught:
        client.ack(ACK)
    assert caught.value.refused is refused


# -- the connection, over loopback -------------------------------------------------------------


def test_polls_and_acks_share_one_kept_alive_connection_replaced_once_lich_closes_it(server, monkeypatch):
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")  # read from the environment, it would take every request
    client = client_for(server.port)
    for n in range(3):
        server.faults.deliver({"id": f"m{n}", "kind": "abort"})
        client.poll()
        client.ack(Ack(SESSION, f"m{n}", "abort", ok=True))
    [kept] = client._adapter._sockets
    server.hang_up()  # lich closes the idle connection
    server.faults.deliver({"id": "m9", "kind": "abort"})
    assert json.loads(client.poll()) == [{"id": "m9", "kind": "abort"}]
    assert len(server.record.polls) == 4 and [a.answer for a in server.record.acks] == [204] * 3  # nothing resent
    [new] = client._adapter._sockets
    assert new is not kept and kept.fileno() == -1
    client.close()


def test_nothing_listening_is_a_failed_exchange_that_names_the_port_and_keeps_the_cause():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = client_for(port)
    with pytest.raises(PollFailed, match=rf"^nothing listens on port {port} \(is lich running\?\)$") as caught:
        client.poll()
    assert isinstance(caught.value.__cause__, requests.ConnectionError)
    with pytest.raises(AckFailed, match="^nothing listens") as caught:
        client.ack(ACK)
    assert not caught.value.refused


ENDLESS = {
    # The whole answer, one byte per write, never long silent.
    "trickled": Answer(body=[{"id": f"m{n}", "kind": "abort"} for n in range(20)], drip=DRIP),
    "header-never-ends": Answer(wire=b"HTTP/1.1 200 OK\r\nX-Slow: ", endless=b"a", drip=DRIP),
    "continue-for-ever": Answer(wire=b"", endless=b"HTTP/1.1 100 Continue\r\n\r\n", drip=DRIP),
    "chunks-for-ever": Answer(wire=b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", endless=b"1\r\n \r\n", drip=DRIP),
}


@pytest.mark.parametrize("answer", list(ENDLESS.values()), ids=list(ENDLESS))
def test_a_poll_lich_never_finishes_answering_fails_at_its_deadline(server, near, answer):
    server.faults.script(answer)
    with pytest.raises(PollFailed, match=r"^lich did not answer within 0\.3 s$") as caught:
        near.poll()
    assert_safe(caught.value)
    assert len(server.record.polls) == 1  # sent once, never again


def test_an_ack_answered_a_byte_at_a_time_fails_at_its_deadline_and_the_next_exchange_goes_on(server, near):
    server.faults.script_acks(AckAnswer(status=400, reason="x" * 200, drip=DRIP))
    with pytest.raises(AckFailed, match=r"^lich did not answer within 0\.3 s$") as caught:
        near.ack(ACK)
    assert not caught.value.refused  # it may have landed: not lich's refusal
    server.faults.deliver({"id": "m2", "kind": "abort"})
    assert json.loads(near.poll()) == [{"id": "m2", "kind": "abort"}]  # on a new connection


def test_abandon_cuts_a_parked_poll_from_another_thread_and_any_poll_after_it(server):
    client = client_for(server.port)
    failed = []
    thread = threading.Thread(target=lambda: failed.append(pytest.raises(PollFailed, client.poll)))
    thread.start()
    assert server.wait_polled(SESSION, 5, parked=True)
    client.abandon()
    thread.join(5)
    assert not thread.is_alive() and len(failed) == 1
    with pytest.raises(PollFailed):
        client.poll()  # its new connection is shut as it opens: it cannot park
    client.close()


def test_an_answer_lich_writes_as_the_poll_is_abandoned_is_read_whole(background):
    # lich hands each command out once: an answer it wrote as the daemon
    # cut its poll at shutdown must be read and handed on, not thrown away.
    # This lich answers only once it sees the client's cut, as a lich whose
    # commands came in that same instant does.
    listener = socket.create_server(("127.0.0.1", 0))
    body = json.dumps([{"id": "m1", "kind": "abort"}]).encode()
    polled = threading.Event()

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)  # the poll
            polled.set()
            while conn.recv(65536):
                pass  # until the client's cut
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))

    served = background.submit(serve)
    client = client_for(listener.getsockname()[1])
    poll = background.submit(client.poll)
    try:
        assert polled.wait(5)
        client.abandon()
        assert poll.result(5) == body
        served.result(5)
    finally:
        client.close()
        listener.close()



def test_a_chunked_answer_is_read_whole_and_past_16_mib_refused_as_it_streams(raw):
    items = json.dumps([{"id": f"m{n}", "kind": "prompt", "text": "x" * 100} for n in range(50)]).encode() + b"\n"
    pieces = [items[n : n + 2048] for n in range(0, len(items), 2048)]
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    assert raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked).poll() == items
    mib = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
    endless = raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n[\r\n" + mib * 17 + b"1\r\n]\r\n0\r\n\r\n", ExchangeTimeouts())
    with pytest.raises(PollFailed, match="^lich's answer is over 16 MiB$"):
        endless.poll()


def test_an_answer_in_two_byte_chunks_costs_its_size_not_an_object_per_chunk(raw):
    # 64 KiB as 2-byte chunks: kept as pieces, over 1 MiB of small objects.
    client = raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"2\r\n0,\r\n" * (32 * 1024) + b"0\r\n\r\n", ExchangeTimeouts())
    tracemalloc.start()
    try:
        body = client.poll()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(body) == 64 * 1024 and peak < 512 * 1024, f"reading 64 KiB took {peak / 2**10:.0f} KiB"


# One answer per phrase `_phrase` sorts a parser's refusal into.
NOT_HTTP = {
    "garbage": (b"garbage\r\n\r\n", "lich's answer was not HTTP"),
    "two-lengths": (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n[]", "lich's answer was not HTTP"),
    "truncated": (b"HTTP/1.1 200 OK\r\nContent-Length: 500\r\n\r\n[]", "lich's answer broke off"),
    "bad-gzip": (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 4\r\n\r\nabcd", "lich's answer could not be decoded"),
    "negative-chunk-size": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-ffffffffffffffffffff\r\n[]\r\n0\r\n\r\n",
        # Python 3.9's http.client reads it as the end of the body.
        "the exchange with lich failed (OverflowError)" if sys.version_info >= (3, 10) else "lich's answer broke off",
    ),
}


@pytest.mark.parametrize("answer, phrase", list(NOT_HTTP.values()), ids=list(NOT_HTTP))
def test_an_answer_a_parser_refuses_is_a_failed_exchange_never_an_escape(raw, answer, phrase):
    client = raw(answer)
    with pytest.raises(PollFailed) as caught:
        client.poll()
    assert str(caught.value) == phrase and caught.value.__cause__ is not None
    with pytest.raises(AckFailed) as caught:
        client.ack(ACK)
    assert not caught.value.refused


def test_a_content_length_of_latin_1_digits_is_read_past_not_an_escape(raw):
    # "\xb2" is "²" once decoded: a digit to str.isdigit, not to int().
    client = raw(b"HTTP/1.1 400 Bad Request\r\nContent-Length: \xb2\r\n\r\nnope")
    with pytest.raises(PollFailed, match="^lich answered 400$"):
        client.poll()
    with pytest.raises(AckFailed, match="^lich refused it: 400 nope$"):
        client.ack(ACK)


# -- the token goes to a program of our own user only -------------------------------------------


def foreign(port, uid):
    return rf"^the program listening on port {port} belongs to another user \(uid {uid}\); the token is not sent$"


POSIX_OWNER = pytest.mark.skipif(os.name == "nt", reason="a uid from Linux's /proc; Windows' TCP-table owner is test_windows.py's (and Wine leaves its pids 0)")


@POSIX_OWNER
def test_a_lich_of_another_user_gets_neither_a_poll_nor_an_ack(server):
    client = client_for(server.port, uid=os.getuid() + 1)  # the stub is ours: the client is told it is someone else's
    with pytest.raises(PollFailed, match=foreign(server.port, os.getuid())):
        client.poll()
    with pytest.raises(AckFailed, match=foreign(server.port, os.getuid())) as caught:
        client.ack(ACK)
    assert not caught.value.refused and client._adapter._sockets == []
    client.close()
    assert server.record.polls == [] and server.record.acks == []


@POSIX_OWNER
def test_where_the_owner_cannot_be_told_the_token_goes(server, monkeypatch):
    monkeypatch.setattr(posix, "TCP_TABLES", ("/nonexistent/tcp",))  # not Linux, or /proc unreadable
    client = client_for(server.port, uid=os.getuid() + 1)
    server.faults.deliver({"id": "m1", "kind": "abort"})
    assert json.loads(client.poll()) == [{"id": "m1", "kind": "abort"}]
    client.close()
