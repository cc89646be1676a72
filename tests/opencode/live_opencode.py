"""lich drives a real, interactive opencode session through the same daemon.

One opencode (the pinned one, under a pseudo-terminal, in a throwaway home,
against a fake OpenAI-compatible model API) serves checks 1 to 8 in order;
8 ends it with /exit; 9 runs `opencode run` inside lich; 10 starts a second
session with no `python` option, which builds the daemon's environment; 11
looks for the token everywhere the run left something. Everything is driven
from lich's side (`lich-stub control` / `ask`) and observed on the model
API's side, in lich's acks, in `lich-mod-status --json` and in opencode's
own database.
"""
import json
import os

import pytest

from opencode_world import World, opencode_binary
from devlich import Unavailable
from processes import argv_of, pid_ended

SESSION = "oc-live"
RUN_SESSION = "oc-run"
ENV_SESSION = "oc-env"
# A first session builds the daemon's environment: python3 -m venv, and pip
# fetching the package's dependencies from the index.
SETUP_WAIT = 180.0
# Well above what each step takes on a loaded 2-core machine (opencode's
# first turn in a session takes some seconds), short enough that a broken
# run still ends in minutes.
WAIT = 30.0


@pytest.fixture(scope="module")
def opencode():
    """The pinned opencode's binary. Without it the live test fails: a check
    that cannot run is a failed check, never a skip."""
    try:
        return opencode_binary()
    except Unavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def world(opencode):
    # A project command of the work folder: when it runs, the model API sees its text.
    with World(opencode) as world:
        world.ws.write_file("work/.opencode/commands/word.md", "---\ndescription: say a word\n---\nPlease say the word $ARGUMENTS\n")
        yield world


@pytest.fixture(scope="module")
def session(world):
    session = world.session(SESSION)
    session.wait_polling()
    return session


def send(world, kind, *args):
    return world.lich.control(SESSION, kind, *args, timeout=WAIT)


def assert_ok(outcome):
    assert outcome.get("ok") is True, f"lich got no ok ack: {outcome}"


def assert_refused(outcome, error):
    assert outcome.get("ok") is False and outcome["ack"]["error"] == error, outcome


def turn_request(world, marker, after_tool=False):
    """The model request of the turn whose prompt holds `marker` (its second,
    after the tool, with `after_tool`)."""
    return world.api.wait_for(lambda r: not r.is_title and marker in r.last_user and r.after_tool == after_tool,
                              WAIT, f"a request for {marker}{' after the tool' if after_tool else ''}")


def prompt(world, session, marker):
    """A prompt from lich, acked ok; its model request, once the turn is over."""
    assert_ok(send(world, "prompt", f"a prompt {marker}"))
    request = turn_request(world, marker)
    session.wait_idle(WAIT)
    return request


# --- 1 ----------------------------------------------------------------------

def test_1_the_plugin_loads_in_the_tui_and_its_daemon_polls(world, session):
    status = session.wait_polling()
    assert status["daemon"]["host"] == "opencode"
    assert status["daemon"]["engine"] == "relay"
    assert status["daemon"]["session_id"] == SESSION
    assert status["poll"]["failures"] == 0


# --- 2 ----------------------------------------------------------------------

def test_2_a_first_prompt_gets_a_session_of_its_own_and_reaches_the_model(world, session):
    assert world.oc.sessions() == []
    request = prompt(world, session, "[oc-2]")
    assert request.model == "m1" and request.tools, request
    assert len(world.oc.sessions()) == 1


# --- 3 ----------------------------------------------------------------------

def test_3_a_model_override_applies_from_the_next_prompt_and_not_to_the_running_turn(world, session):
    assert_ok(send(world, "prompt", "a turn with a tool [tool] [oc-3a]"))
    first = turn_request(world, "[oc-3a]")
    assert_ok(send(world, "model", "fake/m2"))
    world.api.release()
    # The turn that was running keeps its model: no hook can change it.
    assert turn_request(world, "[oc-3a]", after_tool=True).model == "m1"
    assert first.model == "m1"
    session.wait_idle(WAIT)
    assert prompt(world, session, "[oc-3b]").model == "m2"
    assert_ok(send(world, "model"))
    assert prompt(world, session, "[oc-3c]").model == "m1"


def test_3_a_model_opencode_does_not_have_is_refused_and_changes_nothing(world, session):
    before = session.status()["overrides"]
    outcome = send(world, "model", "fake/m9")
    assert_refused(outcome, "opencode has no model fake/m9 (name it as provider/model; `opencode models` lists them)")
    assert session.status()["overrides"] == before


# --- 4 ----------------------------------------------------------------------

def test_4_an_effort_override_reaches_every_request_mid_turn_included(world, session):
    assert_ok(send(world, "prompt", "a turn with a tool [tool] [oc-4a]"))
    assert turn_request(world, "[oc-4a]").reasoning_effort is None
    assert_ok(send(world, "effort", "high"))
    world.api.release()
    assert turn_request(world, "[oc-4a]", after_tool=True).reasoning_effort == "high"
    session.wait_idle(WAIT)
    assert prompt(world, session, "[oc-4b]").reasoning_effort == "high"
    assert_ok(send(world, "effort"))
    assert prompt(world, session, "[oc-4c]").reasoning_effort is None


