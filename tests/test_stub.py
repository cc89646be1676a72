"""The development lich keeps the server side of the contract.

Time rules (30 s without a poll, 30 s in the queue) run on an injected
clock the test moves; held polls are released by queueing, never by waiting.
"""
import json
import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from lich_control.dev.lich import NotPolling, Refused, StubLich, validate_ack

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "acks.jsonl")
ACK_LINES = [json.loads(line) for line in open(FIXTURES, encoding="utf-8") if line.strip()]
WAIT = 5.0


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def lich(clock):
    with StubLich(hold=30.0, clock=clock) as server:
        yield server


@pytest.fixture
def http():
    with requests.Session() as session:
        yield session


@pytest.fixture
def background():
    with ThreadPoolExecutor(max_workers=4) as pool:
        yield pool


def poll(http, lich, session_id="s1", token=None):
    return http.get(f"{lich.url}/mod/commands", params={"token": token or lich.token, "session_id": session_id}, timeout=WAIT)


def post_ack(http, lich, data, token=None):
    body = data if isinstance(data, (str, bytes)) else json.dumps(data)
    return http.post(f"{lich.url}/mod/acks", params={"token": token or lich.token}, data=body, headers={"Content-Type": "application/json"}, timeout=WAIT)


def first_poll(http, lich, session_id="s1"):
    """Register the mod as polling: a poll that something queued answers at once."""
    lich.hold, held = 0.0, lich.hold
    try:
        assert poll(http, lich, session_id).json() == []
    finally:
        lich.hold = held


@pytest.mark.parametrize("case", ACK_LINES, ids=[c["name"] for c in ACK_LINES])
def test_ack_validation_matches_every_fixture_line(case):
    doc = case.get("body")
    if "raw" in case:
        try:
            doc = json.loads(case["raw"])
        except ValueError:
            doc = None  # what the endpoint makes of a body that does not parse
    expected = None if case.get("accept") else case["reject"]
    assert validate_ack(doc) == expected


@pytest.mark.parametrize("case", ACK_LINES, ids=[c["name"] for c in ACK_LINES])
def test_the_ack_endpoint_answers_every_fixture_line_as_it_says(http, lich, case):
    resp = post_ack(http, lich, case["raw"] if "raw" in case else case["body"])
    if case.get("accept"):
        assert resp.status_code == 204, resp.text
    else:
        assert (resp.status_code, resp.text.strip()) == (400, case["reject"])


def test_an_ack_with_a_wrong_token_is_401(http, lich):
    assert post_ack(http, lich, ACK_LINES[0]["body"], token="wrong").status_code == 401


def test_a_poll_with_a_wrong_token_is_401(http, lich):
    assert poll(http, lich, token="wrong").status_code == 401


def test_a_wrong_method_is_405(http, lich):
    assert http.get(f"{lich.url}/mod/acks", params={"token": lich.token}, timeout=WAIT).status_code == 405
    assert http.post(f"{lich.url}/mod/commands", params={"token": lich.token}, data=b"[]", timeout=WAIT).status_code == 405


def test_an_ack_body_over_64_kib_is_refused(http, lich):
    body = {"session_id": "s1", "id": "m9", "kind": "ask", "ok": True, "answer": "x" * (64 * 1024)}
    resp = post_ack(http, lich, body)
    assert resp.status_code == 400 and "64 KiB" in resp.text


def test_a_held_poll_wakes_the_moment_a_command_is_queued(http, lich, background):
    first_poll(http, lich)
    held = background.submit(poll, http, lich)
    assert lich.wait_polled("s1", WAIT, more_than=1, parked=True)
    assert not held.done()
    cid = lich.queue("s1", {"kind": "abort"})
    # hold is 30 s: only the queueing can answer within WAIT
    assert held.result(WAIT).json() == [{"kind": "abort", "id": cid}]


def test_a_poll_answers_empty_when_its_hold_runs_out(http, lich):
    lich.hold = 0.0
    resp = poll(http, lich)
    assert (resp.status_code, resp.json()) == (200, [])


def test_a_command_is_delivered_at_most_once(http, lich):
    first_poll(http, lich)
    lich.queue("s1", {"kind": "model", "model": "m"})
    lich.queue("s1", {"kind": "effort"})
    assert [c["kind"] for c in poll(http, lich).json()] == ["model", "effort"]
    lich.hold = 0.0
    assert poll(http, lich).json() == []


def test_commands_go_only_to_their_own_session(http, lich):
    first_poll(http, lich, "s1")
    first_poll(http, lich, "s2")
    lich.queue("s2", {"kind": "abort"})
    lich.hold = 0.0
    assert poll(http, lich, "s1").json() == []
    assert len(poll(http, lich, "s2").json()) == 1


def test_queueing_for_a_session_that_never_polled_is_refused_naming_what_to_check(lich):
    with pytest.raises(NotPolling) as err:
        lich.queue("s1", {"kind": "abort"})
    assert "no mod has polled for session s1" in str(err.value)
    assert f"LICH_PORT={lich.port}" in str(err.value)
    assert lich.token not in str(err.value)


