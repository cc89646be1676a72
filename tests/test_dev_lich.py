"""The development lich over real loopback HTTP (lich_dev/lich.py, handler.py,
faults.py, record.py): it answers as lich's server does, and plays the
faults and keeps the record the daemon's tests use.

Its clock rules (the 25 s hold, the 30 s attach window) run
on an injected clock the test moves; held polls are released by queueing,
by a scripted answer or by `clock_moved`, never by waiting. Each rule names
where lich has it (github.com/omartelo/lich, internal/terminal/modcontrol.go
unless said).
"""
import json
import socket

import pytest
import requests

from fakes import Clock
from lich_dev.lich import AckAnswer, Answer, NotPolling, Refused, StubLich
from lich_dev.state import ENDED

WAIT = 5.0


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def lich(clock):
    with StubLich(clock=clock) as server:
        yield server


def poll(http, lich, session_id="s1", token=None, plugin="0.16.0", timeout=WAIT):
    headers = {} if plugin is None else {"X-Lich-Plugin": plugin}
    return http.get(f"{lich.url}/mod/commands", params={"token": token or lich.token, "session_id": session_id}, headers=headers, timeout=timeout)


def post_ack(http, lich, data, token=None, plugin="0.16.0"):
    body = data if isinstance(data, (str, bytes)) else json.dumps(data)
    headers = {"Content-Type": "application/json", "X-Lich-Plugin": plugin}
    return http.post(f"{lich.url}/mod/acks", params={"token": token or lich.token}, data=body, headers=headers, timeout=WAIT)


def ack(cid, kind="abort", ok=True, session_id="s1", **extra):
    return dict({"session_id": session_id, "id": cid, "kind": kind, "ok": ok}, **extra)


def first_poll(http, lich, session_id="s1", plugin="0.16.0"):
    """Register the mod as polling: a poll that answers at once."""
    lich.hold, held = 0.0, lich.hold
    try:
        assert poll(http, lich, session_id, plugin=plugin).json() == []
    finally:
        lich.hold = held


# -- requests lich refuses ------------------------------------------------------------


def test_a_wrong_token_is_401_a_poll_without_a_session_400_a_wrong_method_405_a_wrong_path_404(http, lich):
    assert poll(http, lich, token="wrong").status_code == 401
    assert post_ack(http, lich, ack("m1"), token="wrong").status_code == 401
    answer = http.get(f"{lich.url}/mod/commands", params={"token": lich.token}, timeout=WAIT)
    assert (answer.status_code, answer.text) == (400, "session_id is required\n")
    assert http.get(f"{lich.url}/mod/acks", params={"token": lich.token}, timeout=WAIT).status_code == 405
    assert http.post(f"{lich.url}/mod/commands", params={"token": lich.token}, data=b"[]", timeout=WAIT).status_code == 405
    assert [p.session_id for p in lich.record.polls] == [""]  # a wrong token is not recorded
    answer = http.post(f"{lich.url}/mod/ack", params={"token": lich.token}, data=b'{"id": "x"}', timeout=WAIT)
    assert answer.status_code == 404 and answer.headers.get("Connection") == "close"  # its body is not read as a request


# -- acks: parseModAck, read as servePostLimited reads them ------------------------------
# (what each field may hold is test_dev_rules.py's)


def test_an_ack_is_read_to_lichs_64_kib_cut_and_the_connection_lives_on(http, lich):
    padded = json.dumps(ack("m1")).encode() + b" " * (64 * 1024)  # the JSON ends inside the cut
    assert post_ack(http, lich, padded).status_code == 204
    resp = post_ack(http, lich, json.dumps(ack("m9", "ask", answer="x" * (64 * 1024))))  # cut inside its JSON
    assert (resp.status_code, resp.text) == (400, "body must be a JSON object\n")
    assert post_ack(http, lich, ack("m2")).status_code == 204
    assert lich.acks_received == 2


# -- polls: modQueue.take, transport.modCommands ------------------------------------------


def test_held_polls_all_wake_when_a_command_is_queued_and_one_left_with_nothing_answers_at_once(http, lich, background):
    # enqueue wakes every waiter; the one whose drain finds nothing answers [].
    # The hold is 25 s on a clock that does not move: only the queueing answers.
    held = [background.submit(poll, http, lich, timeout=(WAIT, 2.0)) for _ in range(2)]
    assert lich.wait_until("s1", lambda info: info.parked == 2, WAIT)
    cid = lich.queue("s1", {"kind": "abort"})
    answers = sorted((f.result(WAIT).json() for f in held), key=len)
    assert answers == [[], [{"kind": "abort", "id": cid}]]


def test_a_held_poll_answers_empty_once_25_s_pass_on_the_lichs_clock(http, lich, clock, background):
    held = background.submit(poll, http, lich)
    assert lich.wait_polled("s1", WAIT, parked=True)
    clock.now += 25.0
    lich.clock_moved()
    assert held.result(WAIT).json() == []


def test_commands_are_delivered_at_most_once_in_order_and_only_to_their_session(http, lich):
    first_poll(http, lich, "s1")
    first_poll(http, lich, "s2")
    lich.queue("s1", {"kind": "model", "model": "m"})
    lich.queue("s1", {"kind": "command", "name": "/compact", "args": "keep the plan"})
    assert poll(http, lich, "s1").json() == [{"kind": "model", "model": "m", "id": "k1"}, {"kind": "command", "name": "compact", "args": "keep the plan", "id": "k2"}]
    first_poll(http, lich, "s1")  # nothing left to take
    first_poll(http, lich, "s2")  # nor anything of another session's


