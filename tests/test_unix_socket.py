"""The daemon's Unix socket (http.server underneath): the routes and their
refusals, keep-alive, bodies it cannot take -- each one answer on a
connection that goes on -- and the bounds on connections, idle time and the
bodies held, which a burst queues behind rather than is refused by."""
import concurrent.futures
import json
import os
import queue
import resource
import socket
import stat
import threading
import tracemalloc

import pytest

from lich_control.bridge import BadMessage
from lich_control.commands import MAX_VALUES
from lich_control.run_folder import NotOurs
from lich_control.unix_socket import MAX_BODY, Connections, Routes, SocketLimits, UnixConnection, UnixHttpServer

from relay import unix_request

JSON = {"Content-Type": "application/json"}
EVENT = b'{"event": "x"}'
WAIT = 10.0


class Sinks:
    """The routes' sinks. A result with id "hold..." waits in the sink until
    `release` is set, each arrival put on `entered`: a request provably in
    the middle of being taken."""

    def __init__(self):
        self.results, self.events = [], []
        self.entered, self.release = queue.Queue(), threading.Event()

    def result(self, doc):
        if not isinstance(doc, dict) or "id" not in doc:
            raise BadMessage("id must be a string")
        if doc["id"] == "crash":
            raise KeyError("a bug in the daemon")
        if doc["id"].startswith("hold"):
            self.entered.put(doc["id"])
            assert self.release.wait(WAIT)
        self.results.append(doc)

    def routes(self):
        return Routes(self.result, self.events.append, lambda: {"ok": True}, BadMessage)


@pytest.fixture
def serve(tmp_path):
    """A server with these limits, its sinks as `.sinks`; closed after the test."""
    started = []

    def make(**limits):
        sinks = Sinks()
        srv = UnixHttpServer(str(tmp_path / f"s{len(started)}.sock"), sinks.routes(), SocketLimits(**limits))
        srv.listen()
        srv.sinks = sinks
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.sinks.release.set()
        srv.close()


@pytest.fixture
def server(serve):
    return serve()


def still_serving(conn):
    """The same kept-alive connection takes the next request."""
    assert conn.exchange("POST", "/v1/event", EVENT, JSON) == (204, b"")


def post_in_background(pool, path, cid):
    return pool.submit(unix_request, path, "POST", "/v1/result", json.dumps({"id": cid}).encode(), JSON, WAIT)


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
        UnixHttpServer(str(path), Routes(None, None, dict, BadMessage)).listen()
    assert path.is_dir()


def test_a_stale_socket_file_is_replaced(tmp_path):
    path = str(tmp_path / "stale.sock")
    killed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    killed.bind(path)
    killed.close()  # as if that daemon had been killed: the file stays
    with UnixHttpServer(path, Routes(None, None, lambda: {"n": 2}, BadMessage)):
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
    # 64 at once, the bound: those past it wait their turn in the backlog.
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        statuses = list(pool.map(lambda i: unix_request(server.path, "POST", "/v1/event", json.dumps({"i": i}).encode())[0], range(300)))
    assert statuses == [204] * 300 and len(server.sinks.events) == 300


@pytest.mark.parametrize(
    "method, url, body, status, text",
    [
        ("POST", "/v1/result", b"{", 400, b"the body is not JSON\n"),
        ("POST", "/v1/result", b"[" * 5000 + b"]" * 5000, 400, b"the body is not JSON\n"),
        ("POST", "/v1/result", b"[" + b"0," * MAX_VALUES + b"0]", 400, f"the body holds more than {MAX_VALUES:,} JSON values\n".encode()),
        ("POST", "/v1/result", b"{}", 400, b"id must be a string\n"),
        ("GET", "/v1/result", None, 405, b"method not allowed\n"),
        ("PUT", "/v1/event", b"{}", 405, b"method not allowed\n"),
        ("GET", "/nowhere", None, 404, b"no such path\n"),
    ],
    ids=["not-json", "deeper-than-the-stack", "too-many-values", "wrong-shape", "get", "put", "elsewhere"],
)
def test_refusals_say_why_in_one_line_and_the_connection_goes_on(server, method, url, body, status, text):
    conn = UnixConnection(server.path)
    assert conn.exchange(method, url, body, JSON) == (status, text)
    still_serving(conn)  # a refused request's body was read past
    conn.close()


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


# -- the bounds on connections and on bodies held ------------------------------------------