def test_queueing_is_refused_once_the_mod_has_not_polled_for_30_s(http, lich, clock):
    first_poll(http, lich)
    clock.now += 29.0
    lich.queue("s1", {"kind": "abort"})
    clock.now += 2.0  # 31 s since the poll
    with pytest.raises(NotPolling) as err:
        lich.queue("s1", {"kind": "abort"})
    assert "has not polled for 31 s" in str(err.value)


def test_a_command_queued_over_30_s_before_the_next_poll_is_dropped(http, lich, clock):
    first_poll(http, lich)
    cid = lich.queue("s1", {"kind": "abort"})
    clock.now += 30.5
    lich.hold = 0.0
    assert poll(http, lich).json() == []
    outcome = lich.wait(cid, WAIT)
    assert not outcome.delivered and outcome.dropped == "no poll took it within 30 s"


def test_a_mod_that_hung_up_its_held_poll_is_not_polling(lich):
    conn = socket.create_connection(("127.0.0.1", lich.port))
    conn.sendall(f"GET /mod/commands?token={lich.token}&session_id=s1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert lich.wait_polled("s1", WAIT, parked=True)
    conn.close()
    assert lich.wait_until("s1", lambda info: info.hung_up and not info.parked, WAIT)
    with pytest.raises(NotPolling) as err:
        lich.queue("s1", {"kind": "abort"})
    assert "hung up its poll" in str(err.value)


def test_an_ack_settles_the_wait_and_the_first_ack_wins(http, lich):
    first_poll(http, lich)
    cid = lich.queue("s1", {"kind": "effort", "effort": "turbo"})
    lich.hold = 0.0
    poll(http, lich)
    first = {"session_id": "s1", "id": cid, "kind": "effort", "ok": False, "error": "unknown effort"}
    assert post_ack(http, lich, first).status_code == 204
    assert post_ack(http, lich, dict(first, error="later")).status_code == 204
    outcome = lich.wait(cid, WAIT)
    assert outcome.delivered and outcome.ack == first and not outcome.ok
    assert outcome.took_s is not None


def test_an_ack_is_accepted_for_any_kind_handed_out(http, lich):
    first_poll(http, lich)
    cid = lich.queue("s1", {"kind": "rewind"})
    lich.hold = 0.0
    assert poll(http, lich).json()[0]["kind"] == "rewind"
    ack = {"session_id": "s1", "id": cid, "kind": "rewind", "ok": False, "error": "unknown kind"}
    assert post_ack(http, lich, ack).status_code == 204
    assert lich.wait(cid, WAIT).ack == ack


def test_model_and_effort_slash_commands_are_refused(http, lich):
    first_poll(http, lich)
    for name in ("model", "effort"):
        with pytest.raises(Refused) as err:
            lich.queue("s1", {"kind": "command", "name": name})
        assert f"use the {name} command" in str(err.value)


def test_polled_says_who_polled_when(http, lich, clock):
    http.headers["X-Lich-Plugin"] = "0.1.0"
    first_poll(http, lich)
    clock.now += 4.0
    info = lich.polled("s1")
    assert (info.polls, info.last_poll_age_s, info.parked, info.plugin) == (1, 4.0, 0, "0.1.0")
    assert lich.polled("nobody").last_poll_age_s is None


def test_the_control_endpoint_refuses_a_wrong_token_and_a_session_not_polling(http, lich):
    url = f"{lich.url}/stub/control"
    body = json.dumps({"session_id": "s1", "command": {"kind": "abort"}, "timeout": 1})
    assert http.post(url, params={"token": "wrong"}, data=body, timeout=WAIT).status_code == 401
    resp = http.post(url, params={"token": lich.token}, data=body, timeout=WAIT)
    assert resp.status_code == 409 and resp.json()["not_polling"] is True


def test_close_lets_a_waiter_go_at_once(http, clock):
    lich = StubLich(hold=0.0, clock=clock).start()
    poll(http, lich)
    cid = lich.queue("s1", {"kind": "abort"})
    waiting = threading.Thread(target=lich.wait, args=(cid, 60.0))
    waiting.start()
    lich.close()
    waiting.join(WAIT)
    assert not waiting.is_alive()


def test_an_unknown_path_closes_the_connection_so_its_body_is_not_read_as_a_request(http, lich):
    answer = http.post(f"{lich.url}/mod/ack", params={"token": lich.token}, data=json.dumps({"id": "x"}), timeout=WAIT)
    assert answer.status_code == 404 and answer.headers.get("Connection") == "close"


def test_a_closed_stub_hangs_up_after_its_last_answer(http, lich):
    first_poll(http, lich)
    lich.close()
    answer = poll(http, lich)
    assert answer.json() == [] and answer.headers.get("Connection") == "close"
