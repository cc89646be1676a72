"""lich drives a real, interactive Claude Code session: the nine checks, on
each release releases.py lists (the session fixture `session_release`).

One session serves checks 1 to 7, in order (7 ends it); 8 runs `claude -p`;
then the same check 3 runs against a copy of the plugin whose relay lost its
`turn.step` override, and must fail; 9 looks for the token everywhere the
run left something. Everything is driven from lich's side (`lich-stub
control` / `ask`) and observed on the model API's side, in lich's acks, in
`lich-mod-status --json` and in Claude Code's debug log.

The tests are the steps of one scenario, in file order: run the module whole.
"""
import json
import os
import signal

import pytest

from devlich import mod_status, python
from claude_world import World
from modelapi import ANSWER_PREFIX
from processes import pid_ended
from terminal import ESC
from workspace import CHECKOUT, PLUGIN_NAME

SESSION = "live-1"
PRINT_SESSION = "live-print"
MUTANT_SESSION = "live-mutant"
OTHER_MODEL = "claude-haiku-4-5-20251001"
CUSTOM_COMMAND = "livecmd"
# Well above what each step takes on a loaded 2-core machine (under a
# second), and short enough that a broken run still ends in minutes.
WAIT = 15.0
# The python option's row in /config, as the menu draws it: the field's
# title, then the plugin's name.
with open(os.path.join(CHECKOUT, ".claude-plugin", "plugin.json")) as manifest:
    PYTHON_ROW = f"{json.load(manifest)['userConfig']['python']['title']} · {PLUGIN_NAME}"


@pytest.fixture(scope="module")
def world(session_release):
    with World(session_release.binary, claude_env=session_release.env) as world:
        world.release = session_release
        furnish(world)
        yield world


def furnish(world):
    """The world's plugin (a copy of the checkout), and a project command of
    the work folder whose text the model API sees when it runs."""
    world.plugin = world.ws.copy_checkout()
    world.ws.write_file(f"work/.claude/commands/{CUSTOM_COMMAND}.md", "The custom command ran with $ARGUMENTS\n")


@pytest.fixture(scope="module")
def session(world):
    # Check 4's subagent runs inside its turn, and unasked: Claude Code runs
    # a subagent in the background unless background tasks are off (2.1.280,
    # 2.1.296 and 2.1.299 measured), and in auto mode, 2.1.296's default,
    # asks a classifier first, which here stops at a dialog; the default
    # mode runs the subagent tool at once.
    world.ws.write_settings({"permissions": {"defaultMode": "default"}})
    session = world.session(SESSION, plugin_dir=world.plugin, env={"CLAUDE_CODE_DISABLE_BACKGROUND_TASKS": "1"})
    session.wait_polling(timeout=30)
    return session


def send(world, session, kind, *args, timeout=WAIT):
    return world.lich.control(session.session_id, kind, *args, timeout=timeout)


def assert_acked_ok(outcome):
    assert outcome.get("ok") is True, f"lich got no ok ack: {outcome}"


def main_request(world, marker):
    """The request of the turn whose prompt holds `marker`."""
    return world.api.wait_for(lambda r: r.is_message and marker in r.last_user_text, WAIT, f"request with {marker}")


def prompt_request(world, session, text):
    """Send a prompt from lich; the model request of its turn, once it is over."""
    assert_acked_ok(send(world, session, "prompt", text))
    request = main_request(world, text)
    session.wait_idle(WAIT)
    return request


def effort_of(request):
    effort = (request.body.get("output_config") or {}).get("effort")
    assert effort, f"request {request.seq} ({request.model}) carries no effort: pick a session model that takes one"
    return effort


# --- 1 ----------------------------------------------------------------------

