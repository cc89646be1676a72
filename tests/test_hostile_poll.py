"""The poll path under hostile answers (issue 15): a lich that restarts, an
answer Python's own parser refuses, an answer built to cost memory, a bug
while handing on, and ids past the limit. In process over mocked HTTP where
the poller alone is the subject; over the real daemon, bridge and loopback
HTTP where an ack must reach lich."""
import json
import os
import threading

import pytest
import responses

from lich_control.batch import MAX_ITEMS, MAX_VALUES, TOO_DEEP
from lich_control.unix_socket import MAX_VALUES as BODY_VALUES  # the socket's own bound on a relay body
from lich_control.commands import NOT_UTF8, Command
from lich_control.config import Config
from lich_dev.lich import Answer, StubLich
from lich_control.engine import Turns
from lich_control.lich import LichClient
from lich_control.poller import Poller
from lich_control.activity import Activity

from fakes import ScriptedClient

URL = "http://127.0.0.1:4312/mod/commands"
WAIT = 10.0
HUGE = b"9" * 5000  # past the 4,300 digits int() reads
HANDOFF_FAILED = "the daemon failed to take it (see its log)"


class Rig:
    """A Poller whose commands land in lists and whose waits are recorded."""

    def __init__(self, client=None, ask_submit=None):
        self.client = client or LichClient(Config(port=4312, token="tok", session_id="s1", run_dir="/tmp/x"))
        self.ordered, self.asks, self.waits = [], [], []
        self.handed = threading.Event()
        self.activity = Activity("s1", "fake", Turns())
        self.poller = Poller(self.client, self._ordered, ask_submit or self.asks.append, self.activity, wait=self._wait)

    def _ordered(self, command):
        self.ordered.append(command)
        self.handed.set()

    def _wait(self, delay):
        self.waits.append(delay)
        return False

    @property
    def errors(self):
        return [e["what"] for e in self.activity.snapshot()["errors"]]


@pytest.fixture
def mocked():
    with responses.RequestsMock() as rsps:
        yield rsps


def body_of(*parts):
    """A poll answer from items given as JSON values or as raw bytes."""
    return b"[" + b", ".join(p if isinstance(p, bytes) else json.dumps(p).encode() for p in parts) + b"]"


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "lich_control.poller" and r.levelname == "WARNING"]


def abort(cid):
    return {"id": cid, "kind": "abort"}


# -- item 2: an answer Python's parser refuses loses no batch -------------------------------


def test_a_huge_integer_in_one_command_costs_that_command_its_field_not_the_batch(mocked):
    rig = Rig()
    mocked.get(URL, body=body_of(abort("m1"), b'{"id": "m2", "kind": "model", "model": ' + HUGE + b"}", abort("m3")))
    assert rig.poller.poll_once() is True
    assert [c.id for c in rig.ordered] == ["m1", "m2", "m3"]
    assert rig.ordered[1].problem == "model must be a non-empty string, or absent to drop the override (got a number)"
    assert rig.waits == [] and rig.activity.snapshot()["poll"]["failures"] == 0


def test_a_huge_integer_as_an_item_or_an_id_skips_that_item_alone(mocked, caplog):
    rig = Rig()
    mocked.get(URL, body=body_of(HUGE, abort("m1"), b'{"id": -' + HUGE + b', "kind": "abort"}', abort("m2")))
    rig.poller.poll_once()
    assert [c.id for c in rig.ordered] == ["m1", "m2"]
    assert len(warnings_of(caplog)) == 1


@pytest.mark.parametrize("pad", [0, 100_000], ids=["short-answer", "long-answer"])
def test_an_item_nested_deeper_than_python_reads_costs_that_item_only(mocked, caplog, pad):
    rig = Rig()
    deep = b"[" * 5000 + b'{"id": "m9"}' + b"]" * 5000
    mocked.get(URL, body=body_of(abort("m1"), deep, {"id": "m2", "kind": "prompt", "text": "x" * pad}))
    assert rig.poller.poll_once() is True
    assert [c.id for c in rig.ordered] == ["m1", "m2"] and rig.waits == []
    (line,) = warnings_of(caplog)
    assert TOO_DEEP in line


def test_bad_json_midway_keeps_the_items_before_it_and_says_how_many_in_one_line(mocked, caplog):
    rig = Rig()
    mocked.get(URL, body=body_of(abort("m1"), abort("m2"))[:-1] + b', {"id": "m3", "kind"')
    assert rig.poller.poll_once() is True
    assert [c.id for c in rig.ordered] == ["m1", "m2"]
    # Not a JSON array, so a failed poll (the contract's backoff), after the two.
    assert rig.waits == [1.0]
    assert rig.activity.snapshot()["poll"]["reason"] == "lich's answer is not JSON after its first 2 items"
    assert warnings_of(caplog) == []


