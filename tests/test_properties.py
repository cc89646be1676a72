"""Whatever lich sends, the daemon keeps running and every item with an id
gets exactly one ack (hypothesis): in-process over many examples, and over
the real daemon, bridge and loopback HTTP over fewer."""
import collections
import itertools
import json

import pytest
import responses
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lich_control.acker import Acker
from lich_control.activity import Activity
from lich_control.asks import Asks
from lich_control.batch import MAX_ITEMS, NotAnArray, read_answer
from lich_control.commands import EFFORTS, KINDS
from lich_control.config import Config
from lich_control.engine import CallResult, Turns, resolved
from lich_control.lich import LichClient
from lich_control.poller import Poller
from lich_control.worker import Worker

from fakes import ScriptedClient

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
ids = st.text(max_size=12) | json_values
fields = json_values | st.sampled_from(EFFORTS) | st.text(max_size=20)
command_like = st.fixed_dictionaries(
    {"id": ids, "kind": st.sampled_from(KINDS + ("rewind", "")) | json_values},
    optional={name: fields for name in ("text", "notification", "model", "effort", "name", "args", "question")},
)
notifications = st.fixed_dictionaries({"status": st.text(max_size=8), "summary": st.text(max_size=8)})
prompts_with_notes = st.fixed_dictionaries({"id": st.text(min_size=1, max_size=8), "kind": st.just("prompt"), "text": st.text(), "notification": notifications | json_values})
items = command_like | prompts_with_notes | json_values
batches = st.lists(items, max_size=8)


def expected_ids(batch):
    """The ids that must each get one ack: first sightings of usable ids (of any length)."""
    seen = []
    for item in batch:
        if isinstance(item, dict) and isinstance(item.get("id"), str) and item["id"]:
            if item["id"] not in seen:
                seen.append(item["id"])
    return seen


class AutoEngine:
    """A session that answers every call at once, sometimes with a refusal."""

    name = "auto"

    def __init__(self, turns):
        self.turns = turns
        self.n = itertools.count()

    def submit_prompt(self, text, as_user=False):
        if next(self.n) % 3 == 0:
            return resolved(CallResult.answered({"drop": "dropped"}))
        self.turns.started("t1")
        return resolved(CallResult.answered({"text": text}))

    def abort_turn(self, turn_id):
        return resolved(CallResult.answered(None))

    def run_command(self, name, args):
        return resolved(CallResult.failed("no such command") if next(self.n) % 2 else CallResult.answered({}))

    def fork(self, prompt):
        return resolved(CallResult.answered({"isAnswered": True, "text": prompt[-30:] * 700}))

    def set_overrides(self, overrides):
        return resolved(CallResult.answered(None))


class Rig:
    def __init__(self):
        self.client = ScriptedClient()
        turns = Turns()
        self.activity = Activity("s1", "auto", turns)
        factory = lambda: self.client  # noqa: E731
        engine = AutoEngine(turns)
        self.acker = Acker(factory, self.activity)
        self.worker = Worker(engine, turns, self.acker, factory, self.activity, "s1")
        self.asks = Asks(engine, factory, self.activity, "s1", size=4)
        self.acker.start()
        self.worker.start()


@pytest.fixture(scope="module")
def rig():
    r = Rig()
    yield r
    r.asks.stop()
    r.worker.stop(5)
    r.acker.stop(5)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=batches)
def test_every_item_with_an_id_gets_exactly_one_ack_in_process(rig, batch):
    with rig.client.cond:
        rig.client.acks.clear()
    poller = Poller(ScriptedClient([batch]), rig.worker.submit, rig.asks.submit, rig.activity, wait=lambda d: False)
    assert poller.poll_once() is True
    wanted = expected_ids(batch)
    acks = rig.client.wait_acks(len(wanted))
    # A barrier behind everything ordered; asks were already answered.
    poller_2 = Poller(ScriptedClient([[{"id": "~barrier", "kind": "~"}]]), rig.worker.submit, rig.asks.submit, rig.activity, wait=lambda d: False)
    poller_2.poll_once()
    acks = rig.client.wait_acks(len(wanted) + 1)
    got = collections.Counter(a.id for a in acks if a.id != "~barrier")
    assert got == collections.Counter(wanted)
    for ack in acks:
        assert len(ack.body()) < 64 * 1024
        assert (ack.answer is None) or (ack.kind == "ask" and ack.ok)
    assert rig.worker._thread.is_alive() and rig.acker._thread.is_alive()


def nested(depth):
    return b"[" * depth + b"]" * depth


# Shapes a parser or a decoder raises on, beside plain bad bytes and JSON.
hostile = st.one_of(
    st.integers(1, 200_000).map(nested),  # deep enough to raise RecursionError past ~1,000
    st.integers(1, 200_000).map(lambda n: b"[" * n),  # deep and unclosed
    st.binary(max_size=40).map(lambda b: b'[{"id": "' + b + b'"}]'),  # invalid UTF-8 inside a string
    st.sampled_from([rb'["\ud800"]', rb'[{"id": "\udfff", "kind": "abort"}]', b'["\xed\xa0\x80"]']),  # lone surrogates
    st.integers(4000, 60_000).map(lambda n: b"[" + b"7" * n + b"]"),  # integers past the digit limit
    st.sampled_from([b"[1e999999]", b"[-1e999999, NaN, Infinity]"]),
    st.sampled_from([b'[{"id": "a", "id": "b", "kind": "abort", "kind": "model"}]']),  # duplicate keys
)
bodies = st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()) | hostile


