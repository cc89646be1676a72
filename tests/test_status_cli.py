"""lich-mod-status: the overview and the detail of daemons in each state,
their documents made by Activity and served on real sockets in one run
folder; documents it cannot read, which hide no other daemon; and, through
a real daemon, what lich sent shown cleaned in every view."""
import json
import os
import socket
import subprocess
import sys
import threading
from urllib.parse import quote

import pytest

from conftest import SCAN_TOKEN
from lich_control import status_cli as statuscli
from lich_control.activity import Activity
from lich_control.bridge import Turns
from lich_control.config import ADDRESS
from lich_control.bridge_server import BridgeServer, LoopbackListener, Routes, listener_at
from lich_dev.faults import AckAnswer, Answer
from lich_dev.procs import ROOT, daemon_env

WINDOWS = os.name == "nt"

WAIT = 10.0


def bound_not_listening(folder, name):
    """What a killed daemon leaves: a socket file nothing listens on, or on
    Windows an address file naming a port nothing listens on. Its path."""
    path = str(folder / f"{name}.{ADDRESS}")
    if WINDOWS:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        with open(path, "w") as file:
            json.dump({"pid": 1, "port": port, "secret": "s"}, file)
    else:
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(path)
        stale.close()  # bound, never listening: connecting is refused
    return path


def listening(folder, name):
    """A listening socket nothing answers on, and the path naming it in `folder`."""
    path = str(folder / f"{name}.{ADDRESS}")
    if WINDOWS:
        sock = socket.create_server(("127.0.0.1", 0))
        with open(path, "w") as file:
            json.dump({"pid": 1, "port": sock.getsockname()[1], "secret": "s"}, file)
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(path)
        sock.listen()
    return sock, path


