"""Faults injected at the development lich: the daemon keeps going, applies
nothing from a broken answer, acks each delivered command at most once, and
finds lich again after it died. (The backoff schedule is a frozen-clock test
in test_poller.py plus one real-time test in test_integration.py; a 404's end
of polling is in both too; a command delivered twice is test_poller.py's and
the property tests'.)"""
import json
import os
from urllib.parse import quote

import pytest

from fakes import RawAnswer
from lich_dev.lich import AckAnswer, Answer, StubLich

REWIND = {"id": "m12", "kind": "rewind"}
WAIT = 10.0


def running(relay, lich):
    r = relay()
    r.wait_hello()
    r.autoanswer()
    assert lich.wait_polled("s1", WAIT, parked=True)
    return r


def test_a_connection_closed_after_the_answer_costs_nothing(relay, lich):
    r = running(relay, lich)
    lich.faults.script(Answer(body=[{"id": "m3", "kind": "model", "model": "opus"}], close_after=True))  # to the parked poll
    lich.record.ack_for("m3")
    # Parked again: had the daemon sent its next poll on the closed connection,
    # that poll would have failed first, and the status would count it.
    assert lich.wait_polled("s1", WAIT, more_than=1, parked=True)
    assert r.status()["poll"]["failures"] == 0


@pytest.mark.parametrize(
    "answer",
    [
        Answer(drop=True),  # the connection closed before lich answered
        Answer(body=[REWIND], reset_mid_body=True),
        Answer(raw=json.dumps([REWIND]).encode(), length=500),  # truncated: fewer bytes than declared
        Answer(raw=b'[{"id": "m12", "kind": "rew'),  # cut JSON with a matching length
        Answer(raw=b"[" + b" " * (16 * 1024 * 1024) + b"]"),  # over the 16 MiB cap
    ],
    # (An item nested too deep, or not UTF-8, costs that item alone: test_hostile_poll.py.)
    ids=["dropped", "reset-mid-body", "truncated", "cut-json", "oversized"],
)
def test_a_broken_answer_is_a_failed_poll_and_applies_nothing(relay, lich, answer):
    r = running(relay, lich)
    lich.faults.script(answer)  # the parked poll gets it
    lich.record.wait_polls(2)
    lich.queue("s1", {"id": "m13", "kind": "rewind"})
    lich.record.ack_for("m13")
    assert [a.id for a in lich.record.acks] == ["m13"]  # nothing from the broken answer
    poll = r.status()["poll"]
    assert (poll["state"], poll["failures"]) == ("polling", 1)  # one failed poll, and polling resumed


def test_a_slow_answer_within_the_read_timeout_is_taken(relay, lich):
    r = running(relay, lich)
    lich.faults.script(Answer(body=[REWIND], delay=1.5))
    assert lich.record.ack_for("m12")["error"] == "unknown kind"
    assert r.status()["poll"]["failures"] == 0


def test_lich_killed_mid_poll_and_restarted_on_its_port_is_found_again(relay, lich):
    r = running(relay, lich)
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


def test_an_ack_whose_connection_drops_is_not_resent_and_the_next_runs(relay, lich):
    r = running(relay, lich)
    lich.faults.script_acks(AckAnswer(drop=True))
    lich.queue_all("s1", [{"id": "m12", "kind": "rewind"}, {"id": "m13", "kind": "rewind"}])
    lich.record.ack_for("m13")
    status = r.status()
    assert status["counts"]["rewind"]["unsent"] == 1
    assert any("m12" in e["what"] for e in status["errors"])
    r.stop()  # nothing can come after this
    assert [(a.id, a.answer) for a in lich.record.acks] == [("m12", None), ("m13", 204)]  # m12 went once


def test_urllib3s_warning_about_a_malformed_answer_reaches_the_log_without_the_token(relay, lich, run_dir):
    # urllib3 logs a header it cannot parse with the request's URL, token and all.
    raw = RawAnswer(b"HTTP/1.1 200 OK\r\nthis is no header\r\n\r\n[]")
    try:
        r = relay({"LICH_PORT": str(raw.port)})
        r.wait_hello()
        raw.wait(2)  # the first answer was read (an empty batch) and the poll went out again
        r.proc.terminate()
        assert r.wait_exit(5) == 0  # the log is flushed on the way out
    finally:
        raw.close()
    with open(os.path.join(run_dir, "s1.log"), encoding="utf-8") as f:
        log = f.read()
    assert "Failed to parse headers" in log and "token=[token]" in log
    assert lich.token not in log and quote(lich.token, safe="") not in log
    assert lich.token not in "".join(r.stderr_lines) and quote(lich.token, safe="") not in "".join(r.stderr_lines)