def test_an_item_that_is_not_utf8_is_acked_failed_and_costs_nothing_else(mocked):
    rig = Rig()
    mocked.get(URL, body=body_of(abort("m1"), b'{"id": "m2", "kind": "prompt", "text": "\xff"}', b'{"id": "m\xff", "kind": "abort"}', abort("m3")))
    rig.poller.poll_once()
    assert [(c.id, c.kind, c.problem) for c in rig.ordered] == [("m1", "abort", None), ("m2", "prompt", NOT_UTF8), ("m3", "abort", None)]
    assert rig.waits == []
    assert any("an item that is not valid UTF-8" in e for e in rig.errors)  # no sound id: nothing to ack it under


@pytest.mark.parametrize(
    "bad, acks",
    [
        (b"[" * 5000 + b"]" * 5000, {"m13": "unknown kind"}),
        (b'{"id": "m12", "kind": "prompt", "text": "\xff\xfe"}', {"m12": NOT_UTF8, "m13": "unknown kind"}),
    ],
    ids=["nested-too-deep", "not-utf8"],
)
def test_an_item_the_parser_refuses_costs_that_item_alone_in_the_real_daemon(relay, lich, bad, acks):
    r = relay()
    r.wait_hello()
    assert lich.wait_polled("s1", WAIT, parked=True)
    lich.faults.script(Answer(raw=body_of(bad, {"id": "m13", "kind": "rewind"})))
    lich.record.ack_for("m13")
    assert {a.id: a.body["error"] for a in lich.record.acks} == acks
    assert r.status()["poll"]["failures"] == 0


def a_model_call(relay, lich):
    """A real daemon with a model override's call out to the relay: (relay, command id, the call)."""
    r = relay()
    r.wait_hello()
    assert lich.wait_polled("s1", WAIT, parked=True)
    cid = lich.queue("s1", {"kind": "model", "model": "opus"})
    return r, cid, r.next_call()


def result_with_value(call, value: bytes) -> bytes:
    return b'{"id": "' + call["id"].encode() + b'", "ok": true, "value": ' + value + b"}"


def test_a_relay_result_holding_a_huge_integer_is_taken(relay, lich):
    r, cid, call = a_model_call(relay, lich)
    status, _ = r.post("/v1/result", result_with_value(call, HUGE))
    assert status == 204
    assert lich.wait(cid, WAIT).ok


def test_a_relay_body_that_would_build_too_many_values_is_refused_unbuilt_and_the_call_still_settles(relay, lich):
    r, cid, call = a_model_call(relay, lich)
    bomb = result_with_value(call, b"[" + b",".join([b"{}"] * (BODY_VALUES + 1)) + b"]")
    status, text = r.post("/v1/result", bomb)
    assert (status, text) == (400, f"the body holds more than {BODY_VALUES:,} JSON values\n".encode())
    status, _ = r.post("/v1/result", result_with_value(call, b"null"))
    assert status == 204
    assert lich.wait(cid, WAIT).ok


# -- item 3: what one answer may cost ------------------------------------------------------


def test_an_answer_over_the_item_cap_hands_on_the_first_items_and_says_so_once(mocked, caplog):
    rig = Rig()
    mocked.get(URL, body=body_of(*[abort(f"m{n}") for n in range(MAX_ITEMS + 500)]))
    assert rig.poller.poll_once() is True
    assert [c.id for c in rig.ordered] == [f"m{n}" for n in range(MAX_ITEMS)]
    (line,) = warnings_of(caplog)
    assert f"more than {MAX_ITEMS:,} items" in line and "dropped" in line
    assert rig.waits == []


def test_sixteen_mib_of_empty_objects_costs_one_summary_line_and_one_status_error(mocked, caplog):
    rig = Rig()
    count = (16 * 1024 * 1024 - 2) // 3  # 5.5 million `{}`
    mocked.get(URL, body=b"[" + b",".join([b"{}"] * count) + b"]")
    assert rig.poller.poll_once() is True
    assert rig.ordered == [] and rig.waits == []
    skipped, cut = warnings_of(caplog)
    assert f"skipped {MAX_ITEMS} items" in skipped and f"no id ×{MAX_ITEMS}" in skipped
    assert f"more than {MAX_ITEMS:,} items" in cut
    assert len(rig.errors) == 2


def test_one_item_built_of_millions_of_values_is_never_built(mocked, caplog):
    rig = Rig()
    mocked.get(URL, body=body_of(abort("m1"), b"[" + b",".join([b"{}"] * 1_000_000) + b"]", abort("m2")))
    assert rig.poller.poll_once() is True
    assert [c.id for c in rig.ordered] == ["m1"]
    (line,) = warnings_of(caplog)
    assert f"more than {MAX_VALUES:,} JSON values" in line


def test_a_stop_between_two_items_hands_on_nothing_more(mocked):
    rig = Rig()
    rig.poller._worker_submit = lambda command: (rig.ordered.append(command), rig.poller._stop.set())
    mocked.get(URL, body=body_of(*[abort(f"m{n}") for n in range(MAX_ITEMS)]))
    assert rig.poller.poll_once() is False
    assert [c.id for c in rig.ordered] == ["m0"]