def test_1_the_module_loads_and_the_daemon_polls(world, session):
    loaded = session.wait_debug(f"hooks module {PLUGIN_NAME}@")
    assert "loaded" in loaded and "turn.step" in loaded, loaded
    status = session.wait_polling()
    assert status["daemon"]["engine"] == "relay"
    assert status["daemon"]["session_id"] == SESSION
    assert status["poll"]["failures"] == 0
    spawned = session.wait_debug(f"$.process.spawn ({PLUGIN_NAME})")
    assert f"(pid {status['daemon']['pid']})" in spawned, spawned
    said = [line for line in session.debug_text().splitlines()
            if PLUGIN_NAME in line and ("[ERROR]" in line or "[WARN]" in line)]
    assert said == [], f"the debug log has errors or warnings of the plugin: {said}"


# --- 2 ----------------------------------------------------------------------

def test_2_a_prompt_reaches_the_model_and_acks_ok(world, session):
    outcome = send(world, session, "prompt", "check two [live-2]")
    assert_acked_ok(outcome)
    main_request(world, "check two [live-2]")
    session.wait_idle(WAIT)


def test_2_a_notification_prompt_arrives_as_the_user_in_the_task_notification_shape(world, session):
    text = 'tests: 3 passed & 0 failed <all> "as written" [live-2n]'
    assert_acked_ok(send(world, session, "prompt", text, "--notify", "completed", "ci & <lint> done"))
    request = main_request(world, "[live-2n]")
    session.wait_idle(WAIT)
    assert request.body["messages"][-1]["role"] == "user"
    expected = (
        "<task-notification>\n"
        "<status>completed</status>\n"
        "<summary>ci &amp; &lt;lint&gt; done</summary>\n"
        f"<result>{text}</result>\n"
        "</task-notification>"
    )
    if world.release.submits_as_user:
        # A block of its own, exactly so: as the user wrote it, in no plugin's wrapper.
        assert expected in request.last_user_blocks, request.last_user_blocks
    else:
        # Before 2.1.286 Claude Code does not read asUser: the notification,
        # whole, under the plugin's name (docs/install.md, "Which Claude Code").
        framed = f"The {PLUGIN_NAME} plugin sent a message:\n{expected}\n"
        assert any(block.startswith(framed) for block in request.last_user_blocks), request.last_user_blocks


# --- 3 ----------------------------------------------------------------------

def check_model_override(world, session, mark):
    """A model override is on the next request, and gone once dropped."""
    base = prompt_request(world, session, f"model baseline {mark}").model
    assert base != OTHER_MODEL
    assert_acked_ok(send(world, session, "model", OTHER_MODEL))
    overridden = prompt_request(world, session, f"model override {mark}")
    assert overridden.model == OTHER_MODEL, (
        f"the model override is not on the next request: it went out with {overridden.model!r}")
    assert_acked_ok(send(world, session, "model"))
    dropped = prompt_request(world, session, f"model dropped {mark}")
    assert dropped.model == base, f"the dropped model override is still on the next request: {dropped.model!r}"


def test_3_a_model_override_is_on_the_next_request_and_gone_once_dropped(world, session):
    check_model_override(world, session, "[live-3m]")


def check_effort_override(world, session, mark, wait=WAIT):
    """An effort override is on the next request, and gone once dropped."""
    base = effort_of(prompt_request(world, session, f"effort baseline {mark}"))
    level = "low" if base != "low" else "high"
    assert_acked_ok(send(world, session, "effort", level, timeout=wait))
    assert effort_of(prompt_request(world, session, f"effort override {mark}")) == level
    assert_acked_ok(send(world, session, "effort", timeout=wait))
    assert effort_of(prompt_request(world, session, f"effort dropped {mark}")) == base


def test_3_an_effort_override_is_on_the_next_request_and_gone_once_dropped(world, session):
    check_effort_override(world, session, "[live-3e]")


def test_3_an_unknown_effort_is_refused(world, session):
    before = session.wait_idle(WAIT)["overrides"]
    outcome = send(world, session, "effort", "ludicrous")
    assert outcome["ok"] is False
    assert outcome["ack"]["error"] == "unknown effort", outcome
    assert session.wait_idle(WAIT)["overrides"] == before, "a refused effort changed the overrides"


# --- 4 ----------------------------------------------------------------------

