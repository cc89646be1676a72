"""The daemon's Unix socket (socketserver and http.server underneath): the
routes and their refusals, keep-alive, bodies it cannot take -- each one
answer on a connection that goes on -- the idle limit, and a burst queued,
never refused."""
import concurrent.futures
import json
import os
import socket
import stat

import pytest

from lich_control.bridge import BadMessage
from lich_control.json_reader import MAX_VALUES
from lich_control.run_folder import NotOurs
from lich_control.unix_socket import MAX_BODY, Routes, UnixConnection, UnixHttpServer

from relay import unix_request

JSON = {"Content-Type": "application/json"}
EVENT = b'{"event": "x"}'
WAIT = 10.0


class Sinks:
    """The routes' sinks: what they took, and a result with id "crash" a bug."""

    def __init__(self):
        self.results, self.events = [], []

    def result(self, doc):
        if not isinstance(doc, dict) or "id" not in doc:
            raise BadMessage("id must be a string")
        if doc["id"] == "crash":
            raise KeyError("a bug in the daemon")
        self.results.append(doc)

    def routes(self):
        return Routes(self.result, self.events.append, lambda: {"ok": True})


@pytest.fixture
def serve(tmp_path):
    """A server (`idle_seconds` may be given), its sinks as `.sinks`; closed after the test."""
    started = []

    def make(**idle):
        sinks = Sinks()
        srv = UnixHttpServer(str(tmp_path / f"s{len(started)}.sock"), sinks.routes(), **idle)
        srv.listen()
        srv.sinks = sinks
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.close()


@pytest.fixture
def server(serve):
    return serve()


def still_serving(conn):
    """The same kept-alive connection takes the next request."""
    assert conn.exchange("POST", "/v1/event", EVENT, JSON) == (204, b"")


# -- the socket file ---------------------------------------------------------------


def test_the_socket_is_0600(server):
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600


def test_close_removes_the_socket_and_ends_the_accepting_thread(server):
    server.close()
    server._thread.join(WAIT)
    assert not server._thread.is_alive()
    assert not os.path.exists(server.path)


def test_what_is_not_a_socket_at_its_name_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "s1.sock"
    path.mkdir()
    with pytest.raises(NotOurs, match="is not a socket"):
        UnixHttpServer(str(path), Routes(None, None, dict)).listen()
    assert path.is_dir()


def test_a_stale_socket_file_is_replaced(tmp_path):
    path = str(tmp_path / "stale.sock")
    killed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    killed.bind(path)
    killed.close()  # as if that daemon had been killed: the file stays
    with UnixHttpServer(path, Routes(None, None, lambda: {"n": 2})):
        assert unix_request(path, "GET", "/v1/status") == (200, b'{"n": 2}')


# -- routes and keep-alive ------------------------------------------------------------


def test_one_kept_alive_connection_carries_many_requests(server):
    conn = UnixConnection(server.path)
    for i in range(20):
        assert conn.exchange("POST", "/v1/result", json.dumps({"id": f"c{i}"}).encode(), JSON) == (204, b"")
    assert conn.exchange("GET", "/v1/status") == (200, b'{"ok": true}')
    conn.close()
    assert [d["id"] for d in server.sinks.results] == [f"c{i}" for i in range(20)]


def test_a_burst_of_concurrent_connections_is_never_refused(server):
    # 64 at once: those past the accepting thread wait their turn in the backlog.
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        statuses = list(pool.map(lambda i: unix_request(server.path, "POST", "/v1/event", json.dumps({"i": i}).encode())[0], range(300)))
    assert statuses == [204] * 300 and len(server.sinks.events) == 300


@pytest.mark.parametrize(
    "body, text",
    [
        (b"{", b"the body is not JSON\n"),
        (b"[" * 5000 + b"]" * 5000, b"the body is not JSON\n"),
        (b"[" + b"0," * MAX_VALUES + b"0]", f"the body holds more than {MAX_VALUES:,} JSON values\n".encode()),
        (b"{}", b"id must be a string\n"),
    ],
    ids=["not-json", "deeper-than-the-stack", "too-many-values", "wrong-shape"],
)
def test_a_body_refused_says_why_in_one_line_and_the_connection_goes_on(server, body, text):
    conn = UnixConnection(server.path)
    assert conn.exchange("POST", "/v1/result", body, JSON) == (400, text)
    still_serving(conn)
    conn.close()


@pytest.mark.parametrize(
    "method, url, status, text",
    [("GET", "/v1/result", 405, b"method not allowed\n"), ("PUT", "/v1/event", 405, b"method not allowed\n"), ("GET", "/nowhere", 404, b"no such path\n")],
)
def test_a_request_no_relay_makes_is_refused_in_one_line_and_the_connection_closed(server, method, url, status, text):
    conn = UnixConnection(server.path)
    conn.request(method, url, b"{}", JSON)
    response = conn.getresponse()
    assert (response.status, response.read()) == (status, text) and response.will_close
    still_serving(UnixConnection(server.path))


def test_a_bug_in_a_route_is_a_500_and_the_server_goes_on(server):
    conn = UnixConnection(server.path)
    conn.request("POST", "/v1/result", b'{"id": "crash"}', JSON)
    response = conn.getresponse()
    assert (response.status, response.read()) == (500, b"the daemon failed to answer (see its log)\n") and response.will_close
    still_serving(UnixConnection(server.path))


def test_a_chunked_body_is_411_and_the_connection_closes(server):
    conn = UnixConnection(server.path)
    conn.putrequest("POST", "/v1/result")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()  # the answer comes before any chunk is sent
    response = conn.getresponse()
    assert (response.status, response.read()) == (411, b"a Content-Length is required\n") and response.will_close
    assert server.sinks.results == []


def test_a_body_over_the_limit_is_413_without_being_read(server):
    conn = UnixConnection(server.path)
    conn.putrequest("POST", "/v1/result")
    conn.putheader("Content-Length", str(MAX_BODY + 1))
    conn.endheaders()  # and no body: the answer comes without waiting for it
    response = conn.getresponse()
    assert (response.status, response.read()) == (413, b"the body is too large\n") and response.will_close


# -- idle time ---------------------------------------------------------------------------


def test_an_idle_connection_is_closed_past_the_idle_limit(serve):
    # A connection that never sends: one that sent first would race the limit.
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(WAIT)
        sock.connect(serve(idle_seconds=0.2).path)
        assert sock.recv(4096) == b""


def test_a_client_is_told_the_idle_limit_of_60_seconds(server):
    conn = UnixConnection(server.path, WAIT)
    conn.request("GET", "/v1/status")
    assert conn.getresponse().getheader("Keep-Alive") == "timeout=60"
