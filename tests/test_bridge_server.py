"""The daemon's socket (socketserver and http.server underneath), on each
listener this system has -- a Unix socket, and loopback TCP with its secret
(Windows' listener, tested here on every system) -- the routes and their
refusals, keep-alive, bodies it cannot take -- each one answer on a
connection that goes on -- the idle limit, and a burst queued, never
refused; then what is each listener's own, and what a connection without
the secret can cost the loopback listener."""
import concurrent.futures
import http.client
import json
import os
import socket
import stat
import time

import pytest
from freezegun import freeze_time

from lich_control.bridge import BadMessage
from lich_control.json_reader import MAX_VALUES
from lich_control.run_folder import NotOurs
from lich_control.bridge_server import MAX_BODY, SECRET_HEADER, Address, BridgeServer, DaemonConnection, LoopbackListener, Routes, UnixListener, read_address

from relay import daemon_request

JSON = {"Content-Type": "application/json"}
EVENT = b'{"event": "x"}'
WAIT = 10.0
LISTENERS = [
    pytest.param("unix", marks=pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no Unix sockets on this system (Windows)")),
    "loopback",
]
unix_only = pytest.mark.skipif(not hasattr(socket, "AF_UNIX"), reason="no Unix sockets on this system (Windows)")


def listener(kind, path):
    return UnixListener(path + ".sock") if kind == "unix" else LoopbackListener(path + ".address")


def connect(srv, timeout=10.0):
    return DaemonConnection(srv.listener.address, timeout)


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


@pytest.fixture(params=LISTENERS)
def serve(tmp_path, request):
    """A server on each listener (`idle_seconds` may be given), its sinks as `.sinks`; closed after the test."""
    started = []

    def make(**idle):
        sinks = Sinks()
        srv = BridgeServer(listener(request.param, str(tmp_path / f"s{len(started)}")), sinks.routes(), **idle)
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


# -- the listener's file ---------------------------------------------------------------


def test_close_removes_the_listeners_file_and_ends_the_accepting_thread(server):
    server.close()
    server._thread.join(WAIT)
    assert not server._thread.is_alive()
    assert not os.path.exists(server.listener.path)


@unix_only
def test_the_socket_is_0600(tmp_path):
    with BridgeServer(UnixListener(str(tmp_path / "s.sock")), Routes(None, None, dict)) as srv:
        assert stat.S_IMODE(os.stat(srv.listener.path).st_mode) == 0o600


@unix_only
def test_what_is_not_a_socket_at_its_name_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "s1.sock"
    path.mkdir()
    with pytest.raises(NotOurs, match="is not a socket"):
        BridgeServer(UnixListener(str(path)), Routes(None, None, dict)).listen()
    assert path.is_dir()


@unix_only
def test_a_stale_socket_file_is_replaced(tmp_path):
    path = str(tmp_path / "stale.sock")
    killed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    killed.bind(path)
    killed.close()  # as if that daemon had been killed: the file stays
    with BridgeServer(UnixListener(path), Routes(None, None, lambda: {"n": 2})):
        assert daemon_request(Address(socket=path), "GET", "/v1/status") == (200, b'{"n": 2}')


# -- the loopback listener: its secret and its address file ------------------------------


@pytest.fixture
def loopback(tmp_path):
    sinks = Sinks()
    with BridgeServer(LoopbackListener(str(tmp_path / "s1.address")), sinks.routes()) as srv:
        srv.sinks = sinks
        yield srv


def test_the_loopback_listener_is_on_127_0_0_1_with_a_secret_of_its_own(loopback, tmp_path):
    assert loopback.server_address[0] == "127.0.0.1"
    other = LoopbackListener(str(tmp_path / "s2.address"))
    assert len(loopback.listener.secret) >= 43 and other.secret != loopback.listener.secret  # 32 random bytes


def test_its_address_file_names_pid_port_and_secret_and_goes_at_the_close(loopback):
    path = loopback.listener.path
    with open(path) as file:
        assert json.load(file) == {"pid": os.getpid(), "port": loopback.listener.port, "secret": loopback.listener.secret}
    assert daemon_request(read_address(path), "GET", "/v1/status") == (200, b'{"ok": true}')
    loopback.close()
    assert not os.path.exists(path)


def test_a_stale_address_file_is_replaced(tmp_path):
    path = tmp_path / "s1.address"
    path.write_text('{"pid": 1, "port": 1, "secret": "old"}')  # a killed daemon's
    with BridgeServer(LoopbackListener(str(path)), Routes(None, None, dict)) as srv:
        assert read_address(str(path)) == srv.listener.address


@pytest.mark.parametrize("secret", [None, "wrong", ""], ids=["missing", "wrong", "empty"])
def test_a_request_without_the_secret_is_403_logged_without_it_and_reaches_no_sink(loopback, secret, caplog):
    # Head and body in one write: the refusal is answered from the head, and
    # a body written after it could meet a closed connection.
    header = f"{SECRET_HEADER}: {secret}\r\n" if secret is not None else ""
    head = f"POST /v1/event HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{header}Content-Length: {len(EVENT)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", loopback.listener.port), timeout=WAIT) as sock:
        sock.sendall(head.encode() + EVENT)
        response = http.client.HTTPResponse(sock)
        response.begin()
        assert (response.status, response.read()) == (403, b"the bridge's secret is missing or wrong\n") and response.will_close
    assert loopback.sinks.events == []
    said = [r.getMessage() for r in caplog.records if r.name == "lich_control.socket"]
    assert said == [f"refused POST /v1/event on the bridge: {'no secret' if secret is None else 'a wrong secret'}"]
    assert loopback.listener.secret not in caplog.text


