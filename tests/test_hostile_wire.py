"""LichClient against a hostile or foreign lich, over real loopback: each
exchange ends by its deadline, the token goes only to a program of our own
user and never comes back in lich's words, and a broken answer is worded as
a person would say it (issue 15)."""
import json
import os
import socket
import struct
import tracemalloc
from urllib.parse import quote, quote_plus

import pytest

from fakes import RawAnswer
from lich_control import loopback
from lich_control.acks import Ack
from lich_control.batch import MAX_ITEMS
from lich_control.config import Config
from lich_dev.lich import AckAnswer, Answer, StubLich
from lich_control.lich import AckFailed, Deadlines, LichClient, PollFailed, _too_large
from lich_control.peer import peer_uid

TOKEN = "sekrit/+&token=1 x"
SESSION = "s1"
SHORT = Deadlines(poll=0.5, ack=0.5)  # a hostile answer never ends: each test waits this out
DRIP = 0.02  # far below a deadline: a per-read timeout alone would never fire
ACK = Ack(SESSION, "m1", "abort", ok=True)


@pytest.fixture
def server():
    with StubLich(token=TOKEN) as lich:
        yield lich


def client_for(port, deadlines=SHORT, **kwargs):
    return LichClient(Config(port=port, token=TOKEN, session_id=SESSION, run_dir="/tmp/x"), deadlines, **kwargs)


@pytest.fixture
def client(server):
    client = client_for(server.port)
    yield client
    client.close()


def assert_safe(exc):
    for form in (TOKEN, quote(TOKEN, safe=""), quote(TOKEN), quote_plus(TOKEN, safe=""), quote(TOKEN, safe="").lower()):
        assert form not in str(exc)
    assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)


# -- each exchange ends by its deadline ------------------------------------------

