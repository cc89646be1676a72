"""The daemon's Unix socket (http.server underneath): the routes and their
refusals, keep-alive, the limits, and hostile bodies -- each a 400 on a
connection that goes on, never a dead thread or a dropped connection."""
import concurrent.futures
import json
import os
import socket
import stat
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lich_control.commands import MAX_VALUES
from lich_control.bridge import BadMessage
from lich_control.unix_socket import MAX_BODY, Routes, UnixConnection, UnixHttpServer, unix_request

JSON = {"Content-Type": "application/json"}


class Sinks:
    def __init__(self):
        self.results, self.events = [], []

    def result(self, doc):
        if not isinstance(doc, dict) or "id" not in doc:
            raise BadMessage("id must be a string")
        if doc["id"] == "crash":
            raise KeyError("a bug in the daemon")
        self.results.append(doc)


@pytest.fixture
def server(tmp_path):
    sinks = Sinks()
    srv = UnixHttpServer(str(tmp_path / "s.sock"), Routes(sinks.result, sinks.events.append, lambda: {"ok": True}, BadMessage))
    srv.listen()
    srv.sinks = sinks
    yield srv
    srv.close()


def still_serving(conn):
    """The same kept-alive connection takes the next request."""
    assert conn.exchange("POST", "/v1/event", b'{"event": "x"}', JSON) == (204, b"")


