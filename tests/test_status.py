"""The status document's ages and durations, on a frozen clock: each is read
from the clock at the moment it describes, and reported as an age."""
from freezegun import freeze_time

from lich_control import CONTRACT_RELEASE, __version__
from lich_control.bridge import Overrides, Turns
from lich_control.status import Activity


def test_ages_and_durations_follow_the_clock():
    with freeze_time("2026-11-30 12:00:00") as clock:
        activity = Activity("s1", "relay", Turns(), files={"socket": "/r/s1.sock"})
        clock.tick(2)
        activity.poll_sent()
        activity.received("m1", "prompt")
        activity.waiting("m1", "session")
        clock.tick(0.25)
        activity.poll_answered(1)
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
