"""The development lich keeps the server side of the contract, over real loopback HTTP.

Its clock rules (the 25 s hold, the 30 s attach window, the stale drop) run
on an injected clock the test moves; held polls are released by queueing or
by `clock_moved`, never by waiting. Each rule names where lich has it
(github.com/omartelo/lich, internal/terminal/modcontrol.go unless said).
"""
import json
import logging
import socket
import threading

import pytest
import requests

from lich_dev.lich import NotPolling, Refused, StubLich
from lich_dev.rules import PLUGIN_TOO_OLD
from lich_dev.state import ACKED, DELIVERED, DROPPED, ENDED, WITHDRAWN

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
    with StubLich(clock=clock) as server:
        yield server


def poll(http, lich, session_id="s1", token=None, plugin="0.16.0"):
    headers = {} if plugin is None else {"X-Lich-Plugin": plugin}
    return http.get(f"{lich.url}/mod/commands", params={"token": token or lich.token, "session_id": session_id}, headers=headers, timeout=WAIT)


def post_ack(http, lich, data, token=None, plugin="0.16.0"):
    body = data if isinstance(data, (str, bytes)) else json.dumps(data)
    headers = {"Content-Type": "application/json", "X-Lich-Plugin": plugin}
    return http.post(f"{lich.url}/mod/acks", params={"token": token or lich.token}, data=body, headers=headers, timeout=WAIT)


def ack(cid, kind, ok=True, session_id="s1", **extra):
    return dict({"session_id": session_id, "id": cid, "kind": kind, "ok": ok}, **extra)


def first_poll(http, lich, session_id="s1", plugin="0.16.0"):
    """Register the mod as polling: a poll that answers at once."""
    lich.hold, held = 0.0, lich.hold
    try:
        assert poll(http, lich, session_id, plugin=plugin).json() == []
    finally:
        lich.hold = held


def delivered(http, lich, command, session_id="s1"):
    """Queue a command and have a poll carry it; its id."""
    cid = lich.queue(session_id, command)
    assert [c["id"] for c in poll(http, lich, session_id).json()] == [cid]
    return cid


# -- requests lich refuses ------------------------------------------------------


def test_a_poll_or_an_ack_with_a_wrong_token_is_401(http, lich):
    assert poll(http, lich, token="wrong").status_code == 401
    assert post_ack(http, lich, ack("m1", "abort"), token="wrong").status_code == 401


def test_a_poll_without_a_session_is_400(http, lich):
    answer = http.get(f"{lich.url}/mod/commands", params={"token": lich.token}, timeout=WAIT)
    assert (answer.status_code, answer.text) == (400, "session_id is required\n")


def test_a_wrong_method_is_405(http, lich):
    assert http.get(f"{lich.url}/mod/acks", params={"token": lich.token}, timeout=WAIT).status_code == 405
    assert http.post(f"{lich.url}/mod/commands", params={"token": lich.token}, data=b"[]", timeout=WAIT).status_code == 405
    assert http.delete(f"{lich.url}/mod/commands", params={"token": lich.token}, timeout=WAIT).status_code == 405


def test_an_ack_body_over_64_kib_is_refused(http, lich):
    body = ack("m9", "ask", answer="x" * (64 * 1024))
    resp = post_ack(http, lich, body)
    assert resp.status_code == 400 and "64 KiB" in resp.text


def test_an_ack_whose_kind_lich_does_not_know_is_a_400_in_lichs_words(http, lich):
    # parseModAck: knownModKind, else "mod ack has unknown kind %q"
    resp = post_ack(http, lich, ack("m12", "rewind", ok=False, error="unknown kind"))
    assert (resp.status_code, resp.text) == (400, 'mod ack has unknown kind "rewind"\n')


def test_a_lich_newer_than_the_mod_takes_the_ack_of_its_newer_kind(http, clock):
    with StubLich(clock=clock, newer_kinds={"rewind": ("to",)}) as lich:
        first_poll(http, lich)
        cid = delivered(http, lich, {"kind": "rewind", "to": "t1"})
        assert post_ack(http, lich, ack(cid, "rewind", ok=False, error="unknown kind")).status_code == 204
        outcome = lich.wait(cid, WAIT)
    assert outcome.state == ACKED and outcome.error == PLUGIN_TOO_OLD