# -- item 1: a lich that restarts ----------------------------------------------------------


def test_a_restarted_lich_s_first_commands_are_applied_and_acked(relay, lich):
    r = relay()
    r.wait_hello()
    r.autoanswer()
    assert lich.wait_polled("s1", WAIT, parked=True)
    before = lich.queue_all("s1", [{"id": "m1", "kind": "model", "model": "opus"}, {"id": "m2", "kind": "effort", "effort": "high"}])
    assert [lich.wait(cid, WAIT).ok for cid in before] == [True, True]
    port = lich.port
    lich.kill()
    # A new lich on the same port, counting from m1 again.
    again = StubLich(token=lich.token, port=port).start()
    try:
        assert again.wait_polled("s1", 30, parked=True)
        after = again.queue_all("s1", [{"id": "m1", "kind": "model", "model": "sonnet"}, {"id": "m2", "kind": "effort", "effort": "low"}])
        assert [again.wait(cid, WAIT).ok for cid in after] == [True, True]
        assert r.status()["overrides"] == {"model": "sonnet", "effort": "low"}
    finally:
        again.close()


# -- item 4: the poller never dies -------------------------------------------------------------


def test_an_item_that_fails_to_be_handed_on_is_acked_failed_and_the_rest_go_on(mocked, caplog):
    failures = [RuntimeError("a bug in the ask pool")]

    def ask_submit(command):
        if failures:
            raise failures.pop()
        rig.asks.append(command)

    rig = Rig(ask_submit=ask_submit)
    mocked.get(URL, body=body_of({"id": "m1", "kind": "ask", "question": "q"}, {"id": "m2", "kind": "ask", "question": "q"}, abort("m3")))
    assert rig.poller.poll_once() is True
    assert [(c.id, c.problem) for c in rig.ordered] == [("m1", HANDOFF_FAILED), ("m3", None)]
    assert [c.id for c in rig.asks] == ["m2"]
    assert any("handing on 'm1' (ask) failed" in r.getMessage() for r in caplog.records)


def test_an_item_that_fails_to_parse_is_acked_failed_under_its_id(mocked, monkeypatch):
    real = Command.from_json.__func__

    def from_json(cls, item):
        if item.get("id") == "m2":
            raise RuntimeError("a bug in parsing")
        return real(cls, item)

    monkeypatch.setattr(Command, "from_json", classmethod(from_json))
    rig = Rig()
    mocked.get(URL, body=body_of(abort("m1"), abort("m2"), abort("m3")))
    rig.poller.poll_once()
    assert [(c.id, c.kind, c.problem) for c in rig.ordered] == [("m1", "abort", None), ("m2", "abort", HANDOFF_FAILED), ("m3", "abort", None)]


def test_a_poll_whose_handling_fails_is_a_failed_poll_and_polling_goes_on():
    client = ScriptedClient([RuntimeError("a bug in the client"), [abort("m1")]])
    rig = Rig(client=client)
    rig.poller.start()
    try:
        assert rig.handed.wait(WAIT)
    finally:
        assert rig.poller.stop(timeout=WAIT)
    assert [c.id for c in rig.ordered] == ["m1"] and rig.waits == [1.0]
    assert rig.activity.snapshot()["poll"]["failures"] == 1


# -- item 5: an id over the limit is acked -----------------------------------------------------


def test_an_id_of_2000_characters_is_acked_failed_and_never_applied(relay, lich):
    r = relay()
    r.wait_hello()
    seen = r.autoanswer()
    assert lich.wait_polled("s1", WAIT, parked=True)
    long_id = "x" * 2000
    lich.faults.deliver({"id": long_id, "kind": "prompt", "text": "not to be run"})
    ack = lich.record.ack_for(long_id, WAIT)
    assert (ack["ok"], ack["kind"], ack["error"]) == (False, "prompt", "the id is over 1,024 characters; such a command is not applied")
    assert seen.calls == []


def test_an_id_whose_ack_cannot_fit_is_dropped_with_a_line_and_the_daemon_goes_on(relay, lich, run_dir):
    r = relay()
    r.wait_hello()
    assert lich.wait_polled("s1", WAIT, parked=True)
    long_id = "y" * 100_000
    lich.faults.deliver({"id": long_id, "kind": "abort"}, {"id": "m2", "kind": "rewind"})
    assert lich.record.ack_for("m2", WAIT)["error"] == "unknown kind"  # acked in order, after the long one
    assert all(ack.id != long_id for ack in lich.record.acks)
    assert r.proc.poll() is None
    r.stop()
    with open(os.path.join(run_dir, "s1.log")) as f:
        lines = [line for line in f if "dropped the ack for" in line]
    assert len(lines) == 1 and "yyyy" in lines[0]