ENDLESS = {
    # The whole answer, one byte per write, never long silent.
    "trickled": Answer(body=[{"id": f"m{n}", "kind": "abort"} for n in range(20)], drip=DRIP),
    "header-never-ends": Answer(wire=b"HTTP/1.1 200 OK\r\nX-Slow: ", endless=b"a", drip=DRIP),
    "continue-for-ever": Answer(wire=b"", endless=b"HTTP/1.1 100 Continue\r\n\r\n", drip=DRIP),
    "body-never-ends": Answer(wire=b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", endless=b"1\r\n \r\n", drip=DRIP),
}


@pytest.mark.parametrize("answer", list(ENDLESS.values()), ids=list(ENDLESS))
def test_a_poll_lich_never_finishes_answering_fails_at_its_deadline(server, client, answer):
    server.faults.script(answer)
    with pytest.raises(PollFailed, match=r"^lich did not answer within 0\.5 s$") as caught:
        client.poll()
    assert_safe(caught.value)
    assert len(server.record.polls) == 1  # sent once, never again


def test_an_ack_lich_answers_a_byte_at_a_time_fails_at_its_deadline(server, client):
    server.faults.script_acks(AckAnswer(status=400, reason="x" * 200, drip=DRIP))
    with pytest.raises(AckFailed, match=r"^lich did not answer within 0\.5 s$") as caught:
        client.ack(ACK)
    assert not caught.value.refused  # it may have landed: not lich's refusal
    assert_safe(caught.value)
    assert len(server.record.acks) == 1


def test_after_a_deadline_the_next_exchange_runs_on_a_new_connection(server, client):
    server.faults.script(ENDLESS["continue-for-ever"])
    with pytest.raises(PollFailed):
        client.poll()
    server.faults.deliver({"id": "m2", "kind": "abort"})
    assert list(client.poll()) == [{"id": "m2", "kind": "abort"}]
    client.ack(Ack(SESSION, "m2", "abort", ok=True))
    assert [a.answer for a in server.record.acks] == [204]


def test_the_deadlines_are_30_s_for_a_poll_and_10_s_for_an_ack():
    assert Deadlines() == Deadlines(poll=30.0, ack=10.0)


# -- the token goes to a program of our own user only -----------------------------


def foreign(port, uid):
    return rf"^the program listening on port {port} belongs to another user \(uid {uid}\); the token is not sent$"


def test_a_lich_of_another_user_gets_neither_a_poll_nor_an_ack(server):
    # The stub is ours: the client is told it is someone else.
    client = client_for(server.port, uid=os.getuid() + 1)
    with pytest.raises(PollFailed, match=foreign(server.port, os.getuid())) as caught:
        client.poll()
    assert_safe(caught.value)
    with pytest.raises(AckFailed, match=foreign(server.port, os.getuid())) as caught:
        client.ack(ACK)
    assert not caught.value.refused and not client._adapter.sockets._socks
    client.close()
    assert server.record.polls == [] and server.record.acks == []


def test_where_the_owner_cannot_be_told_the_token_goes(server, monkeypatch):
    monkeypatch.setattr(loopback, "peer_uid", lambda sock: None)  # not Linux, or /proc unreadable
    client = client_for(server.port, uid=os.getuid() + 1)
    server.faults.deliver({"id": "m1", "kind": "abort"})
    assert list(client.poll()) == [{"id": "m1", "kind": "abort"}]
    client.close()


@pytest.mark.parametrize("host, family", [("127.0.0.1", socket.AF_INET), ("0.0.0.0", socket.AF_INET), ("::", socket.AF_INET6)])
def test_the_owner_is_found_whichever_listener_takes_the_connection(host, family):
    if family == socket.AF_INET6 and not socket.has_dualstack_ipv6():
        pytest.skip("no dual-stack IPv6 here")
    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("no /proc/net/tcp: the owner cannot be told here")
    with socket.create_server((host, 0), family=family, dualstack_ipv6=family == socket.AF_INET6) as server:
        with socket.create_connection(("127.0.0.1", server.getsockname()[1])) as conn:
            assert peer_uid(conn) == os.getuid()
            assert peer_uid(conn, tables=("/nonexistent/tcp",)) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can start a listener of another user")
def test_a_listener_of_uid_65534_never_receives_the_token():
    ready_r, ready_w = os.pipe()
    got_r, got_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: another user, listening on loopback
        try:
            os.close(ready_r), os.close(got_r)
            os.setgroups([]), os.setgid(65534), os.setuid(65534)
            listener = socket.create_server(("127.0.0.1", 0))
            os.write(ready_w, struct.pack("H", listener.getsockname()[1]))
            conn, _ = listener.accept()
            conn.settimeout(10)
            received = b""
            while chunk := conn.recv(65536):
                received += chunk
            os.write(got_w, received[:65536] or b"-")
        finally:
            os._exit(0)
    os.close(ready_w), os.close(got_w)
    try:
        [port] = struct.unpack("H", os.read(ready_r, 2))
        client = client_for(port)
        with pytest.raises(PollFailed, match=foreign(port, 65534)) as caught:
            client.poll()
        assert_safe(caught.value)
        client.close()
        assert os.read(got_r, 65536) == b"-"  # the connection closed with nothing sent on it
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(ready_r), os.close(got_r)


# -- the token never comes back in lich's words -----------------------------------

ECHOES = {
    "raw": f"no ack at /mod/acks?token={TOKEN}",
    "quoted": f"bad request: POST /mod/acks?token={quote(TOKEN, safe='')} HTTP/1.1",
    "lower-hex": f"bad url /mod/acks?token={quote(TOKEN, safe='').lower()}",
    "plus-for-space": f"bad url /mod/acks?token={quote_plus(TOKEN, safe='')}",
    "split-over-lines": f"bad ack\n{TOKEN}\nis not yours",
}


@pytest.mark.parametrize("said", list(ECHOES.values()), ids=list(ECHOES))
def test_a_refusal_that_repeats_the_url_never_carries_the_token(server, client, said):
    server.faults.script_acks(AckAnswer(status=400, reason=said))
    with pytest.raises(AckFailed, match=r"^lich refused it: 400 .*\[token\]") as caught:
        client.ack(ACK)
    assert caught.value.refused
    assert_safe(caught.value)


def test_a_reason_phrase_that_holds_the_token_is_scrubbed_and_cut_short(server, client):
    server.faults.script_acks(
        AckAnswer(status=403, reason="", phrase=f"Forbidden {TOKEN}"),
        AckAnswer(status=403, reason="", phrase="x" * 5000),
    )
    with pytest.raises(AckFailed, match=r"^lich refused it: 403 Forbidden \[token\]$") as caught:
        client.ack(ACK)
    assert_safe(caught.value)
    with pytest.raises(AckFailed) as caught:
        client.ack(ACK)
    assert str(caught.value) == "lich refused it: 403 " + "x" * 200 + "…"


def test_a_refusal_holding_the_token_never_reaches_the_status(relay, lich):
    r = relay()
    r.wait_hello()
    assert lich.wait_polled("s1", 10, parked=True)
    lich.faults.script_acks(AckAnswer(status=400, reason=f"refused /mod/acks?token={quote(lich.token, safe='')}"))
    lich.queue_all("s1", [{"id": "m1", "kind": "abort"}])
    assert lich.record.ack_for("m1")
    status = r.wait_status(lambda doc: "not delivered" in json.dumps(doc))
    text = json.dumps(status)
    assert "[token]" in text and lich.token not in text and quote(lich.token, safe="") not in text


# -- broken answers, worded as a person would -------------------------------------

CHUNK_SIZES = [b"-1", b"-10000", b"-ffffffffffffffffffff", b"zz", b"", b"ffffffffffffffffffff", b"1_0"]


@pytest.mark.parametrize("size", CHUNK_SIZES, ids=[s.decode() or "empty" for s in CHUNK_SIZES])
def test_a_broken_chunk_size_is_a_failed_exchange_never_an_escape(size):
    raw = RawAnswer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + size + b"\r\n[]\r\n0\r\n\r\n")
    client = client_for(raw.port)
    try:
        with pytest.raises(PollFailed, match="^lich's answer (was not HTTP|broke off)$"):
            client.poll()
        with pytest.raises(AckFailed, match="^lich's answer (was not HTTP|broke off)$") as caught:
            client.ack(ACK)
        assert not caught.value.refused
    finally:
        client.close()
        raw.close()