def daemons_in_each_state():
    """What Activity tells of a daemon polling with one command acked, one
    backing off after a 500, and one stopped by a 404."""
    live, backoff, gone = (Activity(name, "relay", Turns(), files={"socket": f"/r/{name}.sock"}) for name in ("live", "backoff", "gone"))
    for activity in (live, backoff, gone):
        activity.poll_sent()
    live.poll_answered()
    live.received("m1", "abort")
    live.acked("m1", "abort", False, "no turn is running", sent=None)
    backoff.poll_failed("lich answered 500", 1.0)
    gone.poll_stopped("lich answered 404")
    return {"live": live.snapshot, "backoff": backoff.snapshot, "gone": gone.snapshot}


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A run folder: `serve` puts a daemon's socket in it answering each
    status given (a document, or what makes one)."""
    monkeypatch.setenv("LICH_CONTROL_RUN_DIR", str(tmp_path))
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)  # a terminal's width, where the suite runs in one
    servers = []

    def serve(statuses):
        for name, status in statuses.items():
            server = BridgeServer(listener_at(str(tmp_path / f"{name}.{ADDRESS}")), Routes(None, None, status if callable(status) else lambda doc=status: doc))
            server.listen()
            servers.append(server)

    serve.path = tmp_path
    yield serve
    for server in servers:
        server.close()


@pytest.fixture
def run(folder, capsys):
    """lich-mod-status over the daemons in each state and a stale socket: (code, out, err)."""
    folder(daemons_in_each_state())
    bound_not_listening(folder.path, "stale")

    def invoke(*args):
        code = statuscli.main(list(args))
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


def row(out, session):
    return next(line for line in out.splitlines() if line.split()[0] == session)


def test_the_overview_shows_each_daemon_in_its_state_in_aligned_columns(run):
    code, out, err = run()
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["SESSION", "PID", "STATE"]
    assert "  polling  " in row(out, "live") and "abort 0/1" in row(out, "live")
    assert "backing off 1 s" in row(out, "backoff")
    assert "stopped: lich answered 404" in row(out, "gone")
    assert "stale socket: nothing answers" in row(out, "stale")
    column = lines[0].index("STATE")
    for line in lines[1:]:
        assert line[column - 2 : column] == "  " and line[column] != " "


def test_the_overview_as_json_lists_every_socket(run):
    code, out, _ = run("--json")
    by_session = {d["session_id"]: d for d in json.loads(out)["daemons"]}
    assert code == 0 and sorted(by_session) == ["backoff", "gone", "live", "stale"]
    assert by_session["stale"]["status"] is None and by_session["stale"]["stale"]
    assert by_session["backoff"]["status"]["poll"]["state"] == "backing off"


def test_the_detail_shows_recent_commands_with_outcome_and_timing(run):
    code, out, _ = run("live")
    recent = out.split("recent commands", 1)[1]
    assert code == 0 and "abort" in recent and "failed: no turn is running" in recent and " ms " in recent


def test_the_detail_of_a_backing_off_daemon_shows_why_and_its_last_errors(run):
    code, out, _ = run("backoff")
    assert code == 0 and "backing off 1 s (lich answered 500)" in out
    assert "poll failed: lich answered 500" in out.split("last errors", 1)[1]


def test_a_stale_socket_asked_for_by_name_exits_1(run):
    code, out, err = run("stale")
    assert code == 1 and "stale socket: nothing answers" in err


def test_a_session_without_a_daemon_exits_1(run):
    code, _, err = run("nobody")
    assert code == 1 and "no daemon for session nobody" in err


def test_an_empty_run_folder_says_no_daemon_runs_and_exits_0(folder, capsys):
    assert statuscli.main([]) == 0
    assert capsys.readouterr().out == f"no daemon is running: none answers in {folder.path}\n"


def test_what_the_setups_are_doing_follows_the_daemons_and_a_failed_one_exits_1(folder, capsys):
    building = {"data": "/d", "state": "running", "text": "a setup … is running in /d (since 03:12:00, pid 7)"}
    failed = {"data": "/e", "state": "failed", "text": "the last setup … in /e failed at 03:10:00: … To try again: x"}
    assert statuscli.main([], setups=lambda: [building]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == [building["text"]]
    assert statuscli.main(["--json"], setups=lambda: [building, failed]) == 1
    assert json.loads(capsys.readouterr().out)["setups"] == [building, failed]


def test_the_overview_fits_the_terminal_and_cuts_the_widest_cells(run, monkeypatch):
    _, wide, _ = run()
    assert max(map(len, wide.splitlines())) > 80
    monkeypatch.setenv("COLUMNS", "80")
    _, out, _ = run()
    assert max(map(len, out.splitlines())) <= 80
    assert "…" in out and "  polling" in row(out, "live")


@pytest.mark.skipif(WINDOWS, reason="Windows: no owner or mode to check (the profile's ACL keeps the folder the user's)")
@pytest.mark.parametrize("foreign", ["another user's", "writable by others"])
def test_a_run_folder_the_daemon_would_refuse_is_refused_and_nothing_in_it_asked(run, folder, monkeypatch, foreign):
    # A folder another local user made first, with a socket answering what they like.
    if foreign == "another user's":
        monkeypatch.setattr(os, "geteuid", lambda: os.stat(folder.path).st_uid + 1)
        said = "belongs to another user"
    else:
        os.chmod(folder.path, 0o777)
        said = "is writable by other users"
    for args in ([], ["live"], ["--json"]):
        code, out, err = run(*args)
        assert (code, out) == (1, "") and f"run folder {folder.path} {said}" in err


def test_a_socket_answering_a_byte_at_a_time_is_given_the_limit_for_the_whole_exchange(tmp_path, background):
    listener, path = listening(tmp_path, "slow")
    done = threading.Event()

    def trickle():
        conn, _ = listener.accept()
        conn.recv(65536)
        for byte in b"HTTP/1.1 200 OK\r\nX-Pad: " + b"x" * 10_000:
            if done.wait(0.05):
                break
            conn.sendall(bytes([byte]))
        conn.close()

    background.submit(trickle)
    try:
        asked = background.submit(statuscli.ask, path, 0.5)
        assert asked.result(WAIT).stale == "stale socket: no answer within 0.5 s"
    finally:
        done.set()
        listener.close()


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
    return Activity(session, "relay", Turns()).snapshot()


def without_pid():
    doc = good_status("nopid")
    del doc["daemon"]["pid"]
    return doc


def null_session():
    doc = good_status()
    doc["daemon"]["session_id"] = None
    return doc


def test_a_document_missing_a_field_or_with_a_null_session_hides_no_other_daemon(folder, capsys):
    folder({"good": good_status(), "nopid": without_pid(), "nullsession": null_session(), "odd": ["not", "a", "status"]})
    code, out = statuscli.main([]), capsys.readouterr().out
    assert code == 0
    assert "  starting  " in row(out, "good")
    assert "its status has no 'pid'" in row(out, "nopid")
    assert "  starting  " in row(out, "nullsession")  # named after its socket
    assert "not a daemon's status" in row(out, "odd")
    assert statuscli.main(["--json"]) == 0
    assert sorted(d["session_id"] for d in json.loads(capsys.readouterr().out)["daemons"]) == ["good", "nopid", "nullsession", "odd"]


def test_the_detail_of_a_document_missing_a_field_is_one_line_and_exit_1(folder, capsys):
    folder({"nopid": without_pid()})
    assert statuscli.main(["nopid"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("lich-mod-status: session nopid: its status has no 'pid'")


def test_a_document_is_printed_as_the_daemon_gave_it(folder, capsys):
    # The daemon cleaned every string as it entered: what it says is shown.
    doc = good_status()
    doc["poll"].update(state="backing off", reason="lich said m\\u202e", backoff=2)
    folder({"good": doc})
    assert statuscli.main(["good"]) == 0
    assert "backing off 2 s (lich said m\\u202e)" in capsys.readouterr().out


# -- through a real daemon ---------------------------------------------------------------------


def lich_mod_status(run_dir, *args):
    env = daemon_env(LICH_CONTROL_RUN_DIR=run_dir, PYTHONIOENCODING="utf-8")
    env.pop("NO_COLOR", None)
    return subprocess.run([sys.executable, "-m", "lich_control.status_cli", *args], cwd=ROOT, env=env, capture_output=True, timeout=30)


NASTY_ID = "m\\udc80\\u202e\\u200b\\ufeff\\n2026-12-01 00:00:00,000 INFO forged"  # as JSON writes it


def test_what_lich_sent_is_shown_cleaned_in_every_view_and_the_log(lich, relay, run_dir):
    # The refusal is built here, not with the lich's own URL: this test must
    # not lean on lich.py scrubbing lich's answer.
    refusal = f"no route for POST /mod/acks?token={quote(SCAN_TOKEN, safe='')} (token {SCAN_TOKEN})"
    daemon = relay()
    daemon.wait_hello()
    daemon.autoanswer()
    lich.faults.script_acks(AckAnswer(status=400, reason=refusal))
    lich.faults.script(Answer(raw=f'[{{"id": "{NASTY_ID}", "kind": "abort"}}]'.encode()))
    daemon.wait_status(lambda s: any("not delivered" in e["what"] for e in s["errors"]), WAIT)
    runs = [lich_mod_status(run_dir, *args) for args in ((), ("--json",), ("s1",), ("s1", "--json"))]
    for done in runs:
        assert (done.returncode, done.stderr) == (0, b"")
        done.stdout.decode("utf-8")  # strict
    assert "lich refused it: 400 no route for POST /mod/acks?token=[token] (token [token])" in runs[2].stdout.decode()
    assert NASTY_ID in runs[2].stdout.decode()
    assert json.loads(runs[3].stdout)["status"]["recent"][0]["id"] == NASTY_ID
    for form in (SCAN_TOKEN, quote(SCAN_TOKEN, safe=""), quote(SCAN_TOKEN)):
        assert not any(form.encode() in done.stdout for done in runs), form
    with open(os.path.join(run_dir, "s1.log"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert any(NASTY_ID[:30] in line for line in lines)
    assert not any(char in line for line in lines for char in "\u202e\u200b\ufeff")
    assert not any(line.startswith("2026-12-01 00:00:00,000 INFO forged") for line in lines)


# -- a daemon on loopback TCP (Windows' listener, asked here on every system) ---------------


def test_a_daemon_named_by_an_address_file_is_asked_on_its_port_with_its_secret(tmp_path):
    doc = good_status("tcp")
    with BridgeServer(LoopbackListener(str(tmp_path / "tcp.address")), Routes(None, None, lambda: doc)) as server:
        found = statuscli.ask(server.listener.path)
    assert found.status == doc and found.session == "tcp"


@pytest.mark.parametrize("content", ["not json", '{"pid": 1}', '{"port": "80", "secret": "s"}'], ids=["not-json", "no-port", "port-not-a-number"])
def test_an_address_file_that_cannot_be_read_is_reported_on_its_row(tmp_path, content):
    path = tmp_path / "odd.address"
    path.write_text(content)
    found = statuscli.ask(str(path))
    assert found.status is None and found.stale.startswith("its address file cannot be read")


@pytest.mark.skipif(WINDOWS, reason="Windows' run folder is in LOCALAPPDATA, the same for both")
def test_with_no_run_folder_named_it_finds_the_daemon_whatever_temporary_folder_each_was_given(relay, tmp_path_factory):
    # In lich's macOS profile the session's $TMPDIR cannot be written (and
    # tempfile falls back to the working directory) while outside it can.
    home, inside, outside = (str(tmp_path_factory.mktemp(name)) for name in ("h", "in", "out"))
    r = relay(env={"LICH_CONTROL_RUN_DIR": "", "XDG_RUNTIME_DIR": "", "HOME": home, "TMPDIR": inside})
    r.wait_hello()
    env = daemon_env(XDG_RUNTIME_DIR="", HOME=home, TMPDIR=outside)
    done = subprocess.run([sys.executable, "-m", "lich_control.status_cli", "--json"], cwd=ROOT, env=env,
                          capture_output=True, timeout=30)
    found = json.loads(done.stdout)
    assert [d["session_id"] for d in found["daemons"] if d["status"]] == ["s1"], found