def raw(path, data):
    """Bytes in, everything the server sent until it closed: for what no
    HTTP client would send."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(path)
        sock.sendall(data)
        out = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return out
            out += chunk


# -- the socket file ---------------------------------------------------------------


def test_the_socket_is_0600(server):
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600


def test_close_removes_the_socket_and_ends_the_accepting_thread(server):
    server.close()
    server._thread.join(5)
    assert not server._thread.is_alive()
    assert not os.path.exists(server.path)


def test_a_stale_socket_file_is_replaced(tmp_path):
    path = str(tmp_path / "stale.sock")
    killed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    killed.bind(path)
    killed.close()  # as if that daemon had been killed: the file stays
    second = UnixHttpServer(path, Routes(None, None, lambda: {"n": 2}, BadMessage))
    second.listen()
    try:
        assert unix_request(path, "GET", "/v1/status") == (200, b'{"n": 2}')
    finally:
        second.close()


# -- routes and keep-alive ------------------------------------------------------------


def test_one_kept_alive_connection_carries_many_requests(server):
    conn = UnixConnection(server.path)
    for i in range(50):
        assert conn.exchange("POST", "/v1/result", json.dumps({"id": f"c{i}", "ok": True}).encode(), JSON) == (204, b"")
    assert conn.exchange("GET", "/v1/status") == (200, b'{"ok": true}')
    conn.close()
    assert [d["id"] for d in server.sinks.results] == [f"c{i}" for i in range(50)]


def test_a_burst_of_concurrent_connections_is_never_refused(server):
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        statuses = list(pool.map(lambda i: unix_request(server.path, "POST", "/v1/event", json.dumps({"i": i}).encode())[0], range(300)))
    assert statuses == [204] * 300 and len(server.sinks.events) == 300


@pytest.mark.parametrize(
    "method, url, body, status, text",
    [
        ("POST", "/v1/result", b"{", 400, b"the body is not JSON\n"),
        ("POST", "/v1/result", b"{}", 400, b"id must be a string\n"),
        ("POST", "/v1/result", b'{"id": "crash"}', 500, b"the daemon failed to take it (see its log)\n"),
        ("GET", "/v1/result", None, 405, b"method not allowed\n"),
        ("DELETE", "/v1/status", None, 405, b"method not allowed\n"),
        ("PUT", "/v1/event", b"{}", 405, b"method not allowed\n"),
        ("GET", "/nowhere", None, 404, b"no such path\n"),
    ],
)
def test_refusals_say_why_in_one_line(server, method, url, body, status, text):
    conn = UnixConnection(server.path)
    assert conn.exchange(method, url, body) == (status, text)
    still_serving(conn)  # the refused request's body was read past: the connection stays usable
    conn.close()


def test_connection_close_is_honoured(server):
    conn = UnixConnection(server.path)
    conn.request("POST", "/v1/result", b'{"id": "a"}', {"Connection": "close"})
    response = conn.getresponse()
    assert response.status == 204 and response.getheader("Connection") == "close" and response.will_close


# -- limits: the library's bounds and ours ----------------------------------------------


def test_a_chunked_body_is_411_and_the_connection_closes(server):
    conn = UnixConnection(server.path)
    conn.putrequest("POST", "/v1/result")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()  # the answer comes before any chunk is sent
    response = conn.getresponse()
    assert (response.status, response.read()) == (411, b"a Content-Length is required\n") and response.will_close
    assert server.sinks.results == []


def test_a_request_line_that_is_not_http_is_refused_and_the_connection_closed(server):
    # Not HTTP/1.x, so the library answers as HTTP/0.9 would: the reason alone.
    assert raw(server.path, b"hello there friend\r\n\r\n").startswith(b"Bad request version")


def test_a_body_over_the_limit_is_413_without_being_read(server):
    conn = UnixConnection(server.path)
    conn.putrequest("POST", "/v1/result")
    conn.putheader("Content-Length", str(MAX_BODY + 1))
    conn.endheaders()  # and no body: the answer comes without waiting for it
    response = conn.getresponse()
    assert (response.status, response.read()) == (413, b"the body is too large\n") and response.will_close


@pytest.mark.parametrize(
    "url, headers, status",
    [
        ("/" + "x" * 70000, {}, 414),
        ("/v1/status", {"X": "y" * 70000}, 431),
        ("/v1/status", {f"H{i}": "v" for i in range(101)}, 431),
    ],
    ids=["long-request-line", "long-header", "too-many-headers"],
)
def test_what_is_past_the_librarys_bounds_is_refused_and_the_server_goes_on(server, url, headers, status):
    conn = UnixConnection(server.path)
    assert conn.exchange("GET", url, None, headers)[0] == status
    still_serving(UnixConnection(server.path))


# -- hostile bodies ------------------------------------------------------------------------

HOSTILE = {
    "deep-arrays": b"[" * 100_000 + b"]" * 100_000,
    "deep-objects": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "deep-unclosed": b"[" * 1_000_000,
    "invalid-utf8": b'{"id": "\xff\xfe"}',
    "encoded-surrogate": b'{"id": "\xed\xa0\x80"}',
    "huge-integer": b'{"id": "c1", "n": ' + b"9" * 100_000 + b"}",
    "huge-exponent": b'{"id": "c1", "n": 1e999999}',
    "nan": b'{"id": "c1", "n": NaN}',
    "nul": b"\x00",
}


@pytest.mark.parametrize("body", list(HOSTILE.values()), ids=list(HOSTILE))
def test_a_hostile_body_is_one_answer_and_the_connection_goes_on(server, body):
    conn = UnixConnection(server.path)
    status, text = conn.exchange("POST", "/v1/result", body, JSON)
    assert status in (204, 400), (status, text)
    assert text in (b"", b"the body is not JSON\n", f"the body holds more than {MAX_VALUES:,} JSON values\n".encode())
    still_serving(conn)
    conn.close()


def test_escaped_lone_surrogates_and_duplicate_keys_are_taken_as_json_says(server):
    conn = UnixConnection(server.path)
    assert conn.exchange("POST", "/v1/result", b'{"id": "\\ud800", "id": "\\udfff", "ok": true}', JSON)[0] == 204
    assert server.sinks.results == [{"id": "\udfff", "ok": True}]  # the last of a duplicate key wins
    conn.close()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.binary(max_size=300) | st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")) | st.integers(1, 5000).map(lambda n: b"[" * n + b"]" * n))
def test_any_body_is_a_204_or_a_400_and_never_costs_the_connection(server, body):
    conn = UnixConnection(server.path)
    try:
        status, _ = conn.exchange("POST", "/v1/result", body, JSON)
        assert status in (204, 400)
        still_serving(conn)
    finally:
        conn.close()


def test_a_refused_body_is_read_past_in_pieces_never_held_whole(server):
    body = b"x" * (8 * 1024 * 1024)
    conn = UnixConnection(server.path)
    tracemalloc.start()
    try:
        assert conn.exchange("PUT", "/v1/event", body) == (405, b"method not allowed\n")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    still_serving(conn)
    conn.close()
    assert peak < 1024 * 1024, f"reading past 8 MiB took {peak / 2**20:.1f} MiB"
