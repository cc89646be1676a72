"""The development lich's fault hooks and its record, as the tests of the daemon use them.

First `Faults` on its own (no server), then each fault as a client sees it
over real loopback HTTP, then the record and its waits. No test sleeps: a
held poll is released by a scripted answer, an ack by opening the gate.
"""
import json
import socket
import threading

import pytest
import requests

from lich_dev.lich import AckAnswer, Answer, NotSeen, StubLich
from lich_dev.faults import Faults

WAIT = 5.0


@pytest.fixture
def lich():
    with StubLich() as server:
        yield server


def poll(http, lich, session_id="s1", timeout=WAIT):
    return http.get(f"{lich.url}/mod/commands", params={"token": lich.token, "session_id": session_id}, headers={"X-Lich-Plugin": "0.16.0"}, timeout=timeout)


def post_ack(http, lich, doc):
    return http.post(f"{lich.url}/mod/acks", params={"token": lich.token}, data=json.dumps(doc), headers={"Content-Type": "application/json"}, timeout=WAIT)


def ack(cid, kind="abort", ok=True):
    return {"session_id": "s1", "id": cid, "kind": kind, "ok": ok}


# -- Faults on its own ------------------------------------------------------------


def test_scripted_answers_are_taken_in_order_and_only_by_the_session_they_name():
    faults = Faults(threading.Condition())
    first, second, for_s2 = Answer(status=503), Answer(status=500), Answer(status=404)
    faults.script(first)
    faults.script(for_s2, session_id="s2")
    faults.script(second)
    assert faults.left() == (3, 0)
    assert [faults.take_answer("s1"), faults.take_answer("s1"), faults.take_answer("s1")] == [first, second, None]
    assert faults.take_answer("s2") is for_s2 and faults.left() == (0, 0)


def test_deliver_is_one_answer_that_carries_the_items_as_they_are():
    faults = Faults(threading.Condition())
    faults.deliver("junk", 42, {"id": "m3", "kind": "model"})
    assert faults.take_answer("any").payload() == b'["junk", 42, {"id": "m3", "kind": "model"}]'


def test_scripted_ack_answers_are_used_in_order():
    faults = Faults(threading.Condition())
    faults.script_acks(AckAnswer(status=400), AckAnswer(drop=True))
    assert [faults.take_ack_answer(), faults.take_ack_answer(), faults.take_ack_answer()] == [AckAnswer(status=400), AckAnswer(drop=True), None]
    assert AckAnswer().takes and not AckAnswer(status=400).takes and not AckAnswer(drop=True).takes


def test_held_acks_wait_until_released_and_a_closing_lich_holds_none():
    faults = Faults(threading.Condition())
    faults.hold_acks()
    waiter = threading.Thread(target=faults.wait_acks_open)
    waiter.start()
    faults.release_acks()
    waiter.join(WAIT)
    assert not waiter.is_alive()
    faults.close()
    faults.hold_acks()  # too late: nothing is held once the lich closes
    faults.wait_acks_open()


def test_a_fault_is_refused_when_it_makes_no_sense():
    with pytest.raises(ValueError):
        Answer(drop=True, reset_mid_body=True)
    with pytest.raises(ValueError):
        Answer(delay=-1)
    with pytest.raises(TypeError):
        Faults(threading.Condition()).script({"status": 500})


# -- poll faults, as the client sees them ---------------------------------------------


def test_a_scripted_status_and_body_reach_the_client_before_anything_queued(http, lich):
    lich.faults.script(Answer(status=503, body="busy"), Answer(raw=b'{"not": "an array"}'))
    first = poll(http, lich)
    assert (first.status_code, first.json(), first.headers["Content-Type"]) == (503, "busy", "application/json")
    assert poll(http, lich).content == b'{"not": "an array"}'


def test_a_held_poll_takes_the_answer_scripted_while_it_waits(http, lich, background):
    held = background.submit(poll, http, lich)
    assert lich.wait_polled("s1", WAIT, parked=True)
    lich.faults.script(Answer(status=500))  # the 25 s hold: only the script can answer within WAIT
    assert held.result(WAIT).status_code == 500


def test_items_delivered_as_they_are_bypass_every_rule(http, lich):
    lich.faults.deliver("junk", {"id": "m3", "kind": "model", "model": []}, {"id": "m3", "kind": "model"})
    assert poll(http, lich).json() == ["junk", {"id": "m3", "kind": "model", "model": []}, {"id": "m3", "kind": "model"}]


def test_a_dropped_poll_is_a_connection_error(http, lich):
    lich.faults.script(Answer(drop=True))
    with pytest.raises(requests.ConnectionError):
        poll(http, lich)


def test_a_delayed_answer_outlasts_a_shorter_read_timeout(http, lich):
    lich.faults.script(Answer(body=[], delay=30.0))  # closing the lich cuts the delay short
    with pytest.raises(requests.ReadTimeout):
        poll(http, lich, timeout=(WAIT, 0.2))


