"""lich drives a real, interactive opencode session through the same daemon.

One opencode (the pinned one, under a pseudo-terminal, in a throwaway home,
against a fake OpenAI-compatible model API) serves checks 1 to 9 in order;
9 ends it with /exit; 10 runs `opencode run` inside lich; 11 starts a second
session with no `python` option, which builds the daemon's environment; 12
looks for the token everywhere the run left something. Everything is driven
from lich's side (`lich-stub control` / `ask`) and observed on the model
API's side, on the screen the person sees, in lich's acks, in
`lich-mod-status --json` and in opencode's own database.

Checks 2 and 3 are what lich sends an opencode session today: prompts (a
`lich send` task, a results-ready note, a scheduled prompt) and a worker's
notification, the first of them the moment the daemon first polls. lich
refuses `lich control` and `lich ask` for any session but Claude Code's, so
checks 4 to 8 (model, effort, command, abort, ask) hold the relay to the
contract for a lich that lifts that limit.
"""
import json
import os
import time

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

def test_2_a_first_prompt_at_the_first_poll_gets_a_session_of_its_own_shown_on_the_screen(world, session):
    # Sent the moment the daemon first polls (the session fixture waited for
    # it): the earliest lich hands a prompt to a relay rather than typing it,
    # and soon after opencode started, while its screen may still be starting.
    sent_after = time.monotonic() - session.started
    assert world.oc.sessions() == []
    text = "a task relayed by the lich command line [oc-2]"
    assert_ok(send(world, "prompt", text))
    request = turn_request(world, "[oc-2]")
    assert request.model == "m1" and request.tools, request
    assert len(world.oc.sessions()) == 1
    # What the person sees: the TUI switched to lich's session and shows the prompt.
    session.wait_for_screen(text, WAIT)
    session.wait_idle(WAIT)
    print(f"the first prompt went {sent_after:.1f} s after opencode started")


# --- 3 ----------------------------------------------------------------------

def test_3_a_notification_reaches_the_model_as_a_task_notification_and_shows(world, session):
    outcome = send(world, "prompt", "Its report: the docs build [oc-3] && passes", "--notify", "completed", "session docs finished")
    assert_ok(outcome)
    request = turn_request(world, "[oc-3]")
    assert request.last_user.startswith("<task-notification>\n<status>completed</status>\n<summary>session docs finished</summary>\n"), request.last_user
    # The text as written: the model reads && as &&.
    assert "<result>Its report: the docs build [oc-3] && passes</result>" in request.last_user, request.last_user
    session.wait_for_screen("the docs build [oc-3]", WAIT)
    session.wait_idle(WAIT)


# --- 4 ----------------------------------------------------------------------

def test_4_a_model_override_applies_from_the_next_prompt_and_not_to_the_running_turn(world, session):
    assert_ok(send(world, "prompt", "a turn with a tool [tool] [oc-4a]"))
    first = turn_request(world, "[oc-4a]")
    assert_ok(send(world, "model", "fake/m2"))
    world.api.release()
    # The turn that was running keeps its model: no hook can change it.
    assert turn_request(world, "[oc-4a]", after_tool=True).model == "m1"
    assert first.model == "m1"
    session.wait_idle(WAIT)
    assert prompt(world, session, "[oc-4b]").model == "m2"
    assert_ok(send(world, "model"))
    assert prompt(world, session, "[oc-4c]").model == "m1"


def test_4_a_model_opencode_does_not_have_is_refused_and_changes_nothing(world, session):
    before = session.status()["overrides"]
    outcome = send(world, "model", "fake/m9")
    assert_refused(outcome, "opencode has no model fake/m9 (name it as provider/model; `opencode models` lists them)")
    assert session.status()["overrides"] == before


# --- 5 ----------------------------------------------------------------------

def test_5_an_effort_override_reaches_every_request_mid_turn_included(world, session):
    assert_ok(send(world, "prompt", "a turn with a tool [tool] [oc-5a]"))
    assert turn_request(world, "[oc-5a]").reasoning_effort is None
    assert_ok(send(world, "effort", "high"))
    world.api.release()
    assert turn_request(world, "[oc-5a]", after_tool=True).reasoning_effort == "high"
    session.wait_idle(WAIT)
    assert prompt(world, session, "[oc-5b]").reasoning_effort == "high"
    assert_ok(send(world, "effort"))
    assert prompt(world, session, "[oc-5c]").reasoning_effort is None


def test_5_an_effort_the_model_has_no_variant_for_is_refused(world, session):
    assert_ok(send(world, "model", "fake/m1"))
    outcome = send(world, "effort", "max")
    assert_refused(outcome, "fake/m1 has no max effort in opencode (its levels: low, medium, high)")
    assert_ok(send(world, "model"))