# -- routes and keep-alive ------------------------------------------------------------


def test_one_kept_alive_connection_carries_many_requests(server):
    conn = connect(server)
    for i in range(20):
        assert conn.exchange("POST", "/v1/result", json.dumps({"id": f"c{i}"}).encode(), JSON) == (204, b"")
    assert conn.exchange("GET", "/v1/status") == (200, b'{"ok": true}')
    conn.close()
    assert [d["id"] for d in server.sinks.results] == [f"c{i}" for i in range(20)]


def test_a_burst_of_concurrent_connections_is_never_refused(server):
    # 64 at once: those past the accepting thread wait their turn in the backlog.
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        statuses = list(pool.map(lambda i: daemon_request(server.listener.address, "POST", "/v1/event", json.dumps({"i": i}).encode())[0], range(300)))
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
    conn = connect(server)
    assert conn.exchange("POST", "/v1/result", body, JSON) == (400, text)
    still_serving(conn)
    conn.close()


@pytest.mark.parametrize(
    "method, url, status, text",
    [("GET", "/v1/result", 405, b"method not allowed\n"), ("PUT", "/v1/event", 405, b"method not allowed\n"), ("GET", "/nowhere", 404, b"no such path\n")],
)
def test_a_request_no_relay_makes_is_refused_in_one_line_and_the_connection_closed(server, method, url, status, text):
    conn = connect(server)
    # No body: the server answers from the request line and may close before
    # reading one, which a client still writing it meets as a broken pipe.
    conn.request(method, url)
    response = conn.getresponse()
    assert (response.status, response.read()) == (status, text) and response.will_close
    still_serving(connect(server))


def test_a_bug_in_a_route_is_a_500_and_the_server_goes_on(server):
    conn = connect(server)
    conn.request("POST", "/v1/result", b'{"id": "crash"}', JSON)
    response = conn.getresponse()
    assert (response.status, response.read()) == (500, b"the daemon failed to answer (see its log)\n") and response.will_close
    still_serving(connect(server))


def test_a_chunked_body_is_411_and_the_connection_closes(server):
    conn = connect(server)
    conn.putrequest("POST", "/v1/result")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()  # the answer comes before any chunk is sent
    response = conn.getresponse()
    assert (response.status, response.read()) == (411, b"a Content-Length is required\n") and response.will_close
    assert server.sinks.results == []


def test_a_body_over_the_limit_is_413_without_being_read(server):
    conn = connect(server)
    conn.putrequest("POST", "/v1/result")
    conn.putheader("Content-Length", str(MAX_BODY + 1))
    conn.endheaders()  # and no body: the answer comes without waiting for it
    response = conn.getresponse()
    assert (response.status, response.read()) == (413, b"the body is too large\n") and response.will_close