def check_abort(world, session, mark, wait=WAIT):
    """A prompt's turn, held streaming at the model API, ended by an abort that acks ok."""
    hold = world.api.hold(mark)
    assert_acked_ok(send(world, session, "prompt", f"a long turn {mark}", timeout=wait))
    assert hold.started.wait(wait), "the turn's request never reached the model API"
    session.wait_status(lambda s: s["turn"] is not None, wait, "the daemon to hear of the turn")
    assert_acked_ok(send(world, session, "abort", timeout=wait))
    assert hold.closed.wait(wait), "the model API's stream was not closed by the abort"
    session.wait_idle(wait)


def test_4_an_abort_ends_a_streaming_turn_and_acks_ok(world, session):
    check_abort(world, session, "[live-4]")


def test_4_an_abort_after_a_subagent_ran_in_the_turn_ends_the_main_turn(world, session):
    """A subagent's run is a turn of its own, inside the main one: every
    release raises its turn.complete, and from 2.1.299 its turn.start, each
    with its agentId. The daemon still aborts the main turn."""
    task = "a task for a subagent [live-4s-task]"
    delegation = world.api.delegate("[live-4s]", task)
    assert_acked_ok(send(world, session, "prompt", "delegate a task [live-4s]"))
    assert delegation.called.wait(WAIT), "the model's call of the subagent tool never went out"
    main_request(world, task)  # the subagent's own request
    assert delegation.returned.started.wait(WAIT), f"the {delegation.tool} call's result never came back to the turn"
    assert ANSWER_PREFIX + task in delegation.returned.request.tool_results[delegation.call_id], \
        f"not the subagent's answer: {delegation.returned.request.tool_results}"
    session.wait_status(lambda s: s["turn"] is not None, WAIT, "the daemon to hold the main turn still")
    assert_acked_ok(send(world, session, "abort"))
    assert delegation.returned.closed.wait(WAIT), "the abort did not close the main turn's stream"
    session.wait_idle(WAIT)


def test_4_an_abort_with_no_turn_acks_no_turn_is_running(world, session):
    session.wait_idle(WAIT)
    outcome = send(world, session, "abort")
    assert outcome["ok"] is False
    assert outcome["ack"]["error"] == "no turn is running", outcome


# --- 5 ----------------------------------------------------------------------

def assert_answered(outcome, question):
    assert_acked_ok(outcome)
    answer = outcome["ack"].get("answer") or ""
    assert answer.startswith(ANSWER_PREFIX) and question in answer, f"not the model's answer to {question!r}: {answer!r}"


def test_5_asks_are_answered_by_forks_while_a_turn_streams_and_the_turn_goes_on(world, session):
    hold = world.api.hold("[live-5]")
    assert_acked_ok(send(world, session, "prompt", "a turn to ask beside [live-5]"))
    assert hold.started.wait(WAIT)
    first = "what are you working on? [live-5a]"
    assert_answered(world.lich.ask(SESSION, first), first)
    assert not hold.finished.is_set(), "the ask ended the turn's stream"

    questions = [f"side question {n}? [live-5b{n}]" for n in range(3)]
    pending = [world.lich.begin_ask(SESSION, q) for q in questions]  # three at once
    for question, ask in zip(questions, pending):
        assert_answered(ask.result(), question)
    forks = [r for r in world.api.messages(since=hold.request.seq) if any(q in r.last_user_text for q in [first, *questions])]
    assert len(forks) == 4, [r.seq for r in forks]

    assert not hold.finished.is_set(), "an ask ended the turn's stream"
    session.wait_status(lambda s: s["turn"] is not None, WAIT, "the turn to be running still")
    hold.release()
    assert hold.finished.wait(WAIT) and not hold.closed.is_set(), "the turn's stream did not finish as the model sent it"
    session.wait_idle(WAIT)


# --- 6 ----------------------------------------------------------------------

def test_6_compact_runs_and_acks(world, session):
    before = prompt_request(world, session, "before compacting [live-6a]")
    assert_acked_ok(send(world, session, "command", "compact", timeout=30))
    after = prompt_request(world, session, "after compacting [live-6a]")
    # The conversation was replaced by its summary: the next turn carries less.
    assert len(after.body["messages"]) < len(before.body["messages"]), (len(before.body["messages"]), len(after.body["messages"]))