# --- 6 ----------------------------------------------------------------------

def test_6_a_command_runs_in_the_session_and_acks_ok(world, session):
    assert_ok(send(world, "command", "word", "apple"))
    assert turn_request(world, "Please say the word apple")
    session.wait_idle(WAIT)


def test_6_a_command_only_the_tui_has_is_refused_naming_those_there_are(world, session):
    outcome = send(world, "command", "compact")
    assert outcome["ok"] is False, outcome
    assert outcome["ack"]["error"].startswith("opencode has no command /compact that its API can run (it has: "), outcome
    assert "word" in outcome["ack"]["error"]


# --- 7 ----------------------------------------------------------------------

def test_7_an_abort_ends_a_streaming_turn_and_acks_ok(world, session):
    assert_ok(send(world, "prompt", "a long turn [hold] [oc-7]"))
    held = turn_request(world, "[oc-7]")
    session.wait_status(lambda s: s["turn"] is not None, WAIT, "the turn to start")
    assert_ok(send(world, "abort"))
    assert held.closed.wait(WAIT), "the model API never saw the stream closed"
    session.wait_idle(WAIT)
    assert_refused(send(world, "abort"), "no turn is running")


# --- 8 ----------------------------------------------------------------------

def test_8_an_ask_is_answered_by_a_fork_that_is_deleted_and_the_turn_goes_on(world, session):
    before = world.oc.sessions()
    assert_ok(send(world, "prompt", "a long turn [hold] [oc-8]"))
    held = turn_request(world, "[oc-8]")
    outcome = world.lich.ask(SESSION, "what is the plan? [oc-8q]", timeout=WAIT)
    assert_ok(outcome)
    assert "Question: what is the plan? [oc-8q]" in outcome["ack"]["answer"]
    fork = world.api.wait_for(lambda r: "[oc-8q]" in r.last_user, WAIT, "the fork's request")
    assert fork.tools == [], f"the fork was offered tools: {fork.tools}"
    assert not held.closed.is_set() and not held.answered.is_set(), "the ask disturbed the running turn"
    assert world.oc.sessions() == before, "the fork was not deleted"
    world.api.release()
    assert held.answered.wait(WAIT)
    session.wait_idle(WAIT)
    after = prompt(world, session, "[oc-8b]")
    assert "[oc-8q]" not in str(after.messages), "the ask reached the session's conversation"


# --- 9 ----------------------------------------------------------------------

def test_9_after_exit_the_daemon_is_gone_and_its_socket_removed(world, session):
    daemon = session.status()["daemon"]
    assert session.exit() == 0
    assert pid_ended(daemon["pid"], WAIT), f"the daemon (pid {daemon['pid']}) still runs"
    assert not os.path.exists(daemon["socket"])
    assert session.status() is None


# --- 10 ----------------------------------------------------------------------

def test_10_opencode_run_inside_lich_starts_no_daemon(world):
    done = world.run("a run of its own [oc-10]", RUN_SESSION)
    assert done.returncode == 0, done.stderr[-2000:]
    assert turn_request(world, "[oc-10]")
    # A daemon makes its lock and log in the run folder at its start.
    assert not [name for name in os.listdir(world.ws.run_dir) if name.startswith(RUN_SESSION)]


# --- 11 ---------------------------------------------------------------------

def test_11_with_no_python_option_the_first_session_builds_the_daemons_environment(world):
    world.oc.install(world.api, python_option=False)
    session = world.session(ENV_SESSION)
    status = session.wait_polling(timeout=SETUP_WAIT)
    interpreter = argv_of(status["daemon"]["pid"])[0]
    assert interpreter.startswith(os.path.join(world.oc.runtime_dir, "env-")), interpreter
    outcome = world.lich.control(ENV_SESSION, "prompt", "a prompt [oc-11]", timeout=WAIT)
    assert_ok(outcome)
    assert turn_request(world, "[oc-11]")
    assert session.exit() == 0


# --- 12 ---------------------------------------------------------------------

def test_12_the_token_appears_nowhere(world):
    token = world.lich.token
    ws = world.ws
    # opencode's database and logs, the daemons' logs, the private environment.
    folders = ws.left_by_the_run()
    assert ws.home in folders and ws.run_dir in folders
    assert os.path.getsize(os.path.join(ws.run_dir, f"{SESSION}.log")) > 0
    assert ws.files_holding(token, folders) == []
    seen = world.watch.seen
    assert [p for p in seen if "lich_control" in p.argv], "the watch saw no daemon"
    assert [p for p in seen if any(token in arg for arg in p.argv)] == []
    assert not any(token in json.dumps(r.body) for r in world.api.requests)