@pytest.mark.parametrize(
    "limit, phrase",
    [(16 * 1024 * 1024, "16 MiB"), (64 * 1024, "64 KiB"), (1000, "1,000 bytes"), (1536, "1,536 bytes"), (0, "0 bytes")],
)
def test_a_size_limit_reads_as_a_size(limit, phrase):
    assert _too_large(limit) == f"lich's answer is over {phrase}"


@pytest.mark.parametrize("status", [101, 302, 304])
def test_an_ack_answered_neither_2xx_nor_4xx_is_not_a_refusal(status):
    raw = RawAnswer(b"HTTP/1.1 %d Odd\r\nContent-Length: 4\r\nConnection: close\r\n\r\nodd!" % status)
    client = client_for(raw.port)
    try:
        with pytest.raises(AckFailed, match=rf"^lich refused it: {status} (odd!|Odd)$") as caught:  # 1xx, 304: no body
            client.ack(ACK)
        assert not caught.value.refused
    finally:
        client.close()
        raw.close()


def test_an_endless_answer_is_scripted_with_a_drip_between_its_repeats():
    with pytest.raises(ValueError, match="needs bytes to repeat and a drip"):
        Answer(endless=b"a")
    with pytest.raises(ValueError, match="needs bytes to repeat and a drip"):
        Answer(endless=b"", drip=0.1)
    with pytest.raises(ValueError, match="0 or more"):
        AckAnswer(drip=-1)


def test_a_row_in_time_wait_names_no_owner(tmp_path):
    from lich_control.peer import _row_address

    with socket.create_server(("127.0.0.1", 0)) as server, socket.create_connection(server.getsockname()) as conn:
        theirs, ours = _row_address(conn.getpeername(), False), _row_address(conn.getsockname(), False)
        head = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        waiting = f"   0: {theirs} {ours} 06 00000000:00000000 03:00001770 00000000     0        0 0 3 0\n"
        live = f"   1: {theirs} {ours} 01 00000000:00000000 00:00000000 00000000  1234        0 99 1 0\n"
        table = tmp_path / "tcp"
        table.write_text(head + waiting)
        assert peer_uid(conn, tables=(str(table),)) is None  # the kernel's uid 0 of a TIME_WAIT row is no owner
        table.write_text(head + waiting + live)
        assert peer_uid(conn, tables=(str(table),)) == 1234


def test_an_answer_in_two_byte_chunks_costs_its_size_not_an_object_per_chunk():
    # 1 MiB as 2-byte chunks: kept as pieces, ~20 MiB of small objects.
    raw = RawAnswer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n[\r\n" + b"2\r\n0,\r\n" * (512 * 1024) + b"1\r\n0\r\n1\r\n]\r\n0\r\n\r\n")
    client = client_for(raw.port, deadlines=Deadlines(poll=60.0, ack=10.0))
    tracemalloc.start()
    try:
        answer = client.poll()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        client.close()
        raw.close()
    assert sum(1 for _ in answer) == MAX_ITEMS  # read, up to the item cap
    assert peak < 8 * 1024 * 1024, f"reading 1 MiB took {peak / 2**20:.1f} MiB"
