"""The socket under hostile load: a bound on connections and on idle time
that the relay's own requests always get through, and an accepting thread
that no failure ends."""
import errno
import logging
import queue
import resource
import socket
import threading

import pytest

from lich_control.bridge import BadMessage
from lich_control.socket_connections import SocketLimits
from lich_control.unix_socket import Routes, UnixConnection, UnixHttpServer, unix_request

JSON = {"Content-Type": "application/json"}
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


def states(srv):
    return srv._server.connections


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


def test_at_the_bound_the_connection_idle_the_longest_gives_way(servers):
    srv = servers(connections=3)
    oldest, second, third = used(srv.path), used(srv.path), used(srv.path)
    assert states(srv).wait_until(lambda s: s == ["idle"] * 3, WAIT)
    newcomer = UnixConnection(srv.path, WAIT)
    assert newcomer.exchange("GET", "/v1/status") == (200, b'{"ok": true}')
    assert closed_by_server(oldest.sock)
    for conn in (second, third, newcomer):
        assert conn.exchange("POST", "/v1/event", EVENT, JSON) == (204, b"")


def test_a_connection_in_the_middle_of_a_request_is_never_the_one_closed(servers):
    srv = servers(connections=3)
    mid = begun(srv.path)
    assert states(srv).wait_until(lambda s: s == ["reading"], WAIT)
    idle = [used(srv.path) for _ in range(2)]
    assert states(srv).wait_until(lambda s: s == ["reading", "idle", "idle"], WAIT)
    # Each newcomer, kept open, takes an idle one's place, never the request's.
    newcomers = [used(srv.path) for _ in range(20)]
    assert all(closed_by_server(conn.sock) for conn in idle + newcomers[:-2])
    assert finish(mid).startswith(b"HTTP/1.1 204")


def test_with_every_connection_in_a_request_a_new_one_is_refused_and_the_requests_finish(servers):
    srv = servers(connections=2)
    held = [begun(srv.path) for _ in range(2)]
    assert states(srv).wait_until(lambda s: s == ["reading", "reading"], WAIT)
    refused = connected(srv.path)
    assert closed_by_server(refused)
    assert [finish(sock).startswith(b"HTTP/1.1 204") for sock in held] == [True, True]
    assert unix_request(srv.path, "GET", "/v1/status", timeout=WAIT)[0] == 200  # and room again


def test_a_request_stalled_past_the_stall_limit_gives_way(servers):
    srv = servers(connections=1, stall_seconds=0)
    stalled = begun(srv.path)
    assert states(srv).wait_until(lambda s: s == ["reading"], WAIT)
    assert unix_request(srv.path, "GET", "/v1/status", timeout=WAIT)[0] == 200
    assert closed_by_server(stalled)


def socket_threads():
    return sum(1 for t in threading.enumerate() if t.name == "lich-socket-conn")


def test_a_thousand_idle_connections_leave_status_and_results_working_on_bounded_threads(servers):
    srv = servers()
    before = socket_threads()
    idle = []
    try:
        idle = flood(srv.path, 1000)
        assert unix_request(srv.path, "GET", "/v1/status", timeout=WAIT) == (200, b'{"ok": true}')
        assert unix_request(srv.path, "POST", "/v1/result", b'{"id": "c1"}', JSON, timeout=WAIT) == (204, b"")
        # At most the bound, and the odd thread of a closed connection on its way out.
        assert socket_threads() - before <= 64 + 4
    finally:
        for sock in idle:
            sock.close()


# -- the accepting thread -----------------------------------------------------------------------


class Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_the_accepting_thread_outlives_a_failure_of_its_own(tmp_path):
    srv = UnixHttpServer(str(tmp_path / "s.sock"), Routes(None, None, lambda: {"ok": True}, BadMessage))
    real = srv._server.handle_request
    failures = iter([OSError(errno.EIO, "Input/output error"), RuntimeError("can't start new thread")])
    failed = threading.Event()

    def faulty():
        fault = next(failures, None)
        if fault is None:
            return real()
        failed.set()
        raise fault

    srv._server.handle_request = faulty
    logged = Lines()
    logging.getLogger("lich_control.socket").addHandler(logged)
    srv.listen()
    try:
        assert failed.wait(WAIT)
        assert unix_request(srv.path, "GET", "/v1/status", timeout=WAIT) == (200, b'{"ok": true}')
        assert srv._thread.is_alive()
        assert any(line.startswith("accepting on the socket failed (OSError: [Errno 5]") for line in logged.lines), logged.lines
    finally:
        srv.close()
        logging.getLogger("lich_control.socket").removeHandler(logged)


# -- the daemon, under a low descriptor limit ---------------------------------------------------


def threads_of(pid):
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("Threads:"))


def test_the_daemon_under_a_low_descriptor_limit_serves_the_relay_through_a_thousand_idle_connections(relay, lich):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip("the test needs 1,200 descriptors of its own")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    r = relay()
    r.wait_hello()
    resource.prlimit(r.proc.pid, resource.RLIMIT_NOFILE, (128, 128))
    assert lich.wait_polled("s1", WAIT, parked=True)
    baseline = threads_of(r.proc.pid)
    idle = []
    try:
        idle = flood(r.socket, 1000)
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
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
