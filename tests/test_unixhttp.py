import concurrent.futures
import json
import os
import stat

import pytest

from lich_control.bridge import BadMessage
from lich_control.unix_socket import Routes, UnixHttpServer
from relay import UnixConnection, unix_request


@pytest.fixture
def server(run_dir):
    taken = []

    def result(doc):
        if doc == "bad":
            raise BadMessage("the body must be a JSON object")
        taken.append(doc)

    srv = UnixHttpServer(os.path.join(run_dir, "t.sock"), Routes(result, taken.append, lambda: {"ok": True}, BadMessage))
    srv.listen()
    yield srv, taken
    srv.close()


def test_the_socket_is_0600(server):
    srv, _ = server
    assert stat.S_IMODE(os.stat(srv.path).st_mode) == 0o600


def test_one_keep_alive_connection_carries_many_requests(server):
    srv, taken = server
    conn = UnixConnection(srv.path)
    for i in range(50):
        conn.request("POST", "/v1/result", body=json.dumps({"n": i}), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 204
    conn.close()
    assert [d["n"] for d in taken] == list(range(50))


def test_a_burst_of_concurrent_connections_is_never_refused(server):
    srv, taken = server
    with concurrent.futures.ThreadPoolExecutor(64) as pool:
        statuses = list(pool.map(lambda i: unix_request(srv.path, "POST", "/v1/event", {"i": i})[0], range(300)))
    assert statuses == [204] * 300 and len(taken) == 300


def test_a_chunked_body_is_read_whole(server):
    srv, taken = server
    conn = UnixConnection(srv.path)
    conn.request("POST", "/v1/result", body=iter([b'{"a": ', b"1}"]), encode_chunked=True, headers={"Transfer-Encoding": "chunked"})
    assert conn.getresponse().status == 204
    conn.close()
    assert taken == [{"a": 1}]


def test_not_json_and_a_refused_shape_are_400_with_one_line(server):
    srv, _ = server
    assert unix_request(srv.path, "POST", "/v1/result", b"{") == (400, b"the body is not JSON\n")
    assert unix_request(srv.path, "POST", "/v1/result", b'"bad"') == (400, b"the body must be a JSON object\n")


def test_status_is_json(server):
    srv, _ = server
    assert unix_request(srv.path, "GET", "/v1/status") == (200, b'{"ok": true}')


def test_close_removes_the_socket(server):
    srv, _ = server
    srv.close()
    assert not os.path.exists(srv.path)


def test_a_stale_socket_file_is_replaced(run_dir):
    path = os.path.join(run_dir, "stale.sock")
    import socket

    killed = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    killed.bind(path)
    killed.close()  # as if that daemon had been killed: the file stays
    second = UnixHttpServer(path, Routes(None, None, lambda: {"n": 2}, BadMessage))
    second.listen()
    try:
        assert unix_request(path, "GET", "/v1/status") == (200, b'{"n": 2}')
    finally:
        second.close()
