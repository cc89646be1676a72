"""End to end: the real daemon as a subprocess, over the real bridge (the
test plays the relay: tests/relay.py) and real loopback HTTP to the
development lich. One test per kind, the order rules, a lich restart, the
404 and the backoff once in real time. Each unit's own rules are its unit
test's; waits are condition waits with deadlines."""
import json
import os

import attrs

from lich_control import status_cli as statuscli
from lich_dev.lich import Answer, StubLich

from fakes import RawAnswer
from relay import daemon_request, started

PROMPT = {"id": "m1", "kind": "prompt", "text": "run the tests"}
REWIND = {"id": "m12", "kind": "rewind"}
WAIT = 10.0


# -- one per kind --------------------------------------------------------------------


def test_a_prompt_is_submitted_and_acked_once_its_turn_starts(relay, lich):
    r = started(relay, lich)
    lich.queue_all("s1", [PROMPT])
    call = r.next_call()
    assert (call["method"], call["args"]) == ("prompt.submit", {"text": "run the tests"})
    r.event("turn.start", "t1")
    r.result(call["id"], {"text": "run the tests"})
    assert lich.record.ack_for("m1") == {"session_id": "s1", "id": "m1", "kind": "prompt", "ok": True}


def test_slash_commands_pass_args_only_when_given(relay, lich):
    r = started(relay, lich)
    lich.queue_all("s1", [{"id": "m7", "kind": "command", "name": "compact", "args": "keep the test plan"}, {"id": "m8", "kind": "command", "name": "clear"}])
    first, second = r.next_call(), r.next_call()
    assert first["args"] == {"command": "compact", "args": "keep the test plan"}
    assert second["args"] == {"command": "clear"}
    r.result(second["id"], {"text": ""})
    r.result(first["id"], error="command failed: compact")
    assert lich.record.ack_for("m8")["ok"] is True
    assert lich.record.ack_for("m7")["error"] == "command failed: compact"


def test_abort_ends_the_turn_turn_start_gave(relay, lich):
    r = started(relay, lich)
    r.event("turn.start", "t1")
    lich.queue_all("s1", [{"id": "m2", "kind": "abort"}])
    call = r.next_call()
    assert (call["method"], call["args"]) == ("turn.abort", {"turnId": "t1"})
    r.result(call["id"], None)
    assert lich.record.ack_for("m2")["ok"] is True


def test_model_and_effort_set_and_drop_both_overrides_at_once(relay, lich):
    r = started(relay, lich)
    lich.queue_all("s1", [{"id": "m3", "kind": "model", "model": "claude-opus-4-1"}, {"id": "m5", "kind": "effort", "effort": "high"}, {"id": "m4", "kind": "model"}, {"id": "m6", "kind": "effort"}])
    seen = []
    for _ in range(4):
        call = r.next_call()
        seen.append((call["method"], call["args"]))
        r.result(call["id"], None)
    assert seen == [
        ("overrides.set", {"model": "claude-opus-4-1", "effort": None}),
        ("overrides.set", {"model": "claude-opus-4-1", "effort": "high"}),
        ("overrides.set", {"model": None, "effort": "high"}),
        ("overrides.set", {"model": None, "effort": None}),
    ]
    assert [a.body["ok"] for a in lich.record.wait_acks(4)] == [True] * 4
    assert r.status()["overrides"] == {"model": None, "effort": None}


def test_an_ask_forks_behind_the_preamble_and_carries_the_answer(relay, lich):
    r = started(relay, lich)
    lich.queue_all("s1", [{"id": "m9", "kind": "ask", "question": "what are you working on?"}])
    call = r.next_call()
    assert call["method"] == "model.fork"
    assert call["args"]["prompt"].endswith("what are you working on?")
    assert "side question" in call["args"]["prompt"]
    r.result(call["id"], {"isAnswered": True, "text": "Fixing the login test.", "usage": {}})
    assert lich.record.ack_for("m9") == {"session_id": "s1", "id": "m9", "kind": "ask", "ok": True, "answer": "Fixing the login test."}


# -- the order rules ------------------------------------------------------------------


def test_polling_never_waits_on_a_command(relay, lich):
    r = started(relay, lich)
    lich.queue_all("s1", [{"id": "m3", "kind": "model", "model": "opus"}])
    r.next_call()  # overrides.set, left unanswered: the worker is blocked on it
    lich.record.wait_polls(2)  # the poll went out again at once
    assert lich.wait_polled("s1", WAIT, parked=True)


