"""The real daemon, as a subprocess, over the real bridge and real loopback HTTP.

The test plays the relay (stdout lines in, results and events posted over the
Unix socket) against the development lich (the `lich` fixture). Waits are
condition waits with deadlines.
"""
import os
import stat
import subprocess
import sys

import pytest

from lich_control import CONTRACT_RELEASE, __version__
from lich_dev import procs
from lich_dev.lich import AckAnswer, Answer
from lich_control.unix_socket import unix_request

PROMPT = {"id": "m1", "kind": "prompt", "text": "run the tests"}
WAIT = 10.0


def started(relay, lich, **kw):
    r = relay(**kw)
    r.wait_hello()
    assert lich.wait_polled("s1", WAIT, parked=True)
    return r


def send(lich, *commands):
    """Queue commands for the daemon's held poll, which carries them all."""
    lich.queue_all("s1", list(commands))


def test_the_hello_line_comes_once_the_socket_listens(relay, run_dir):
    r = relay()
    hello = r.wait_hello()
    assert hello["protocol"] == 1 and hello["version"] == __version__
    assert hello["pid"] == r.proc.pid
    assert hello["socket"] == os.path.join(run_dir, "s1.sock")
    assert stat.S_ISSOCK(os.stat(hello["socket"]).st_mode)
    assert r.status()["daemon"]["session_id"] == "s1"


@pytest.mark.parametrize("args, host", [((), "claude-code"), (("--host", "opencode"), "opencode")])
def test_the_status_names_the_program_the_relay_runs_in(relay, args, host):
    r = relay(args=args)
    r.wait_hello()
    assert r.status()["daemon"]["host"] == host


def test_the_run_folder_is_0700_and_the_socket_0600(relay, tmp_path):
    folder = tmp_path / "made-by-daemon"
    r = relay(env={"LICH_CONTROL_RUN_DIR": str(folder)})
    hello = r.wait_hello()
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(hello["socket"]).st_mode) == 0o600