def test_6_a_slash_command_queued_during_a_turn_runs_once_the_turn_ends(world, session):
    hold = world.api.hold("[live-6b]")
    assert_acked_ok(send(world, session, "prompt", "a turn to queue behind [live-6b]"))
    assert hold.started.wait(WAIT)
    command = world.lich.begin(SESSION, "command", CUSTOM_COMMAND, "[live-6c]", timeout=WAIT)
    session.wait_status(lambda s: any(c["kind"] == "command" for c in s["in_flight"]), WAIT, "the command in flight")
    assert not any("[live-6c]" in r.last_user_text for r in world.api.messages()), "the command ran during the turn"
    hold.release()
    assert_acked_ok(command.result())
    ran = main_request(world, "[live-6c]")
    assert "The custom command ran with [live-6c]" in ran.last_user_text
    assert hold.finished_at is not None and ran.at > hold.finished_at and not hold.closed.is_set()
    session.wait_idle(WAIT)


def test_6_behind_an_open_cost_dialog_a_model_override_still_applies(world, session):
    session.wait_idle(WAIT)
    mark = session.terminal.mark()
    session.slash("/cost")
    # The dialog open: its hint (2.1.280's says "Esc to cancel").
    session.terminal.wait_for_text(("Esc to close", "Esc to cancel"), WAIT, since=mark)
    # Behind the dialog: the override and an abort still answer at once...
    assert_acked_ok(send(world, session, "model", OTHER_MODEL))
    assert send(world, session, "abort")["ack"]["error"] == "no turn is running"
    # ...while a prompt waits for the dialog to close.
    prompt = world.lich.begin(SESSION, "prompt", "after the dialog [live-6d]", timeout=WAIT)
    session.wait_status(lambda s: any(c["kind"] == "prompt" for c in s["in_flight"]), WAIT, "the prompt in flight")
    assert not any("[live-6d]" in r.last_user_text for r in world.api.messages()), "the prompt ran past the open dialog"
    session.terminal.type(ESC)
    assert_acked_ok(prompt.result())
    assert main_request(world, "[live-6d]").model == OTHER_MODEL
    assert_acked_ok(send(world, session, "model"))
    session.wait_idle(WAIT)


# --- 7 ----------------------------------------------------------------------

def test_7_a_daemon_killed_with_sigkill_is_restarted_and_polls_again(world, session):
    killed = session.wait_polling()["daemon"]["pid"]
    os.kill(killed, signal.SIGKILL)
    assert pid_ended(killed, WAIT)
    restarted = session.wait_status(
        lambda s: s["daemon"]["pid"] != killed and s["poll"]["state"] == "polling" and s["poll"]["last_poll_age_s"] is not None,
        WAIT, "a restarted daemon polling")
    assert restarted["daemon"]["pid"] != killed
    session.wait_debug("was ended by SIGKILL; restart 1 of")
    prompt_request(world, session, "after the restart [live-7]")


def test_7_the_python_option_set_in_config_runs_the_daemon_it_restarts(world, session):
    # An interpreter of a name of its own: it runs the one the session's
    # settings named, so only the name tells which of the two ran.
    configured = world.ws.write_file("config-python/python", f'#!/bin/sh\nexec {python()} "$@"\n')
    os.chmod(configured, 0o755)
    before = session.wait_polling()["daemon"]["pid"]
    session.set_in_config(PYTHON_ROW, configured)
    # Stored where Claude Code keeps the options of a --plugin-dir plugin,
    # and the module reloaded with them: a new daemon, under that interpreter.
    def stored():
        with open(os.path.join(world.ws.home, ".claude", "settings.json")) as f:
            return json.load(f).get("pluginConfigs", {}).get(f"{PLUGIN_NAME}@inline")

    session.wait_for(stored, lambda held: held == {"options": {"python": configured}}, WAIT,
                     f"pluginConfigs[{PLUGIN_NAME}@inline] of the settings holding it", lambda held: f"it holds {held}")
    status = session.wait_status(
        lambda s: s["daemon"]["pid"] != before and s["poll"]["state"] == "polling" and s["poll"]["last_poll_age_s"] is not None,
        WAIT, "a new daemon polling")
    spawned = session.wait_debug(f"$.process.spawn ({PLUGIN_NAME}): {configured} with 2 args")
    assert f"(pid {status['daemon']['pid']})" in spawned, spawned
    prompt_request(world, session, "under the configured python [live-7c]")


