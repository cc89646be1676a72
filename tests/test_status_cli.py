"""lich-mod-status against live daemons, one in each state, sharing one run
folder and one development lich.

- live: polling, one command acked;
- backoff: lich answered its first poll 500 (the second poll proves the backoff was recorded);
- gone: lich answered its first poll 404, so polling stopped;
- stale: a socket file nothing listens on.
"""
import json
import os
import socket
import subprocess
import sys
import time
from urllib.parse import quote

import pytest

from conftest import SCAN_TOKEN
from lich_control import status_cli as statuscli
from lich_control.bridge import BadMessage
from lich_control.unix_socket import Routes, UnixHttpServer, unix_request
from lich_dev.faults import AckAnswer
from lich_dev.lich import Answer, StubLich
from lich_dev.procs import ROOT, daemon_env
from relay import Relay

WAIT = 10.0


def status_when(path, predicate, timeout=WAIT):
    """Read the daemon's status with lich-mod-status's own client until
    `predicate` holds. Nothing outside the daemon marks the moment it records
    a 404, so this re-asks, each read a blocking round trip on the socket
    (no sleep), until a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        found = statuscli.ask(path)
        if found.status is not None and predicate(found.status):
            return found.status
        assert time.monotonic() < deadline, f"the status never matched: {found}"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("st"))
    lich = StubLich().start()
    lich.faults.script(Answer(status=500), session_id="backoff")
    lich.faults.script(Answer(status=404), session_id="gone")
    daemons = []
    try:
        for session in ("live", "backoff", "gone"):
            env = {"LICH_PORT": str(lich.port), "LICH_TOKEN": lich.token, "LICH_SESSION_ID": session, "LICH_CONTROL_RUN_DIR": run_dir}
            daemons.append(Relay(env, module="lich_dev.sim"))
        assert lich.wait_polled("live", WAIT)
        assert lich.send("live", {"kind": "abort"}, WAIT).acked
        assert lich.wait_polled("backoff", WAIT, more_than=1)
        status_when(os.path.join(run_dir, "gone.sock"), lambda s: s["poll"]["state"] == "stopped")
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(os.path.join(run_dir, "stale.sock"))
        stale.close()  # bound, never listening: connecting is refused
        yield run_dir, lich.token
    finally:
        for daemon in daemons:
            daemon.stop()
        lich.close()


@pytest.fixture
def run(world, monkeypatch, capsys):
    run_dir, _ = world
    monkeypatch.setenv("LICH_CONTROL_RUN_DIR", run_dir)
    monkeypatch.delenv("NO_COLOR", raising=False)

    def invoke(*args):
        code = statuscli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


def row(out, session):
    return next(line for line in out.splitlines() if line.split()[0] == session)


def test_the_overview_shows_each_daemon_in_its_state(run):
    code, out, err = run()
    assert code == 0
    assert out.splitlines()[0].split()[:3] == ["SESSION", "PID", "STATE"]
    assert "  polling  " in row(out, "live")
    assert "backing off 1 s" in row(out, "backoff")
    assert "stopped: lich answered 404" in row(out, "gone")
    assert "stale socket: nothing answers" in row(out, "stale")


def test_the_overview_columns_are_aligned(run):
    code, out, _ = run()
    lines = out.splitlines()
    column = lines[0].index("STATE")
    for line in lines[1:]:
        assert line[column - 2 : column] == "  " and line[column] != " "


def test_the_overview_row_of_a_polling_daemon_carries_its_counts_and_uptime(run):
    _, out, _ = run()
    line = row(out, "live")
    assert "abort 0/1" in line and "ago" in line and line.rstrip().endswith(" s")


def test_the_overview_as_json_lists_every_socket(run, world):
    code, out, _ = run("--json")
    doc = json.loads(out)
    by_session = {d["session_id"]: d for d in doc["daemons"]}
    assert sorted(by_session) == ["backoff", "gone", "live", "stale"]
    assert by_session["stale"]["status"] is None and by_session["stale"]["stale"]
    assert by_session["backoff"]["status"]["poll"]["state"] == "backing off"
    assert code == 0


def test_the_detail_shows_recent_commands_with_outcome_and_timing(run):
    code, out, _ = run("live")
    assert code == 0
    assert "recent commands" in out
    recent = out.split("recent commands", 1)[1]
    assert "abort" in recent and "failed: no turn is running" in recent and " ms " in recent


def test_the_detail_of_a_backing_off_daemon_shows_why_and_its_last_errors(run):
    code, out, _ = run("backoff")
    assert code == 0
    assert "backing off 1 s (lich answered 500)" in out
    assert "poll failed: lich answered 500" in out.split("last errors", 1)[1]


def test_the_detail_of_a_stopped_daemon_says_so(run):
    code, out, _ = run("gone")
    assert code == 0 and "stopped: lich answered 404" in out


def test_no_output_carries_a_token(run, world):
    _, token = world
    everything = "".join(run(*args)[1] for args in ((), ("--json",), ("live",), ("backoff",), ("gone",), ("live", "--json")))
    assert token not in everything


def test_a_stale_socket_asked_for_by_name_exits_1(run):
    code, out, err = run("stale")
    assert code == 1 and "stale socket: nothing answers" in err


def test_a_session_without_a_daemon_exits_1(run):
    code, _, err = run("nobody")
    assert code == 1 and "no daemon for session nobody" in err


def test_an_empty_run_folder_exits_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LICH_CONTROL_RUN_DIR", str(tmp_path))
    assert statuscli.main([]) == 1
    assert "no daemon answers" in capsys.readouterr().err


def test_output_off_a_terminal_has_no_colour(run):
    _, out, _ = run()
    assert "\033[" not in out


def test_colour_on_a_terminal_keeps_the_columns_aligned():
    rows = [["A", "STATE"], ["x", "polling"], ["longer", "stopped: gone"]]
    plain = statuscli.table(rows, statuscli.Paint(False), coloured_column=1)
    coloured = statuscli.table(rows, statuscli.Paint(True), coloured_column=1)
    strip = lambda line: line.replace("\033[1m", "").replace("\033[32m", "").replace("\033[31m", "").replace("\033[0m", "")
    assert "\033[32mpolling\033[0m" in coloured[1]
    assert [strip(line) for line in coloured] == plain


# -- documents this command cannot read -----------------------------------------------------


def good_status(session="good"):
    return {
        "daemon": {"pid": 7, "version": "0", "contract_release": "0", "session_id": session, "engine": "relay", "uptime_s": 1.0, "socket": "/x", "log_file": "/y"},
        "poll": {"state": "polling", "reason": None, "backoff": 0, "retry_in_s": None, "last_poll_age_s": 1.0, "last_answer_age_s": 1.0, "polls": 1, "failures": 0},
        "turn": None, "overrides": {"model": None, "effort": None}, "in_flight": [], "counts": {}, "recent": [], "errors": [],
    }


@pytest.fixture
def folder_of(tmp_path, monkeypatch, capsys):
    """A run folder with a socket per document given: (code, out, err) of a run."""
    servers = []

    def serve(docs, *args):
        for name, doc in docs.items():
            server = UnixHttpServer(str(tmp_path / f"{name}.sock"), Routes(None, None, lambda doc=doc: doc, BadMessage))
            server.listen()
            servers.append(server)
        monkeypatch.setenv("LICH_CONTROL_RUN_DIR", str(tmp_path))
        code = statuscli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    yield serve
    for server in servers:
        server.close()


def without_pid():
    doc = good_status("nopid")
    del doc["daemon"]["pid"]
    return doc


def null_session():
    doc = good_status()
    doc["daemon"]["session_id"] = None
    return doc


def test_a_document_missing_a_field_or_with_a_null_session_hides_no_other_daemon(folder_of):
    code, out, err = folder_of({"good": good_status(), "nopid": without_pid(), "nullsession": null_session(), "odd": ["not", "a", "status"]})
    assert code == 0 and err == ""
    assert "  polling  " in row(out, "good")
    assert "its status has no 'pid'" in row(out, "nopid")
    assert "  polling  " in row(out, "nullsession")  # named after its socket
    assert "not a daemon's status" in row(out, "odd")
    code, out, _ = folder_of({}, "--json")
    assert sorted(d["session_id"] for d in json.loads(out)["daemons"]) == ["good", "nopid", "nullsession", "odd"]


def test_the_detail_of_a_document_missing_a_field_is_one_line_and_exit_1(folder_of):
    code, out, err = folder_of({"nopid": without_pid()}, "nopid")
    assert (code, out) == (1, "") and err.startswith("lich-mod-status: session nopid: its status has no 'pid'")


def test_a_document_is_printed_as_the_daemon_gave_it(folder_of):
    # The daemon cleaned every string as it entered: what it says is shown.
    doc = good_status()
    doc["poll"]["state"] = "backing off"
    doc["poll"]["reason"] = "lich said m\\u202e"
    code, out, _ = folder_of({"good": doc}, "good")
    assert code == 0 and "backing off 0 s (lich said m\\u202e)" in out


# -- through a real daemon ---------------------------------------------------------------------


def lich_mod_status(run_dir, *args):
    env = daemon_env(LICH_CONTROL_RUN_DIR=run_dir, PYTHONIOENCODING="utf-8")
    env.pop("NO_COLOR", None)
    return subprocess.run([sys.executable, "-m", "lich_control.status_cli", *args], cwd=ROOT, env=env, capture_output=True, timeout=30)


EVERY_VIEW = ((), ("--json",), ("s1",), ("s1", "--json"))

def test_an_ack_refusal_that_repeats_the_url_shows_nowhere_with_the_token(lich, relay, run_dir):
    # Built here, not with the lich's own URL: this test must not lean on
    # lich.py scrubbing lich's answer.
    refusal = f"no route for POST /mod/acks?token={quote(SCAN_TOKEN, safe='')} (token {SCAN_TOKEN})"
    daemon = relay()
    daemon.wait_hello()
    daemon.autoanswer()
    lich.faults.script_acks(AckAnswer(status=400, reason=refusal))
    assert lich.wait_polled("s1", WAIT)
    lich.queue("s1", {"id": "m1", "kind": "abort"})
    doc = daemon.wait_status(lambda s: any("not delivered" in e["what"] for e in s["errors"]), WAIT)
    _, raw = unix_request(daemon.socket, "GET", "/v1/status")
    shown = [raw, json.dumps(doc).encode()]
    for args in EVERY_VIEW:
        done = lich_mod_status(run_dir, *args)
        assert done.returncode == 0, done.stderr
        shown.append(done.stdout + done.stderr)
    assert b"lich refused it: 400 no route for POST /mod/acks?token=[token] (token [token])" in shown[2 + 2]
    for form in (SCAN_TOKEN, quote(SCAN_TOKEN, safe=""), quote(SCAN_TOKEN)):
        assert not any(form.encode() in out for out in shown), form


def test_an_id_with_invisible_bidirectional_and_control_characters_is_acked_and_shown_escaped(lich, relay, run_dir):
    daemon = relay()
    daemon.wait_hello()
    daemon.autoanswer()
    lich.faults.script(Answer(raw=b'[{"id": "m\\udc80\\u202e\\u200b\\ufeff\\n2026-12-01 00:00:00,000 INFO forged", "kind": "abort"}]'))
    daemon.wait_status(lambda s: len(s["recent"]) == 1, WAIT)
    runs = [lich_mod_status(run_dir, *args) for args in EVERY_VIEW]
    for done in runs:
        assert (done.returncode, done.stderr) == (0, b"")
        done.stdout.decode("utf-8")  # strict
    assert "m\\udc80\\u202e\\u200b\\ufeff\\n2026-12-01 00:00:00,000 INFO forged" in runs[2].stdout.decode()
    assert json.loads(runs[3].stdout)["status"]["recent"][0]["id"] == "m\\udc80\\u202e\\u200b\\ufeff\\n2026-12-01 00:00:00,000 INFO forged"
    with open(os.path.join(run_dir, "s1.log"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert any("m\\udc80\\u202e\\u200b\\ufeff\\n2026-12-01" in line for line in lines)
    assert not any(char in line for line in lines for char in "\u202e\u200b\ufeff")
    assert not any(line.startswith("2026-12-01 00:00:00,000 INFO forged") for line in lines)
