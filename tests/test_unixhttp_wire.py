"""The daemon's socket speaks enough HTTP/1.1 for the relay, and refuses the rest plainly."""
import json
import socket

import pytest

from lich_control.unix_socket import Routes, UnixHttpServer
from relay import UnixConnection


class Bad(Exception):
    pass


@pytest.fixture
def server(tmp_path):
    got = []

    def result(doc):
        if "id" not in doc:
            raise Bad("id must be a string")
        got.append(doc)

    srv = UnixHttpServer(str(tmp_path / "s.sock"), Routes(result, got.append, lambda: {"ok": True}, Bad))
    srv.listen()
    srv.got = got
    yield srv
    srv.close()


def exchange(conn, method, url, body=None, headers=None):
    conn.request(method, url, body=body, headers=headers or {})
    resp = conn.getresponse()
    return resp.status, resp.read(), resp


def test_many_results_on_one_kept_alive_connection(server):
    conn = UnixConnection(server.path)
    for i in range(50):
        status, body, _ = exchange(conn, "POST", "/v1/result", json.dumps({"id": f"c{i}", "ok": True}).encode())
        assert (status, body) == (204, b"")
    assert [d["id"] for d in server.got] == [f"c{i}" for i in range(50)]
    assert exchange(conn, "GET", "/v1/status")[:2] == (200, b'{"ok": true}')
    conn.close()


@pytest.mark.parametrize(
    "method, url, body, status, text",
    [
        ("POST", "/v1/result", b"{", 400, b"the body is not JSON\n"),
        ("POST", "/v1/result", b"{}", 400, b"id must be a string\n"),
        ("GET", "/v1/result", None, 405, b"method not allowed\n"),
        ("DELETE", "/v1/status", None, 405, b"method not allowed\n"),
        ("GET", "/nowhere", None, 404, b"no such path\n"),
    ],
)
def test_refusals_say_why_and_the_connection_goes_on(server, method, url, body, status, text):
    conn = UnixConnection(server.path)
    assert exchange(conn, method, url, body)[:2] == (status, text)
    assert exchange(conn, "POST", "/v1/event", b'{"event": "x"}')[0] == 204
    conn.close()


def raw(path, data):
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


def test_a_chunked_body_is_read_and_connection_close_is_honoured(server):
    out = raw(server.path, b"POST /v1/result HTTP/1.1\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\n{\"id\"\r\n9\r\n: \"c1\"}  \r\n0\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 204 ") and b"Connection: close" in out
    assert server.got == [{"id": "c1"}]


def test_a_body_without_length_is_411_and_garbage_is_400(server):
    assert raw(server.path, b"POST /v1/result HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 411 ")
    assert raw(server.path, b"hello\r\n").startswith(b"HTTP/1.1 400 ")


def test_a_negative_chunk_size_is_refused_not_read_to_the_end(server):
    out = raw(server.path, b"POST /v1/result HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\nxx\r\n")
    assert out.startswith(b"HTTP/1.1 400 ") and b"a malformed chunk" in out