def test_asks_run_at_once_concurrently_and_ack_outside_the_order(relay, lich):
    r = started(relay, lich)
    lich.queue_all("s1", [{"id": "m3", "kind": "model", "model": "opus"}, {"id": "a1", "kind": "ask", "question": "one?"}, {"id": "a2", "kind": "ask", "question": "two?"}])
    calls = {c["method"] + c["args"].get("prompt", "")[-4:]: c for c in (r.next_call(), r.next_call(), r.next_call())}
    # The model command is not answered, yet both forks went out; the second answers first.
    r.result(calls["model.forktwo?"]["id"], {"isAnswered": True, "text": "2"})
    assert [a.id for a in lich.record.wait_acks(1)] == ["a2"]
    r.result(calls["model.forkone?"]["id"], {"isAnswered": True, "text": "1"})
    assert [a.id for a in lich.record.wait_acks(2)] == ["a2", "a1"]
    r.result(calls["overrides.set"]["id"], None)
    assert lich.record.ack_for("m3")["ok"] is True


def test_an_ack_is_awaited_before_the_next_command(relay, lich):
    # The worker's own order is proven in test_worker.py; here, over the real
    # wire, the daemon's status is the record of where each command stands.
    r = started(relay, lich)
    lich.faults.hold_acks()  # lich takes the ack but does not answer yet
    lich.queue_all("s1", [{"id": "m12", "kind": "rewind"}, {"id": "m3", "kind": "model", "model": "opus"}])
    lich.record.wait_acks(1)
    waiting = {entry["id"]: entry["waiting_on"] for entry in r.status()["in_flight"]}
    # m3 is not started while m12's ack is out (it may not even be handed on yet)
    assert waiting["m12"] == "ack" and waiting.get("m3", "worker") == "worker"
    lich.faults.release_acks()
    assert r.next_call()["method"] == "overrides.set"
    assert lich.record.acks[0].answer == 204


# -- lich's life ------------------------------------------------------------------------


def test_lich_killed_mid_poll_and_restarted_on_its_port_is_found_again(relay, lich):
    r = started(relay, lich)
    r.autoanswer()
    lich.kill()  # the parked poll is reset
    dead = RawAnswer(None, port=lich.port)  # lich's port, resetting whoever knocks
    try:
        dead.wait(1)  # the daemon tried again, and failed again
    finally:
        dead.close()
    r.wait_status(lambda s: s["poll"]["failures"] == 2)
    with StubLich(token=lich.token, port=lich.port, newer_kinds={"rewind": ()}) as reborn:
        assert reborn.wait_polled("s1", WAIT, parked=True)
        reborn.queue("s1", REWIND)
        assert reborn.record.ack_for("m12")["error"] == "unknown kind"
        poll = r.status()["poll"]
        assert (poll["state"], poll["backoff"]) == ("polling", 0)


def test_a_404_stops_polling_for_good_and_the_status_says_so(relay, lich):
    lich.faults.script(Answer(status=404, body="no such route"))
    r = relay()
    r.wait_hello()
    status = r.wait_status(lambda s: s["poll"]["state"] == "stopped")
    assert status["poll"]["reason"] == "lich answered 404"
    assert len(lich.record.polls) == 1 and r.proc.poll() is None


def test_a_failed_poll_backs_off_about_a_second_then_a_200_resets(relay, lich):
    lich.faults.script(Answer(status=503, body="busy"))
    r = relay()
    r.wait_hello()
    polls = lich.record.wait_polls(2)
    gap = polls[1].at - polls[0].at
    assert 0.9 <= gap < 3.0
    lich.queue_all("s1", [{"id": "m12", "kind": "rewind"}])
    lich.record.wait_acks(1)
    poll = r.status()["poll"]
    assert (poll["state"], poll["backoff"], poll["failures"]) == ("polling", 0, 1)


# -- Windows' bridge on this system ----------------------------------------------------


def test_over_loopback_tcp_a_command_goes_round_and_a_request_without_the_secret_is_refused(relay, lich, run_dir):
    r = started(relay, lich, module="lich_dev.loopback_daemon")
    assert "socket" not in r.hello and r.hello["port"] > 0
    with open(os.path.join(run_dir, "s1.address")) as file:
        assert json.load(file) == {"pid": r.proc.pid, "port": r.hello["port"], "secret": r.hello["secret"]}
    lich.queue_all("s1", [PROMPT])
    call = r.next_call()
    assert daemon_request(attrs.evolve(r.address, secret="wrong"), "POST", "/v1/result", json.dumps({"id": call["id"], "ok": True}).encode())[0] == 403
    r.event("turn.start", "t1")
    r.result(call["id"], {"text": "run the tests"})
    assert lich.record.ack_for("m1") == {"session_id": "s1", "id": "m1", "kind": "prompt", "ok": True}
    assert statuscli.ask(os.path.join(run_dir, "s1.address")).status["daemon"]["session_id"] == "s1"  # lich-mod-status's way in
    r.stop()  # on Windows a kill, which leaves the file for the next daemon to replace
    assert os.name == "nt" or not os.path.exists(os.path.join(run_dir, "s1.address"))
    with open(os.path.join(run_dir, "s1.log"), encoding="utf-8") as file:
        log = file.read()
    assert "refused POST /v1/result on the bridge: a wrong secret" in log and r.hello["secret"] not in log