@pytest.mark.parametrize(
    "raw",
    # Deep, yet under the 64 KiB limit: a RecursionError in the parser, not a size refusal.
    [b"[" * 30000 + b"]" * 30000, b'{"a":' * 9000 + b"1" + b"}" * 9000, b"\xff\xfe\x00{", b'{"id": 1' + b"0" * 5000 + b"}"],
    ids=["deep-array", "deep-object", "invalid-utf8", "huge-number"],
)
def test_a_hostile_ack_body_costs_one_400_and_the_connection_lives_on(http, lich, raw):
    resp = post_ack(http, lich, raw)
    assert (resp.status_code, resp.text) == (400, "body must be a JSON object\n")
    assert post_ack(http, lich, ack("m1", "abort")).status_code == 204  # the same kept connection


def test_a_lone_surrogate_in_an_ack_is_taken_like_any_other_text(http, lich):
    assert post_ack(http, lich, b'{"session_id": "s1", "id": "m1", "kind": "abort", "ok": false, "error": "\\ud800"}').status_code == 204


# -- polls ---------------------------------------------------------------------


def test_a_held_poll_wakes_the_moment_a_command_is_queued(http, lich, background):
    first_poll(http, lich)
    held = background.submit(poll, http, lich)
    assert lich.wait_polled("s1", WAIT, more_than=1, parked=True)
    cid = lich.queue("s1", {"kind": "abort"})
    # the hold is 25 s on a clock that does not move: only the queueing can answer within WAIT
    assert held.result(WAIT).json() == [{"kind": "abort", "id": cid}]


def test_a_held_poll_answers_empty_once_25_s_pass_on_the_lichs_clock(http, lich, clock, background):
    # modPollWait = 25 * time.Second
    held = background.submit(poll, http, lich)
    assert lich.wait_polled("s1", WAIT, parked=True)
    clock.now += 25.0
    lich.clock_moved()
    assert held.result(WAIT).json() == []


def test_a_command_is_delivered_at_most_once(http, lich):
    first_poll(http, lich)
    lich.queue("s1", {"kind": "model", "model": "m"})
    lich.queue("s1", {"kind": "effort"})
    assert [c["kind"] for c in poll(http, lich).json()] == ["model", "effort"]
    first_poll(http, lich)  # nothing left to take


def test_commands_go_only_to_their_own_session(http, lich):
    first_poll(http, lich, "s1")
    first_poll(http, lich, "s2")
    lich.queue("s2", {"kind": "abort"})
    first_poll(http, lich, "s1")
    assert len(poll(http, lich, "s2").json()) == 1


def test_a_command_is_queued_as_lich_would_send_it(http, lich):
    first_poll(http, lich)
    lich.queue("s1", {"kind": "command", "name": "/compact", "args": "keep the plan"})
    assert poll(http, lich).json() == [{"kind": "command", "name": "compact", "args": "keep the plan", "id": "k1"}]


def test_queueing_refuses_what_lich_refuses_before_anything_is_queued(http, lich):
    first_poll(http, lich)
    with pytest.raises(Refused, match="^prompt command has no text$"):
        lich.queue_all("s1", [{"kind": "abort"}, {"kind": "prompt", "text": " "}])
    with pytest.raises(Refused, match="^/model is refused as a command"):
        lich.queue("s1", {"kind": "command", "name": "//Model"})
    first_poll(http, lich)  # the abort went nowhere: one refused command refuses them all


# -- the attach window (enqueue: errModDetached) ---------------------------------


def test_queueing_for_a_session_that_never_polled_is_refused_naming_what_to_fix(lich):
    with pytest.raises(NotPolling) as err:
        lich.queue("s1", {"kind": "abort"})
    said = str(err.value)
    assert said.startswith("session s1 cannot take commands: no mod has ever polled for it.")
    assert f"LICH_PORT={lich.port}" in said and "LICH_SESSION_ID=s1" in said and "mods on" in said
    assert lich.token not in said


def test_queueing_is_refused_once_the_mod_has_not_polled_for_30_s(http, lich, clock):
    # attachWindow = modPollWait + modRepollGrace; refused when now - lastSeen > it
    first_poll(http, lich)
    clock.now += 30.0
    lich.queue("s1", {"kind": "abort"})
    clock.now += 1.0
    with pytest.raises(NotPolling) as err:
        lich.queue("s1", {"kind": "abort"})
    assert "its mod has not polled for 31 s" in str(err.value)