def standard_read(body):
    """The oracle: the body as Python's own parser reads it whole (with no
    digit limit), or None where it refuses it."""
    try:
        return json.loads(body, parse_int=lambda digits: int(digits) if len(digits.lstrip("-")) <= 4300 else float(digits))
    except (ValueError, RecursionError):
        return None


@settings(max_examples=300, deadline=None)
@given(body=bodies, status=st.sampled_from([200, 200, 200, 201, 204, 302, 400, 500, 503]))
def test_a_poll_answer_is_commands_or_one_failed_poll_never_a_crash(body, status):
    # (A 404, which ends polling whatever its body, is test_poller.py's.)
    waits = []
    activity = Activity("s1", "prop", Turns())
    ordered, asks = [], []
    client = LichClient(Config(port=4312, token="tok", session_id="s1", run_dir="/tmp/x"))
    poller = Poller(client, ordered.append, asks.append, activity, wait=lambda d: waits.append(d) or False)
    with responses.RequestsMock() as mocked:
        mocked.get("http://127.0.0.1:4312/mod/commands", body=body, status=status)
        going_on = poller.poll_once()
    items = standard_read(body)
    poll = activity.snapshot()["poll"]
    assert going_on is True
    if status == 200 and isinstance(items, list):
        # Whatever the parser reads whole, the poller reads: each usable id handed on once.
        assert waits == [] and poll["failures"] == 0
        assert len(ordered) + len(asks) == len(expected_ids(items))
    elif status != 200:
        # One failed poll: backed off once, and polling goes on.
        assert waits == [1.0] and poll["failures"] == 1
        assert ordered == [] and asks == []
    else:
        # What the parser refuses whole: an item nested too deep is skipped
        # alone, bad JSON after some items is a failed poll after them.
        assert waits in ([], [1.0]) and poll["failures"] == len(waits)


@settings(max_examples=300, deadline=None)
@given(body=bodies)
def test_the_answer_reader_reads_what_the_standard_parser_reads(body):
    items = standard_read(body)
    try:
        answer = read_answer(body)
        read = list(answer)
    except NotAnArray:
        assert not isinstance(items, list)
        return
    if isinstance(items, list) and len(items) <= MAX_ITEMS:
        assert repr(read) == repr(items)  # repr: NaN is not equal to itself
        assert not answer.broken and answer.ended is None and not answer.skipped


@settings(max_examples=200, deadline=None)
@given(batch=st.lists(json_values, max_size=8), cut=st.integers(0, 400))
def test_an_answer_cut_short_yields_the_items_before_the_cut(batch, cut):
    body = json.dumps(batch).encode()
    cut = min(cut, len(body) - 1)  # cut short: never the whole answer
    try:
        answer = read_answer(body[:cut])
    except NotAnArray:
        assert cut == 0
        return
    read = list(answer)
    assert answer.broken and len(read) <= len(batch)
    if read and isinstance(read[-1], (int, float)) and isinstance(batch[len(read) - 1], (int, float)):
        read.pop()  # a number cut short is still a number ("0.5" cut to "0"): never a command
    assert repr(read) == repr(batch[: len(read)])


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from lich_dev.lich import StubLich
    from relay import Relay

    lich = StubLich().start()
    relay = Relay({"LICH_PORT": str(lich.port), "LICH_TOKEN": lich.token, "LICH_SESSION_ID": "prop", "LICH_CONTROL_RUN_DIR": str(tmp_path_factory.mktemp("prop"))})
    relay.wait_hello()
    relay.autoanswer()
    assert lich.wait_polled("prop", 10, parked=True)
    yield lich, relay
    relay.stop()
    lich.close()


counter = itertools.count()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=batches)
def test_every_item_with_an_id_gets_exactly_one_ack_from_the_real_daemon(live, batch):
    lich, relay = live
    # Each example's ids are its own, so acks of earlier examples cannot pass for them.
    n = next(counter)
    batch = [dict(item, id=f"{n}-{item['id']}") if isinstance(item, dict) and isinstance(item.get("id"), str) and item["id"] else item for item in batch]
    wanted = expected_ids(batch)
    before = len(lich.record.acks)
    # As they are, whatever lich itself would refuse; the barrier, of a kind
    # nobody knows, is acked (and refused by lich) behind everything ordered.
    lich.faults.deliver(*batch, {"id": f"{n}-~barrier", "kind": "~"})
    acks = lich.record.wait_acks(before + len(wanted) + 1)[before:]
    got = collections.Counter(a.id for a in acks if a.id != f"{n}-~barrier")
    assert got == collections.Counter(wanted)
    assert relay.proc.poll() is None