def test_at_the_bound_the_connection_idle_the_longest_gives_way():
    connections = Connections(2)
    pairs = [socket.socketpair() for _ in range(3)]
    first, second, newcomer = (server_end for server_end, _ in pairs)
    try:
        assert connections.admit(first) and connections.admit(second)
        connections.idle(second)
        connections.idle(first)  # idle again after second: second has been idle longer
        assert connections.admit(newcomer)
        pairs[1][1].settimeout(WAIT)
        assert pairs[1][1].recv(1) == b""  # hung up: its thread would wake and end
        assert connections.begin(first) and not connections.begin(second)
    finally:
        for pair in pairs:
            for end in pair:
                end.close()


def test_a_connection_in_the_middle_of_a_request_is_never_the_one_closed(serve):
    srv = serve(connections=3)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = post_in_background(pool, srv.path, "hold")
        assert srv.sinks.entered.get(timeout=WAIT) == "hold"
        # Each newcomer, kept open, takes an idle one's place, never the request's.
        kept = [UnixConnection(srv.path, WAIT) for _ in range(20)]
        for conn in kept:
            still_serving(conn)
        srv.sinks.release.set()
        assert held.result(WAIT) == (204, b"")
    still_serving(kept[-1])


def test_with_every_connection_in_a_request_a_newcomer_waits_its_turn_and_is_answered(serve):
    srv = serve(connections=2)
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        held = [post_in_background(pool, srv.path, f"hold{n}") for n in range(2)]
        assert {srv.sinks.entered.get(timeout=WAIT) for _ in held} == {"hold0", "hold1"}
        newcomer = post_in_background(pool, srv.path, "c1")
        srv.sinks.release.set()
        assert [f.result(WAIT) for f in held + [newcomer]] == [(204, b"")] * 3  # queued, never refused


def test_past_the_bodies_held_at_once_a_body_waits_for_one_to_be_taken(serve):
    srv = serve(bodies_at_once=1)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        first = post_in_background(pool, srv.path, "hold1")
        assert srv.sinks.entered.get(timeout=WAIT) == "hold1"
        second = post_in_background(pool, srv.path, "hold2")
        with pytest.raises(queue.Empty):
            srv.sinks.entered.get(timeout=0.3)  # not read, nor handed on, while the first is held
        srv.sinks.release.set()
        assert srv.sinks.entered.get(timeout=WAIT) == "hold2"
        assert (first.result(WAIT), second.result(WAIT)) == ((204, b""), (204, b""))


# -- the daemon, under a low descriptor limit ---------------------------------------------------

# Far past the bound of 64, and within a normal user's 1,024 descriptors.
IDLE_FLOOD = 400


def flood(path, n):
    """`n` connections opened and left idle, all of them accepted: the last
    one's answer shows the server has taken every one before it. Each connect
    blocks while the server's backlog is full, as a client's would; a thread
    does it, so a server that stops accepting fails the test, not hangs it."""
    out = queue.Queue()

    def run():
        socks = []
        try:
            for _ in range(n):
                sock = socket.socket(socket.AF_UNIX)
                socks.append(sock)
                sock.connect(path)
            socks[-1].sendall(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n")
            socks[-1].recv(4096)
        finally:
            out.put(socks)

    threading.Thread(target=run, daemon=True).start()
    try:
        socks = out.get(timeout=60)
    except queue.Empty:
        raise AssertionError(f"the server stopped accepting before {n} connections") from None
    assert len(socks) == n, "a connect failed"
    return socks


def threads_of(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def test_the_daemon_under_a_low_descriptor_limit_serves_the_relay_through_hundreds_of_idle_connections(relay, lich):
    r = relay()
    r.wait_hello()
    resource.prlimit(r.proc.pid, resource.RLIMIT_NOFILE, (128, 128))
    assert lich.wait_polled("s1", WAIT, parked=True)
    baseline = threads_of(r.proc.pid)
    idle = []
    try:
        idle = flood(r.socket, IDLE_FLOOD)
        assert r.status()["daemon"]["session_id"] == "s1"
        lich.queue_all("s1", [{"id": "m1", "kind": "prompt", "text": "go"}])
        call = r.next_call()
        r.event("turn.start", "t1")
        r.result(call["id"], {"text": "go"})  # asserts the 204
        assert lich.record.ack_for("m1")["ok"] is True
        # At most the bound, and the odd thread of a closed connection on its way out.
        assert threads_of(r.proc.pid) <= baseline + 64 + 4
        assert not any("Too many open files" in line for line in r.stderr_lines), r.stderr_lines
    finally:
        for sock in idle:
            sock.close()