def test_a_reset_mid_body_is_a_broken_answer(http, lich):
    lich.faults.script(Answer(body=[{"id": "m12", "kind": "rewind"}], reset_mid_body=True))
    with pytest.raises((requests.ConnectionError, requests.exceptions.ChunkedEncodingError)):
        poll(http, lich).json()


def test_a_declared_length_longer_than_the_body_ends_with_the_connection(http, lich):
    lich.faults.script(Answer(raw=b"[]", length=500))
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        poll(http, lich)


def test_close_after_answers_whole_then_hangs_up(http, lich):
    lich.faults.script(Answer(body=[{"id": "m3", "kind": "model"}], close_after=True))
    answer = poll(http, lich)
    assert answer.json() == [{"id": "m3", "kind": "model"}] and answer.headers["Connection"] == "close"


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


# -- ack faults ------------------------------------------------------------------------


def test_a_scripted_ack_status_answers_with_its_reason_and_the_ack_is_not_taken(http, lich):
    lich.faults.script_acks(AckAnswer(status=400, reason="refused: because the test said so"), AckAnswer(status=503))
    first = post_ack(http, lich, ack("m1"))
    assert (first.status_code, first.text) == (400, "refused: because the test said so\n")
    assert post_ack(http, lich, ack("m2")).status_code == 503
    assert post_ack(http, lich, ack("m3")).status_code == 204
    assert lich.acks_received == 1
    assert [(a.id, a.answer) for a in lich.record.acks] == [("m1", 400), ("m2", 503), ("m3", 204)]


def test_a_dropped_ack_is_a_connection_error_and_recorded_unanswered(http, lich):
    lich.faults.script_acks(AckAnswer(drop=True))
    with pytest.raises(requests.ConnectionError):
        post_ack(http, lich, ack("m12"))
    assert post_ack(http, lich, ack("m13")).status_code == 204
    assert [(a.id, a.answer) for a in lich.record.acks] == [("m12", None), ("m13", 204)]
    assert lich.record.ack_bodies(answered=True) == [ack("m13")]


def test_held_acks_arrive_and_are_answered_once_released(http, lich, background):
    lich.faults.hold_acks()
    sent = background.submit(post_ack, http, lich, ack("m12"))
    lich.record.wait_acks(1)
    assert lich.acks_received == 0  # arrived, recorded, not taken
    lich.faults.release_acks()
    assert sent.result(WAIT).status_code == 204 and lich.acks_received == 1


def test_closing_the_lich_answers_a_held_ack(http, background):
    lich = StubLich().start()
    lich.faults.hold_acks()
    sent = background.submit(post_ack, http, lich, ack("m12"))
    lich.record.wait_acks(1)
    lich.close()
    assert sent.result(WAIT).status_code == 204


# -- the record --------------------------------------------------------------------------


def test_every_poll_and_ack_is_recorded_with_its_query_and_headers(http, lich):
    lich.faults.script(Answer(body=[]))
    poll(http, lich)
    post_ack(http, lich, ack("m12"))
    [polled] = lich.record.wait_polls(1)
    assert polled.session_id == "s1" and polled.query == {"token": [lich.token], "session_id": ["s1"]}
    assert polled.header("x-lich-plugin") == "0.16.0" and polled.header("X-Nothing") is None
    assert lich.record.ack_for("m12") == ack("m12")
    acked = lich.record.acks[0]
    assert acked.header("Content-Type") == "application/json" and int(acked.header("content-length")) == len(acked.raw)
    assert lich.token not in repr(polled) + repr(acked)


def test_a_request_with_a_wrong_token_is_not_recorded(http, lich):
    http.get(f"{lich.url}/mod/commands", params={"token": "wrong", "session_id": "s1"}, timeout=WAIT)
    assert lich.record.polls == []


def test_a_wait_that_runs_out_says_what_it_saw(http, lich):
    post_ack(http, lich, ack("m1"))
    with pytest.raises(NotSeen) as err:
        lich.record.wait_polls(1, timeout=0)
    assert "waited 0 s for 1 polls; saw 0 polls and 1 acks" in str(err.value)
    with pytest.raises(AssertionError):  # NotSeen is one, for tests written against assertions
        lich.record.ack_for("m2", timeout=0)


def test_a_lich_told_to_keep_no_record_keeps_none(http):
    with StubLich(record=False) as lich:
        lich.faults.script(Answer(body=[]))
        poll(http, lich)
        assert lich.record.polls == []


def test_a_wait_on_the_record_wakes_on_the_record_it_waits_for(http, lich, background):
    waiting = background.submit(lich.record.ack_for, "m7", WAIT)
    post_ack(http, lich, ack("m7", kind="command", ok=False))
    assert waiting.result(WAIT)["ok"] is False


def test_a_hung_up_poll_is_recorded_though_never_answered(lich):
    conn = socket.create_connection(("127.0.0.1", lich.port))
    try:
        conn.sendall(f"GET /mod/commands?token={lich.token}&session_id=s1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert [p.session_id for p in lich.record.wait_polls(1)] == ["s1"]
    finally:
        conn.close()