@pytest.mark.parametrize("missing", ["LICH_PORT", "LICH_TOKEN", "LICH_SESSION_ID"])
def test_outside_lich_it_exits_0_silently_and_never_polls(daemon_env, lich, missing):
    env = procs.daemon_env(**dict(daemon_env, **{missing: ""}))
    done = subprocess.run([sys.executable, "-m", "lich_control.daemon"], cwd=procs.ROOT, env=env, capture_output=True, timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    assert lich.record.polls == []


@pytest.mark.parametrize("port", ["0", "65536", "http", "-1", "80 80"])
def test_a_bad_port_exits_2_with_one_line_and_no_request(daemon_env, lich, port):
    env = procs.daemon_env(**dict(daemon_env, LICH_PORT=port))
    done = subprocess.run([sys.executable, "-m", "lich_control.daemon"], cwd=procs.ROOT, env=env, capture_output=True, timeout=30)
    assert done.returncode == 2 and done.stdout == b""
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and "LICH_PORT must be a port number from 1 to 65535" in lines[0]
    assert lich.record.polls == []


def test_the_log_file_is_private_and_holds_each_ack(relay, lich, run_dir):
    r = started(relay, lich)
    send(lich, {"id": "m12", "kind": "rewind"})
    lich.record.wait_acks(1)
    r.stop()
    path = os.path.join(run_dir, "s1.log")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with open(path) as f:
        text = f.read()
    assert "acked m12 (rewind): failed: unknown kind" in text


def test_the_log_level_is_settable(relay, lich, run_dir):
    r = started(relay, lich, env={"LICH_CONTROL_LOG_LEVEL": "WARNING"})
    send(lich, {"id": "m12", "kind": "rewind"})
    lich.record.wait_acks(1)
    r.stop()
    with open(os.path.join(run_dir, "s1.log")) as f:
        assert "acked m12" not in f.read()


def test_every_request_carries_the_contract_release_and_the_token_in_the_url(relay, lich):
    r = started(relay, lich)
    send(lich, {"id": "m12", "kind": "rewind"})
    lich.record.wait_acks(1)
    poll, ack = lich.record.polls[0], lich.record.acks[0]
    assert poll.header("X-Lich-Plugin") == CONTRACT_RELEASE
    assert poll.query == {"token": [lich.token], "session_id": ["s1"]}
    assert ack.header("X-Lich-Plugin") == CONTRACT_RELEASE and ack.query == {"token": [lich.token]}
    assert ack.body == {"session_id": "s1", "id": "m12", "kind": "rewind", "ok": False, "error": "unknown kind"}
    daemon = r.status()["daemon"]  # both versions, each for what it is
    assert (daemon["version"], daemon["contract_release"]) == (__version__, CONTRACT_RELEASE)


def test_a_prompt_is_submitted_and_acked_once_its_turn_starts(relay, lich):
    r = started(relay, lich)
    send(lich, PROMPT)
    call = r.next_call()
    assert (call["method"], call["args"]) == ("prompt.submit", {"text": "run the tests"})
    r.event("turn.start", "t1")
    r.result(call["id"], {"text": "run the tests"})
    assert lich.record.ack_for("m1") == {"session_id": "s1", "id": "m1", "kind": "prompt", "ok": True}


def test_a_notification_prompt_is_submitted_as_the_user(relay, lich):
    r = started(relay, lich)
    send(lich, {"id": "m11", "kind": "prompt", "text": 'Session "a<b&c" waits.', "notification": {"status": "waiting", "summary": 'session "a<b&c" is waiting'}})
    call = r.next_call()
    assert call["args"] == {
        "text": '<task-notification>\n<status>waiting</status>\n<summary>session "a&lt;b&amp;c" is waiting</summary>\n<result>Session "a<b&c" waits.</result>\n</task-notification>',
        "asUser": True,
    }


def test_a_dropped_prompt_is_acked_with_the_drop_reason(relay, lich):
    r = started(relay, lich)
    send(lich, PROMPT)
    r.result(r.next_call()["id"], {"drop": "a plugin dropped it"})
    assert lich.record.ack_for("m1")["error"] == "a plugin dropped it"


def test_slash_commands_pass_args_only_when_given(relay, lich):
    r = started(relay, lich)
    send(lich, {"id": "m7", "kind": "command", "name": "compact", "args": "keep the test plan"}, {"id": "m8", "kind": "command", "name": "clear"})
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
    send(lich, {"id": "m2", "kind": "abort"})
    call = r.next_call()
    assert (call["method"], call["args"]) == ("turn.abort", {"turnId": "t1"})
    r.result(call["id"], None)
    assert lich.record.ack_for("m2")["ok"] is True


def test_abort_with_no_turn_running_is_refused(relay, lich):
    r = started(relay, lich)
    r.event("turn.start", "t1")
    r.event("turn.complete", "t1")
    send(lich, {"id": "m2", "kind": "abort"})
    assert lich.record.ack_for("m2")["error"] == "no turn is running"


def test_a_rejected_abort_acks_the_relays_message(relay, lich):
    r = started(relay, lich)
    r.event("turn.start", "t1")
    send(lich, {"id": "m2", "kind": "abort"})
    r.result(r.next_call()["id"], error="t1 is not the running turn (t2 is)")
    assert lich.record.ack_for("m2")["error"] == "t1 is not the running turn (t2 is)"


def test_model_and_effort_set_and_drop_both_overrides_at_once(relay, lich):
    r = started(relay, lich)
    send(lich, {"id": "m3", "kind": "model", "model": "claude-opus-4-1"}, {"id": "m5", "kind": "effort", "effort": "high"}, {"id": "m4", "kind": "model"}, {"id": "m6", "kind": "effort"})
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


def test_an_unknown_effort_is_refused_without_reaching_the_relay(relay, lich):
    r = started(relay, lich)
    send(lich, {"id": "m5", "kind": "effort", "effort": "ultra"}, {"id": "m12", "kind": "rewind"}, {"id": "m3", "kind": "model", "model": "opus"})
    # Calls go out in order on one stream: the first one is m3's, so neither before it made one.
    call = r.next_call()
    assert (call["method"], call["args"]) == ("overrides.set", {"model": "opus", "effort": None})
    assert lich.record.ack_for("m5")["error"] == "unknown effort"
    assert lich.record.ack_for("m12")["error"] == "unknown kind"


def test_an_ask_forks_behind_the_preamble_and_carries_the_answer(relay, lich):
    r = started(relay, lich)
    send(lich, {"id": "m9", "kind": "ask", "question": "what are you working on?"})
    call = r.next_call()
    assert call["method"] == "model.fork"
    assert call["args"]["prompt"].endswith("what are you working on?")
    assert "side question" in call["args"]["prompt"]
    r.result(call["id"], {"isAnswered": True, "text": "Fixing the login test.", "usage": {}})
    assert lich.record.ack_for("m9") == {"session_id": "s1", "id": "m9", "kind": "ask", "ok": True, "answer": "Fixing the login test."}


def test_a_long_answer_is_cut_and_the_ack_stays_under_64_kib(relay, lich):
    r = started(relay, lich)
    send(lich, {"id": "m9", "kind": "ask", "question": "everything?"})
    r.result(r.next_call()["id"], {"isAnswered": True, "text": "\x01" * 30000})
    answer = lich.record.ack_for("m9")["answer"]
    assert len(lich.record.acks[0].raw) < 64 * 1024 and answer.endswith("\n[truncated]")


def test_an_unanswered_fork_acks_its_reason(relay, lich):
    r = started(relay, lich)
    send(lich, {"id": "m9", "kind": "ask", "question": "q?"})
    r.result(r.next_call()["id"], {"isAnswered": False, "reason": "api-error", "status": 529, "error": "overloaded", "usage": {}})
    assert lich.record.ack_for("m9")["error"] == "api-error 529 overloaded"


def test_polling_never_waits_on_a_command(relay, lich):
    r = started(relay, lich)
    send(lich, {"id": "m3", "kind": "model", "model": "opus"})
    r.next_call()  # overrides.set, left unanswered: the worker is blocked on it
    lich.record.wait_polls(2)  # the poll went out again at once
    assert lich.wait_polled("s1", WAIT, parked=True)


def test_asks_run_at_once_concurrently_and_ack_outside_the_order(relay, lich):
    r = started(relay, lich)
    send(lich, {"id": "m3", "kind": "model", "model": "opus"}, {"id": "a1", "kind": "ask", "question": "one?"}, {"id": "a2", "kind": "ask", "question": "two?"})
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
    send(lich, {"id": "m12", "kind": "rewind"}, {"id": "m3", "kind": "model", "model": "opus"})
    lich.record.wait_acks(1)
    waiting = {entry["id"]: entry["waiting_on"] for entry in r.status()["in_flight"]}
    # m3 is not started while m12's ack is out (it may not even be handed on yet)
    assert waiting["m12"] == "ack" and waiting.get("m3", "worker") == "worker"
    lich.faults.release_acks()
    assert r.next_call()["method"] == "overrides.set"
    assert lich.record.acks[0].answer == 204


def test_an_ack_lich_refuses_is_not_retried_and_the_next_command_runs(relay, lich):
    r = started(relay, lich)
    lich.faults.script_acks(AckAnswer(status=400, reason="refused: because the test said so"))
    send(lich, {"id": "m12", "kind": "rewind"}, {"id": "m13", "kind": "rewind"})
    lich.record.ack_for("m13")
    r.stop()  # nothing can come after this
    assert [(a.id, a.answer) for a in lich.record.acks] == [("m12", 400), ("m13", 204)]  # m12 was not sent again
    assert any("lich refused the ack for m12" in line and "refused: because the test said so" in line for line in r.stderr_lines)


def test_bad_items_are_reported_and_the_daemon_keeps_polling(relay, lich):
    r = started(relay, lich)
    # Items lich itself would never queue: handed to the poll as they are.
    lich.faults.deliver("junk", 42, {"kind": "abort"}, {"id": 5, "kind": "abort"}, {"id": "b1", "kind": "prompt", "text": 7}, {"id": "b2", "kind": "model", "model": []}, {"id": "b3"})
    assert lich.record.ack_for("b1")["error"] == "text must be a string (got a number)"
    assert lich.record.ack_for("b2")["error"].startswith("model must be a non-empty string")
    assert lich.record.ack_for("b3") == {"session_id": "s1", "id": "b3", "kind": "unknown", "ok": False, "error": "command has no kind"}
    assert len(lich.record.acks) == 3
    lich.record.wait_polls(2)
    errors = " | ".join(e["what"] for e in r.status()["errors"])
    assert "not a JSON object" in errors and "no id" in errors


@pytest.mark.parametrize(
    "body",
    [b"{", b"[1, 2]", b'{"id": "x"}', b'{"id": "x", "ok": "yes"}', b'{"id": "x", "ok": false}', b"[" * 200_000, b'{"id": "\xff"}'],
    ids=["cut", "array", "no-ok", "ok-not-bool", "no-error", "nested-too-deep", "not-utf8"],
)
def test_a_relay_result_of_the_wrong_shape_is_answered_400_with_a_reason(relay, lich, body):
    r = started(relay, lich)
    status, text = r.post("/v1/result", body)
    assert status == 400 and text.strip() and b"\n" not in text.strip()
    assert r.status()["daemon"]["pid"] == r.proc.pid  # the same daemon goes on answering


def test_unknown_call_ids_and_events_are_taken_and_ignored(relay, lich):
    r = started(relay, lich)
    assert r.post("/v1/result", {"id": "c999", "ok": True, "value": None})[0] == 204
    assert r.post("/v1/event", {"event": "turn.pause", "turnId": "t1"})[0] == 204
    assert r.status()["turn"] is None


def test_other_paths_404_and_other_methods_405(relay, lich):
    r = started(relay, lich)
    assert unix_request(r.socket, "GET", "/v2/nothing")[0] == 404
    assert unix_request(r.socket, "GET", "/v1/result")[0] == 405
    assert unix_request(r.socket, "DELETE", "/v1/status")[0] == 405
    assert unix_request(r.socket, "PUT", "/v1/event", b"{}")[0] == 405


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
    send(lich, {"id": "m12", "kind": "rewind"})
    lich.record.wait_acks(1)
    poll = r.status()["poll"]
    assert (poll["state"], poll["backoff"], poll["failures"]) == ("polling", 0, 1)
