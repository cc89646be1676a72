"""Faults injected at a loopback lich: the daemon keeps going, applies
nothing twice, acks each delivered command at most once, and comes back
within one backoff step of lich. (The schedule itself is a frozen-clock test
in test_poller.py, and a 404's end of polling is in test_integration.py.)"""
import collections
import json
import os
import socket
import threading
import time
from urllib.parse import quote

import pytest

from fakelich import Answer, FakeLich
from fakes import RawAnswer

REWIND = {"id": "m12", "kind": "rewind"}


def running(relay, lich):
    r = relay()
    r.wait_hello()
    seen = r.autoanswer()
    lich.wait_parked()
    return r, seen


def assert_each_acked_at_most_once(lich):
    counts = collections.Counter(b["id"] for b in lich.ack_bodies() if isinstance(b, dict))
    assert all(n == 1 for n in counts.values()), counts


def test_a_poll_dropped_before_lich_answers_backs_off_and_resumes(relay, lich):
    lich.script(Answer(drop=True))
    r = relay()
    r.wait_hello()
    r.autoanswer()
    polls = lich.wait_polls(2)
    assert 0.9 <= polls[1][0] - polls[0][0] < 2.0
    lich.send(REWIND)
    assert lich.ack_for("m12")["error"] == "unknown kind"
    assert r.proc.poll() is None


def test_a_connection_closed_after_the_answer_costs_nothing(relay, lich):
    r, seen = running(relay, lich)
    lich.script(Answer(body=[{"id": "m3", "kind": "model", "model": "opus"}], close_after=True))  # to the parked poll
    lich.ack_for("m3")
    polls = lich.wait_polls(2)
    lich.wait_parked()
    assert polls[1][0] - polls[0][0] < 0.9  # no backoff: the answer was whole
    assert r.status()["poll"]["failures"] == 0


@pytest.mark.parametrize(
    "answer",
    [
        Answer(body=[REWIND], reset_mid_body=True),
        Answer(raw=json.dumps([REWIND]).encode(), length=500),  # truncated: fewer bytes than declared
        Answer(raw=b'[{"id": "m12", "kind": "rew'),  # cut JSON with a matching length
        Answer(raw=b"[" + b" " * (16 * 1024 * 1024) + b"]"),  # over the 16 MiB cap
        Answer(raw=b"[" * 200_000 + b"]" * 200_000),  # RecursionError, not ValueError, in the parser
        Answer(raw=b'[{"id": "m12", "kind": "\xff\xfe"}]'),  # not UTF-8
    ],
    ids=["reset-mid-body", "truncated", "cut-json", "oversized", "nested-too-deep", "not-utf8"],
)
def test_a_broken_answer_is_a_failed_poll_and_applies_nothing(relay, lich, answer):
    r, seen = running(relay, lich)
    began = lich.polls[0][0]
    lich.script(answer)  # the parked poll gets it
    polls = lich.wait_polls(2)
    assert polls[1][0] - began >= 0.9  # backed off
    lich.send({"id": "m13", "kind": "rewind"})
    lich.ack_for("m13")
    assert [b["id"] for b in lich.ack_bodies()] == ["m13"]  # nothing from the broken answer
    assert r.status()["poll"]["failures"] == 1


def test_a_slow_answer_within_the_read_timeout_is_taken(relay, lich):
    r, seen = running(relay, lich)
    lich.script(Answer(body=[REWIND], delay=1.5))
    assert lich.ack_for("m12")["error"] == "unknown kind"
    assert r.status()["poll"]["failures"] == 0


class Refuser:
    """What a dead lich's port looks like from outside: each connection is
    reset at once. Counting them lets the test wait for the daemon's retries."""

    def __init__(self, port):
        self.sock = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self.attempts = []
        self.cond = threading.Condition()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            conn.close()
            with self.cond:
                self.attempts.append(time.monotonic())
                self.cond.notify_all()

    def wait(self, n, timeout):
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.attempts) >= n, timeout), f"{len(self.attempts)} attempts"
            return list(self.attempts)

    def close(self):
        self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept, or the port stays taken
        self.sock.close()


def test_lich_killed_mid_poll_and_restarted_on_its_port_is_found_again(relay, lich):
    r, seen = running(relay, lich)
    lich.kill()  # the parked poll is reset
    dead = Refuser(lich.port)
    try:
        attempts = dead.wait(2, timeout=5)  # the retries after 1 s, then 2 s
        assert 0.9 <= attempts[1] - attempts[0] < 3.0
    finally:
        dead.close()
    backoff = r.status()["poll"]["backoff"]
    assert backoff == 4  # three failures so far: the reset and two refusals
    reborn = FakeLich(token=lich.token, port=lich.port)
    came_back = time.monotonic()
    try:
        reborn.wait_polls(1, timeout=backoff + 2)
        assert reborn.polls[0][0] - came_back <= backoff + 0.5  # within one backoff step
        reborn.send(REWIND)
        assert reborn.ack_for("m12")["error"] == "unknown kind"
        assert r.status()["poll"]["backoff"] == 0
    finally:
        reborn.close()


def test_a_command_delivered_twice_is_applied_and_acked_once(relay, lich):
    r, seen = running(relay, lich)
    command = {"id": "m3", "kind": "model", "model": "opus"}
    lich.send(command)
    lich.ack_for("m3")
    lich.send(command, {"id": "m13", "kind": "rewind"})
    lich.ack_for("m13")
    assert [c["method"] for c in seen.calls] == ["overrides.set"]
    assert_each_acked_at_most_once(lich)


def test_an_ack_whose_connection_drops_is_not_resent_and_the_next_runs(relay, lich):
    r, seen = running(relay, lich)
    lich.ack_faults = ["drop"]
    lich.send({"id": "m12", "kind": "rewind"}, {"id": "m13", "kind": "rewind"})
    lich.ack_for("m13")
    assert lich.acks_arrived == 2  # m12 went once, and was not tried again
    assert [b["id"] for b in lich.ack_bodies()] == ["m13"]
    status = r.status()
    assert status["counts"]["rewind"]["unsent"] == 1
    assert any("m12" in e["what"] for e in status["errors"])


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
