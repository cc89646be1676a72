"""The daemon's Unix socket (http.server underneath): the routes and their
refusals, keep-alive, hostile bodies -- each a 400 on a connection that goes
on, never a dead thread or a dropped connection -- and the bounds on
connections, idle time and the bytes held, which a burst queues behind
rather than is refused by."""
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lich_control.bridge import BadMessage
from lich_control.run_folder import NotOurs
from lich_control.commands import MAX_VALUES
from lich_control.unix_socket import MAX_BODY, ByteBudget, Connections, Routes, SocketLimits, UnixConnection, UnixHttpServer, unix_request

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
    # 64 at once, the bound: those past it wait their turn in the backlog.
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


# -- the bounds -----------------------------------------------------------------------------

EVENT = b'{"event": "x"}'
WAIT = 10.0


def start(tmp_path, **limits):
    events = []
    srv = UnixHttpServer(str(tmp_path / "s.sock"), Routes(events.append, events.append, lambda: {"ok": True}, BadMessage), SocketLimits(**limits))
    srv.listen()
    srv.events = events
    return srv


@pytest.fixture
def servers(tmp_path):
    started = []

    def make(**limits):
        srv = start(tmp_path, **limits)
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.close()


def connected(path):
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(WAIT)
    sock.connect(path)
    return sock


def used(path):
    """A connection that carried one request and now waits, idle, for the next."""
    conn = UnixConnection(path, WAIT)
    assert conn.exchange("POST", "/v1/event", EVENT, JSON) == (204, b"")
    return conn


def begun(path):
    """A connection whose request is half sent: its head, and half its body."""
    sock = connected(path)
    sock.sendall(b"POST /v1/event HTTP/1.1\r\nHost: x\r\nContent-Length: 14\r\n\r\n" + EVENT[:7])
    return sock


def finish(sock):
    sock.sendall(EVENT[7:])
    return sock.recv(4096)


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


def closed_by_server(sock):
    """True once the server has closed `sock` (the read ends; a bounded wait)."""
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


# -- idle time ---------------------------------------------------------------------------


def test_an_idle_connection_is_closed_past_the_idle_limit(servers):
    # A connection that never sends: one that sent first would race the limit
    # on a busy machine.
    srv = servers(idle_seconds=0.2)
    assert closed_by_server(connected(srv.path))


def test_a_client_is_told_the_idle_limit_of_60_seconds(servers):
    conn = UnixConnection(servers().path, WAIT)
    conn.request("GET", "/v1/status")
    assert conn.getresponse().getheader("Keep-Alive") == "timeout=60"


# -- the bound on connections ----------------------------------------------------------------


def test_at_the_bound_the_connection_idle_the_longest_gives_way():
    connections = Connections(2)
    pairs = [socket.socketpair() for _ in range(3)]
    first, second, newcomer = (server_end for server_end, _ in pairs)
    try:
        assert connections.admit(first) and connections.admit(second)
        connections.idle(second)
        connections.idle(first)  # second has been idle longer
        assert connections.admit(newcomer)
        assert pairs[1][1].recv(1) == b""  # hung up: its thread would wake and end
        assert connections.begin(first) and not connections.begin(second)
    finally:
        for pair in pairs:
            for end in pair:
                end.close()


def test_a_connection_in_the_middle_of_a_request_is_never_the_one_closed(servers):
    srv = servers(connections=3)
    mid = begun(srv.path)
    # Each newcomer, kept open, takes an idle one's place, never the request's.
    kept = [used(srv.path) for _ in range(20)]
    assert finish(mid).startswith(b"HTTP/1.1 204")
    assert len(srv.connections) <= 3 and kept[-1].exchange("GET", "/v1/status")[0] == 200


def test_with_every_connection_in_a_request_a_newcomer_waits_its_turn_and_is_answered(servers):
    srv = servers(connections=2)
    held = [begun(srv.path) for _ in range(2)]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        newcomer = pool.submit(unix_request, srv.path, "POST", "/v1/result", b'{"id": "c1"}', JSON, WAIT)
        assert [finish(sock).startswith(b"HTTP/1.1 204") for sock in held] == [True, True]
        assert newcomer.result(WAIT) == (204, b"")  # queued, never refused


def test_the_body_budget_makes_a_reader_wait_until_the_bytes_it_needs_are_given_back():
    budget = ByteBudget(10)
    budget.take(8)
    taken = threading.Event()
    threading.Thread(target=lambda: (budget.take(5), taken.set()), daemon=True).start()
    assert not taken.wait(0.2)  # 2 free, 5 wanted
    budget.give(8)
    assert taken.wait(WAIT)


def test_bodies_past_the_budget_are_read_one_after_the_other(servers, tmp_path):
    # 1 MiB of budget and two bodies of 1 MiB: the second is not read, nor
    # handed on, before the first has been taken.
    meeting = threading.Barrier(2, timeout=1.0)
    met = []

    def sink(doc):
        try:
            meeting.wait()
            met.append(True)
        except threading.BrokenBarrierError:
            met.append(False)
            meeting.reset()

    srv = UnixHttpServer(str(tmp_path / "b.sock"), Routes(sink, sink, dict, BadMessage), SocketLimits(body_budget=1 << 20))
    srv.listen()
    body = json.dumps({"id": "c", "pad": "x" * ((1 << 20) - 30)}).encode()
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            statuses = list(pool.map(lambda _: unix_request(srv.path, "POST", "/v1/result", body, JSON, WAIT)[0], range(2)))
    finally:
        srv.close()
    assert statuses == [204, 204] and met == [False, False]


# Far past the bound of 64, and within a normal user's 1,024 descriptors,
# the server's own included when it runs in the test's process.
IDLE_FLOOD = 400


def socket_threads():
    return sum(1 for t in threading.enumerate() if t.name == "lich-socket-conn")


def test_hundreds_of_idle_connections_leave_status_and_results_working_on_bounded_threads(servers):
    srv = servers()
    before = socket_threads()
    idle = []
    try:
        idle = flood(srv.path, IDLE_FLOOD)
        assert unix_request(srv.path, "GET", "/v1/status", timeout=WAIT) == (200, b'{"ok": true}')
        assert unix_request(srv.path, "POST", "/v1/result", b'{"id": "c1"}', JSON, timeout=WAIT) == (204, b"")
        # At most the bound, and the odd thread of a closed connection on its way out.
        assert socket_threads() - before <= 64 + 4
    finally:
        for sock in idle:
            sock.close()


# -- the accepting thread -----------------------------------------------------------------------


# -- the daemon, under a low descriptor limit ---------------------------------------------------


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
        assert threads_of(r.proc.pid) <= baseline + 64 + 4
        assert not any("Too many open files" in line for line in r.stderr_lines), r.stderr_lines
    finally:
        for sock in idle:
            sock.close()