# -- idle time ---------------------------------------------------------------------------


def test_an_idle_connection_is_closed_past_the_idle_limit(serve):
    # A connection that never sends: one that sent first would race the limit.
    srv = serve(idle_seconds=0.2)
    with socket.socket(srv.address_family) as sock:
        sock.settimeout(WAIT)
        sock.connect(srv.server_address)
        assert sock.recv(4096) == b""


def test_a_client_is_told_the_idle_limit_of_60_seconds(server):
    conn = connect(server, WAIT)
    conn.request("GET", "/v1/status")
    assert conn.getresponse().getheader("Keep-Alive") == "timeout=60"


# -- the loopback listener: what a connection without the secret costs ------------------
# Any local program can connect to 127.0.0.1: until a connection's first
# request shows the secret, its head has a deadline and a budget, and the
# connections held at once are capped.


def closed(sock):
    """True once the server has closed `sock` (EOF, or a reset for what it left unread)."""
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def test_a_head_trickled_a_byte_at_a_time_is_cut_at_the_head_deadline(tmp_path):
    # The idle limit (60 s) bounds each read: a byte every 50 ms passes it for ever.
    with BridgeServer(LoopbackListener(str(tmp_path / "s1.address"), head_seconds=0.5), Routes(None, None, dict)) as srv:
        with socket.create_connection(srv.server_address, timeout=WAIT) as sock:
            start = time.monotonic()
            sock.sendall(b"GET /v1/status HTTP/1.1\r\nX-Slow: ")
            sock.settimeout(0.05)  # the trickle's pace: a byte each time this read times out
            while time.monotonic() - start < WAIT:
                try:
                    assert closed(sock)
                    break
                except socket.timeout:
                    sock.sendall(b"a")
            else:
                pytest.fail(f"the connection outlived a head trickled for {WAIT:g} s")
            assert time.monotonic() - start >= 0.5


def test_a_head_over_its_budget_is_cut_before_it_ends(tmp_path):
    # Lines under http.server's bounds (64 KiB each, 100 of them), and no end.
    with BridgeServer(LoopbackListener(str(tmp_path / "s1.address"), head_bytes=1024), Routes(None, None, dict)) as srv:
        with socket.create_connection(srv.server_address, timeout=WAIT) as sock:
            sock.sendall(b"GET /v1/status HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 4000 + b"\r\n")
            assert closed(sock)


def test_past_the_connection_cap_a_newcomer_is_closed_at_once_and_one_with_the_secret_is_served_once_a_slot_frees(tmp_path):
    # Slots free as connections end: here a stranger's 403, otherwise the head deadline (10 s).
    with BridgeServer(LoopbackListener(str(tmp_path / "s1.address"), connections=2, head_seconds=60.0), Routes(None, None, dict)) as srv:
        port = srv.listener.port
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as first, socket.create_connection(("127.0.0.1", port), timeout=WAIT) as second:
            # Accepted in the order they came: the third finds both slots held.
            with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as third:
                assert closed(third)
            first.sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
            response = http.client.HTTPResponse(first)
            response.begin()
            assert response.status == 403 and response.will_close
            response.read()
            assert closed(first)  # its slot is free by then
            conn = connect(srv)
            assert [conn.exchange("GET", "/v1/status") for _ in range(2)] == [(200, b"{}")] * 2
            conn.close()


def test_a_connection_that_showed_the_secret_is_no_longer_held_to_the_head_deadline(tmp_path):
    # A relay's kept-alive connection waits the idle limit between its requests, not the head deadline.
    with freeze_time("2026-12-06 12:00:00") as clock:
        with BridgeServer(LoopbackListener(str(tmp_path / "s1.address"), head_seconds=1.0), Routes(None, None, dict)) as srv:
            conn = connect(srv)
            assert conn.exchange("GET", "/v1/status") == (200, b"{}")
            clock.tick(30)
            assert conn.exchange("GET", "/v1/status") == (200, b"{}")
            conn.close()

