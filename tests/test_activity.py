"""The status document (Activity): ages on a frozen clock, every string
from outside cleaned once as it enters (the token out, escaped, cut), and
its size bounded."""
import json
from urllib.parse import quote

from freezegun import freeze_time

from lich_control import CONTRACT_RELEASE, __version__
from lich_control.activity import Activity
from lich_control.bridge import Overrides, Turns
from lich_control.logs import Redactor

TOKEN = "tok/en+with&odd=chars"
QUOTED = quote(TOKEN, safe="")


def strings(value):
    """Every string in a JSON-like document, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def test_ages_and_durations_follow_the_clock():
    with freeze_time("2026-11-30 12:00:00") as clock:
        activity = Activity("s1", "relay", Turns(), files={"socket": "/r/s1.sock"})
        clock.tick(2)
        activity.poll_sent()
        activity.received("m1", "prompt")
        activity.waiting("m1", "session")
        clock.tick(0.25)
        activity.poll_answered()
        activity.received("m2", "abort")
        clock.tick(1.5)
        activity.acked("m2", "abort", False, "no turn is running", sent=None)
        activity.error("skipped an item with no id")
        clock.tick(10)
        doc = activity.snapshot()
    assert doc["daemon"]["uptime_s"] == 13.8
    assert doc["daemon"]["started_at"] == 1796040000.0  # wall time, for people: the only clock reading
    assert (doc["poll"]["last_poll_age_s"], doc["poll"]["last_answer_age_s"]) == (11.8, 11.5)
    assert doc["in_flight"] == [{"id": "m1", "kind": "prompt", "waiting_on": "session", "age_s": 11.8}]
    (recent,) = doc["recent"]
    assert (recent["took_ms"], recent["age_s"], recent["ack"]) == (1500.0, 10.0, "sent")
    assert doc["errors"] == [{"what": "skipped an item with no id", "age_s": 10.0}]


def test_the_document_names_the_package_version_and_the_contract_release():
    doc = Activity("s1", "sim", Turns()).snapshot()
    assert (doc["daemon"]["version"], doc["daemon"]["contract_release"]) == (__version__, CONTRACT_RELEASE)
    assert doc["poll"]["state"] == "starting"


def test_overrides_and_the_running_turn_are_shown_as_set():
    turns = Turns()
    activity = Activity("s1", "sim", turns)
    turns.started("t3")
    activity.set_overrides(Overrides(model="claude-opus-4-1"))
    doc = activity.snapshot()
    assert doc["turn"] == "t3" and doc["overrides"] == {"model": "claude-opus-4-1", "effort": None}


def test_no_text_given_to_activity_brings_the_token_into_the_document():
    said = f"lich said: GET /mod/acks?token={QUOTED} (raw {TOKEN})"
    a = Activity("s1", "relay", Turns(), redactor=Redactor(TOKEN))
    a.poll_failed(said, 1.0)
    a.received(f"m{TOKEN}", f"kind{QUOTED}")
    a.received("m2", "prompt")
    a.waiting("m2", said)
    a.acked(f"m{TOKEN}", f"kind{QUOTED}", False, said, sent=said)
    a.error(said)
    a.set_overrides(Overrides(model=said, effort=said))
    doc = json.dumps(a.snapshot(), ensure_ascii=False)
    a.poll_stopped(said)
    doc += json.dumps(a.snapshot(), ensure_ascii=False)
    assert TOKEN not in doc and QUOTED not in doc
    assert "token=[token] (raw [token])" in doc


# -- bounded --------------------------------------------------------------------


def test_a_15_mb_id_kind_and_error_are_cut_as_they_enter():
    huge = "k" * 15_000_000
    a = Activity("s1", "relay", Turns())
    a.received(huge, huge)
    a.received("m2", huge)
    a.acked(huge, huge, False, huge, sent=huge)
    a.poll_failed(huge, 1.0)
    a.error(huge)
    doc = a.snapshot()
    assert len(json.dumps(doc)) < 20_000
    (entry,) = doc["in_flight"]
    assert entry["kind"] == "k" * 199 + "…"
    assert doc["recent"][0]["id"] == "k" * 199 + "…" and doc["recent"][0]["error"] == "k" * 399 + "…"


def test_in_flight_shows_the_oldest_50_and_how_many_more():
    a = Activity("s1", "relay", Turns())
    for n in range(1_000):
        a.received(f"m{n}", "prompt")
    doc = a.snapshot()
    assert [e["id"] for e in doc["in_flight"]] == [f"m{n}" for n in range(50)]
    assert doc["in_flight_more"] == 950


# -- escaped --------------------------------------------------------------------


def test_control_invisible_and_bidirectional_characters_and_lone_surrogates_are_escaped_in_the_document():
    nasty = "m\udc80\n2026-12-01 INFO forged\x1b[31m\r\u2028\u202e\u200b\ufeff"
    a = Activity("s1", "relay", Turns())
    a.received(nasty, nasty)
    a.acked(nasty, nasty, False, nasty, sent=nasty)
    a.received(nasty, nasty)
    a.error(nasty)
    doc = a.snapshot()
    json.dumps(doc, ensure_ascii=False).encode("utf-8")  # strict: no lone surrogate left
    for text in strings(doc):
        assert text.isprintable() or text == "", repr(text)
    assert doc["recent"][0]["id"] == "m\\udc80\\n2026-12-01 INFO forged\\x1b[31m\\r\\u2028\\u202e\\u200b\\ufeff"