def test_a_command_queued_over_30_s_before_the_next_poll_is_dropped(http, lich, clock):
    # drainLocked: a command older than the attach window is not handed out
    first_poll(http, lich)
    cid = lich.queue("s1", {"kind": "abort"})
    clock.now += 30.5
    first_poll(http, lich)
    outcome = lich.wait(cid, WAIT)
    assert (outcome.state, outcome.delivered, outcome.dropped) == (DROPPED, False, "no poll took it within 30 s")


def test_a_mod_that_hung_up_its_held_poll_is_not_polling(lich):
    # The stub's own rule (docs/dev-lich.md): lich would wait out the window.
    conn = socket.create_connection(("127.0.0.1", lich.port))
    conn.sendall(f"GET /mod/commands?token={lich.token}&session_id=s1 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert lich.wait_polled("s1", WAIT, parked=True)
    conn.close()
    assert lich.wait_until("s1", lambda info: info.hung_up and not info.parked, WAIT)
    with pytest.raises(NotPolling) as err:
        lich.queue("s1", {"kind": "abort"})
    assert "its mod hung up its last poll and has not polled since" in str(err.value)


# -- the caller's wait (await, withdrawLocked) -----------------------------------


def test_a_command_no_poll_collected_before_the_wait_ended_is_withdrawn_and_never_delivered(http, lich):
    first_poll(http, lich)
    cid = lich.queue("s1", {"kind": "prompt", "text": "too late"})
    outcome = lich.wait(cid, 0)
    assert (outcome.state, outcome.delivered) == (WITHDRAWN, False)
    first_poll(http, lich)  # the next poll gets nothing
    assert lich.wait(cid, 0).state == WITHDRAWN


def test_a_command_delivered_but_not_acked_in_time_stays_delivered_and_its_late_ack_is_a_stray(http, lich):
    first_poll(http, lich)
    cid = delivered(http, lich, {"kind": "abort"})
    assert lich.wait(cid, 0).state == DELIVERED
    assert post_ack(http, lich, ack(cid, "abort")).status_code == 204
    assert lich.wait(cid, 0).ack is None and lich.stray_acks == 1


def test_an_ack_settles_the_wait_and_a_second_one_is_accepted_but_changes_nothing(http, lich):
    first_poll(http, lich)
    cid = delivered(http, lich, {"kind": "effort", "effort": "turbo"})
    first = ack(cid, "effort", ok=False, error="unknown effort")
    assert post_ack(http, lich, first).status_code == 204
    assert post_ack(http, lich, dict(first, error="later")).status_code == 204
    outcome = lich.wait(cid, WAIT)
    assert (outcome.state, outcome.ack, outcome.ok, outcome.error) == (ACKED, first, False, "unknown effort")
    assert outcome.took_s is not None and lich.stray_acks == 1


def test_an_ack_for_an_id_nobody_waits_on_is_accepted(http, lich):
    # parseModAck: "an ack nobody is waiting on is accepted like any other"
    assert post_ack(http, lich, ack("from-an-older-lich", "prompt")).status_code == 204
    assert (lich.acks_received, lich.stray_acks) == (1, 1)


def test_an_ack_from_another_session_than_the_commands_settles_nothing(http, lich):
    # settle: "or from another session than the one the command went to, is left alone"
    first_poll(http, lich)
    cid = delivered(http, lich, {"kind": "abort"})
    assert post_ack(http, lich, ack(cid, "abort", session_id="s2")).status_code == 204
    assert lich.wait(cid, 0).state == DELIVERED


def test_close_lets_a_waiter_go_at_once_and_says_the_lich_ended(http, clock):
    lich = StubLich(hold=0.0, clock=clock).start()
    poll(http, lich)
    cid = lich.queue("s1", {"kind": "abort"})
    outcomes = []
    waiting = threading.Thread(target=lambda: outcomes.append(lich.wait(cid, 60.0)))
    waiting.start()
    lich.close()
    waiting.join(WAIT)
    assert not waiting.is_alive() and outcomes[0].state == ENDED


# -- the plugin release (internal/terminal/pluginversion.go) ---------------------


def test_the_lich_keeps_the_last_release_each_session_named(http, lich, clock):
    first_poll(http, lich, plugin="0.15.2")
    first_poll(http, lich, plugin="0.16.0")
    clock.now += 4.0
    info = lich.polled("s1")
    assert (info.polls, info.last_poll_age_s, info.parked, info.plugin, info.plugin_compatible) == (2, 4.0, 0, "0.16.0", True)
    assert lich.polled("nobody").last_poll_age_s is None


def test_a_release_outside_the_range_or_none_is_warned_about_once_per_session_and_release(http, lich, caplog):
    caplog.set_level(logging.WARNING, logger="lich_dev.lich")
    first_poll(http, lich, "s1", plugin=None)  # a plugin older than the header
    first_poll(http, lich, "s1", plugin=None)  # the same again: no new warning
    first_poll(http, lich, "s1", plugin="0.1.0")
    first_poll(http, lich, "s2", plugin="0.1.0")  # another session
    first_poll(http, lich, "s3", plugin="0.16.0")  # in range: nothing to say
    assert post_ack(http, lich, ack("m1", "abort", session_id="s3"), plugin="0.19.0").status_code == 204  # acks name it too
    assert lich.plugins.warned == [("s1", "absent"), ("s1", "0.1.0"), ("s2", "0.1.0"), ("s3", "0.19.0")]
    lines = [r.getMessage() for r in caplog.records if "X-Lich-Plugin" in r.getMessage()]
    assert len(lines) == 4 and lines[0].startswith("session s1: its mod names plugin release absent")
    assert "0.13.0 up to, not including, 0.19.0" in lines[0] and "plugin-incompatible" in lines[0]
    assert (lich.polled("s1").plugin, lich.polled("s1").plugin_compatible) == ("0.1.0", False)


def test_a_session_that_changes_release_and_comes_back_is_warned_again(http, lich):
    # pluginversion_test.go: "back past the ceiling after a respawn" raises again
    for release in ("9.0.0", "0.13.0", "9.0.0"):
        first_poll(http, lich, plugin=release)
    assert lich.plugins.warned == [("s1", "9.0.0"), ("s1", "9.0.0")]


# -- the stub's own endpoints ------------------------------------------------------


def test_the_control_endpoint_refuses_a_wrong_token_a_session_not_polling_and_a_bad_body(http, lich):
    url = f"{lich.url}/stub/control"
    body = json.dumps({"session_id": "s1", "command": {"kind": "abort"}, "timeout": 1})
    assert http.post(url, params={"token": "wrong"}, data=body, timeout=WAIT).status_code == 401
    resp = http.post(url, params={"token": lich.token}, data=body, timeout=WAIT)
    assert resp.status_code == 409 and resp.json()["not_polling"] is True
    for bad in (b"[" * 100000, b"{}", json.dumps({"session_id": "s1", "command": {}, "timeout": "inf"}).encode()):
        assert http.post(url, params={"token": lich.token}, data=bad, timeout=WAIT).status_code == 400


def test_the_control_endpoint_answers_a_refusal_in_lichs_words(http, lich):
    first_poll(http, lich)
    body = json.dumps({"session_id": "s1", "command": {"kind": "command", "name": " /effort high"}, "timeout": 1})
    resp = http.post(f"{lich.url}/stub/control", params={"token": lich.token}, data=body, timeout=WAIT)
    assert resp.status_code == 409 and resp.json()["error"].startswith("/effort is refused as a command")


def test_the_sessions_endpoint_lists_who_polled(http, lich):
    first_poll(http, lich, "s1")
    doc = http.get(f"{lich.url}/stub/sessions", params={"token": lich.token}, timeout=WAIT).json()
    assert [(s["session_id"], s["polls"], s["plugin"]) for s in doc["sessions"]] == [("s1", 1, "0.16.0")]


# -- connections -------------------------------------------------------------------


def test_an_unknown_path_closes_the_connection_so_its_body_is_not_read_as_a_request(http, lich):
    answer = http.post(f"{lich.url}/mod/ack", params={"token": lich.token}, data=json.dumps({"id": "x"}), timeout=WAIT)
    assert answer.status_code == 404 and answer.headers.get("Connection") == "close"


def test_verbose_logging_names_each_request_by_its_path_never_its_token(http, lich, caplog):
    caplog.set_level(logging.DEBUG, logger="lich_dev.lich")
    first_poll(http, lich)
    assert "GET /mod/commands -> 200" in caplog.messages
    assert not any(lich.token in line for line in caplog.messages)


def test_a_closed_stub_hangs_up_after_its_last_answer(http, lich):
    first_poll(http, lich)
    lich.close()
    answer = poll(http, lich)
    assert answer.json() == [] and answer.headers.get("Connection") == "close"