def test_7_after_exit_the_daemon_is_gone_its_socket_removed_and_nothing_polls(world, session):
    status = session.wait_polling()
    daemon, socket = status["daemon"]["pid"], status["daemon"]["socket"]
    session.slash("/exit")
    assert session.wait_exit(WAIT) == 0
    assert pid_ended(daemon, WAIT), "the daemon outlived its session"
    assert not os.path.exists(socket)
    assert mod_status(world.ws.run_dir)["daemons"] == []
    outcome = world.lich.control(SESSION, "prompt", "is anyone there?", timeout=3)
    assert outcome["ok"] is False and not outcome.get("delivered"), outcome
    world.watch.wait_ended("the session's processes to end", WAIT, but={world.lich.pid})


# --- 8 ----------------------------------------------------------------------

def test_8_a_print_run_with_the_same_variables_starts_no_daemon(world):
    done = world.print_run(PRINT_SESSION, "a print run [live-8]", plugin_dir=world.plugin)
    assert done.returncode == 0, done.stderr[-2000:]
    main_request(world, "[live-8]")
    with open(world.ws.debug_log(PRINT_SESSION), errors="replace") as f:
        debug = f.read()
    assert f"hooks module {PLUGIN_NAME}@" in debug and f"{PLUGIN_NAME}@inline session.start settled" in debug, \
        "the module did not run in the print run, so it proves nothing"
    assert f"$.process.spawn ({PLUGIN_NAME})" not in debug
    assert not [name for name in os.listdir(world.ws.run_dir) if name.startswith(PRINT_SESSION)]
    outcome = world.lich.control(PRINT_SESSION, "prompt", "anyone?", timeout=2)
    assert outcome["ok"] is False and not outcome.get("delivered"), outcome


# --- the check can fail -----------------------------------------------------

def drop_turn_step_override(folder):
    path = os.path.join(folder, "hooks", "mod-control.js")
    with open(path) as f:
        source = f.read()
    hook = "next(withOverrides(e))"
    assert source.count(hook) == 1, f"the relay's turn.step override ({hook}) moved: update this mutation"
    with open(path, "w") as f:
        f.write(source.replace(hook, "next(e)"))


def test_check_3_fails_on_a_relay_without_its_turn_step_override(world):
    plugin = world.ws.copy_checkout("plugin-mutant", edit=drop_turn_step_override)
    mutant = world.session(MUTANT_SESSION, plugin_dir=plugin)
    mutant.wait_polling(timeout=30)
    with pytest.raises(AssertionError, match="the model override is not on the next request"):
        check_model_override(world, mutant, "[live-mutant]")
    mutant.slash("/exit")
    assert mutant.wait_exit(WAIT) == 0


# --- 9 ----------------------------------------------------------------------

def test_9_the_token_appears_nowhere(world, session):
    token = world.lich.token
    ws = world.ws
    daemon_log = os.path.join(ws.run_dir, f"{SESSION}.log")
    assert os.path.getsize(daemon_log) > 0 and os.path.getsize(session.debug_log) > 0
    folders = ws.left_by_the_run()
    assert ws.home in folders and ws.run_dir in folders and ws.logs in folders
    assert ws.files_holding(token, folders) == []

    seen = world.watch.seen
    daemons = [p for p in seen if "lich_control" in p.argv]
    assert len({p.pid for p in daemons}) >= 3, "the watch missed a daemon: first, restarted, mutant"
    assert [p for p in seen if any(token in arg for arg in p.argv)] == []

    assert not any(token in r.text() or token in str(r.headers) or token in str(r.query) for r in world.api.requests)
    assert token not in session.terminal.output