def test_4_an_effort_the_model_has_no_variant_for_is_refused(world, session):
    assert_ok(send(world, "model", "fake/m1"))
    outcome = send(world, "effort", "max")
    assert_refused(outcome, "fake/m1 has no max effort in opencode (its levels: low, medium, high)")
    assert_ok(send(world, "model"))


# --- 5 ----------------------------------------------------------------------

def test_5_a_command_runs_in_the_session_and_acks_ok(world, session):
    assert_ok(send(world, "command", "word", "apple"))
    assert turn_request(world, "Please say the word apple")
    session.wait_idle(WAIT)


def test_5_a_command_only_the_tui_has_is_refused_naming_those_there_are(world, session):
    outcome = send(world, "command", "compact")
    assert outcome["ok"] is False, outcome
    assert outcome["ack"]["error"].startswith("opencode has no command /compact that its API can run (it has: "), outcome
    assert "word" in outcome["ack"]["error"]


# --- 6 ----------------------------------------------------------------------

def test_6_an_abort_ends_a_streaming_turn_and_acks_ok(world, session):
    assert_ok(send(world, "prompt", "a long turn [hold] [oc-6]"))
    held = turn_request(world, "[oc-6]")
    session.wait_status(lambda s: s["turn"] is not None, WAIT, "the turn to start")
    assert_ok(send(world, "abort"))
    assert held.closed.wait(WAIT), "the model API never saw the stream closed"
    session.wait_idle(WAIT)
    assert_refused(send(world, "abort"), "no turn is running")


# --- 7 ----------------------------------------------------------------------

def test_7_an_ask_is_answered_by_a_fork_that_is_deleted_and_the_turn_goes_on(world, session):
    before = world.oc.sessions()
    assert_ok(send(world, "prompt", "a long turn [hold] [oc-7]"))
    held = turn_request(world, "[oc-7]")
    outcome = world.lich.ask(SESSION, "what is the plan? [oc-7q]", timeout=WAIT)
    assert_ok(outcome)
    assert "Question: what is the plan? [oc-7q]" in outcome["ack"]["answer"]
    fork = world.api.wait_for(lambda r: "[oc-7q]" in r.last_user, WAIT, "the fork's request")
    assert fork.tools == [], f"the fork was offered tools: {fork.tools}"
    assert not held.closed.is_set() and not held.answered.is_set(), "the ask disturbed the running turn"
    assert world.oc.sessions() == before, "the fork was not deleted"
    world.api.release()
    assert held.answered.wait(WAIT)
    session.wait_idle(WAIT)
    after = prompt(world, session, "[oc-7b]")
    assert "[oc-7q]" not in str(after.messages), "the ask reached the session's conversation"


# --- 8 ----------------------------------------------------------------------

def test_8_after_exit_the_daemon_is_gone_and_its_socket_removed(world, session):
    daemon = session.status()["daemon"]
    assert session.exit() == 0
    assert pid_ended(daemon["pid"], WAIT), f"the daemon (pid {daemon['pid']}) still runs"
    assert not os.path.exists(daemon["socket"])
    assert session.status() is None


# --- 9 ----------------------------------------------------------------------

def test_9_opencode_run_inside_lich_starts_no_daemon(world):
    done = world.run("a run of its own [oc-9]", RUN_SESSION)
    assert done.returncode == 0, done.stderr[-2000:]
    assert turn_request(world, "[oc-9]")
    # A daemon makes its lock and log in the run folder at its start.
    assert not [name for name in os.listdir(world.ws.run_dir) if name.startswith(RUN_SESSION)]


# --- 10 ---------------------------------------------------------------------

def test_10_with_no_python_option_the_first_session_builds_the_daemons_environment(world):
    world.oc.install(world.api, python_option=False)
    session = world.session(ENV_SESSION)
    status = session.wait_polling(timeout=SETUP_WAIT)
    interpreter = argv_of(status["daemon"]["pid"])[0]
    assert interpreter.startswith(os.path.join(world.oc.runtime_dir, "env-")), interpreter
    outcome = world.lich.control(ENV_SESSION, "prompt", "a prompt [oc-10]", timeout=WAIT)
    assert_ok(outcome)
    assert turn_request(world, "[oc-10]")
    assert session.exit() == 0


# --- 11 ---------------------------------------------------------------------

def test_11_the_token_appears_nowhere(world):
    token = world.lich.token
    ws = world.ws
    # opencode's database and logs, the daemons' logs, the private environment.
    folders = ws.left_by_the_run()
    assert ws.home in folders and ws.run_dir in folders
    assert os.path.getsize(os.path.join(ws.run_dir, f"{SESSION}.log")) > 0
    assert ws.files_holding(token, folders) == []
    seen = world.watch.seen
    assert [p for p in seen if "lich_control.daemon" in p.argv], "the watch saw no daemon"
    assert [p for p in seen if any(token in arg for arg in p.argv)] == []
    assert not any(token in json.dumps(r.body) for r in world.api.requests)