def test_queueing_refuses_what_lich_refuses_before_anything_is_queued(http, lich):
    first_poll(http, lich)
    with pytest.raises(Refused, match="^prompt command has no text$"):
        lich.queue_all("s1", [{"kind": "abort"}, {"kind": "prompt", "text": " "}])
    first_poll(http, lich)  # the abort went nowhere: one refused command refuses them all


# -- the attach window (enqueue: errModDetached) ---------------------------------------------


def test_queueing_is_refused_once_the_mod_has_not_polled_for_30_s(http, lich, clock):
    # attachWindow = modPollWait + modRepollGrace; refused when now - lastSeen > it
    first_poll(http, lich)
    clock.now += 30.0
    lich.queue("s1", {"kind": "abort"})
    clock.now += 1.0
    with pytest.raises(NotPolling, match="its mod has not polled for 31 s"):
        lich.queue("s1", {"kind": "abort"})


def test_a_mod_that_hung_up_its_held_poll_is_not_polling_and_the_poll_is_recorded(lich):
    # The stub's own rule (docs/dev-lich.md): lich would wait out the window.
    conn = socket.create_connection(("127.0.0.1", lich.port))
    conn.sendall(f"GET /mod/commands?token={lich.token}&session_id=s1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert lich.wait_polled("s1", WAIT, parked=True)
    assert [p.session_id for p in lich.record.polls] == ["s1"]
    conn.close()
    assert lich.wait_until("s1", lambda info: info.hung_up and not info.parked, WAIT)
    with pytest.raises(NotPolling, match="its mod hung up its last poll and has not polled since"):
        lich.queue("s1", {"kind": "abort"})


# -- the caller's wait (await) ------------------------------------------


def test_close_lets_a_waiter_go_at_once_and_answers_a_last_poll_then_hangs_up(http, lich, background):
    first_poll(http, lich)
    waiting = background.submit(lich.wait, lich.queue("s1", {"kind": "abort"}), 60.0)
    lich.close()
    assert waiting.result(WAIT).state == ENDED
    answer = poll(http, lich)  # on the connection kept from before
    assert answer.status_code == 200 and answer.headers.get("Connection") == "close"


# -- poll faults, as the client sees them -------------------------------------------------------------


def test_scripted_answers_go_in_order_to_the_session_they_name_before_anything_queued(http, lich, background):
    held = background.submit(poll, http, lich)
    assert lich.wait_polled("s1", WAIT, parked=True)
    lich.faults.script(Answer(status=404), session_id="s2")
    lich.faults.script(Answer(status=503, body="busy"), Answer(raw=b'{"not": "an array"}'))
    first = held.result(WAIT)  # the held poll takes the answer scripted while it waits
    assert (first.status_code, first.json(), first.headers["Content-Type"]) == (503, "busy", "application/json")
    assert poll(http, lich).content == b'{"not": "an array"}'
    assert poll(http, lich, "s2").status_code == 404 and lich.faults.left() == (0, 0)
    lich.faults.deliver("junk", {"id": "m3", "kind": "model", "model": []})  # items as they are, no rule checked
    assert poll(http, lich).json() == ["junk", {"id": "m3", "kind": "model", "model": []}]


def test_kill_resets_a_held_poll_and_frees_the_port_for_a_lich_reborn_on_it(http, background):
    lich = StubLich().start()
    held = background.submit(poll, http, lich)
    assert lich.wait_polled("s1", WAIT, parked=True)
    lich.kill()
    with pytest.raises(requests.ConnectionError):
        held.result(WAIT)
    with StubLich(token=lich.token, port=lich.port) as reborn:
        reborn.faults.script(Answer(body=[]))
        assert poll(http, reborn).json() == []


# -- ack faults and the record ---------------------------------------------------------------------------


def test_scripted_ack_answers_are_used_in_order_and_only_a_2xx_takes_the_ack(http, lich):
    lich.faults.script_acks(AckAnswer(status=400, reason="refused: because the test said so"), AckAnswer(drop=True))
    first = post_ack(http, lich, ack("m1"))
    assert (first.status_code, first.text) == (400, "refused: because the test said so\n")
    with pytest.raises(requests.ConnectionError):
        post_ack(http, lich, ack("m2"))
    assert post_ack(http, lich, ack("m3")).status_code == 204
    assert lich.acks_received == 1
    assert [(a.id, a.answer) for a in lich.record.acks] == [("m1", 400), ("m2", None), ("m3", 204)]
    assert lich.record.ack_bodies(answered=True) == [ack("m1"), ack("m3")]


def test_held_acks_arrive_and_are_answered_once_released_or_the_lich_closes(http, lich, background):
    lich.faults.hold_acks()
    sent = [background.submit(post_ack, http, lich, ack(cid)) for cid in ("m1", "m2")]
    lich.record.wait_acks(2)
    assert lich.acks_received == 0  # arrived, recorded, not taken
    lich.faults.release_acks()
    assert sent[0].result(WAIT).status_code == 204
    lich.faults.hold_acks()
    lich.close()
    assert sent[1].result(WAIT).status_code == 204


def test_every_poll_and_ack_is_recorded_with_its_query_and_headers(http, lich, background):
    waiting = background.submit(lich.record.ack_for, "m12", WAIT)  # a wait wakes on the record it waits for
    lich.faults.script(Answer(body=[]))
    poll(http, lich)
    post_ack(http, lich, ack("m12"))
    assert waiting.result(WAIT) == ack("m12")
    [polled] = lich.record.wait_polls(1)
    assert polled.session_id == "s1" and polled.query == {"token": [lich.token], "session_id": ["s1"]}
    assert polled.header("x-lich-plugin") == "0.16.0" and polled.header("X-Nothing") is None
    acked = lich.record.acks[0]
    assert acked.header("Content-Type") == "application/json" and int(acked.header("content-length")) == len(acked.raw)
    assert lich.token not in repr(polled) + repr(acked)
