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
import time

import pytest

from lich_control import status_cli as statuscli
from lich_dev.lich import Answer, StubLich
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


def test_a_socket_answering_something_that_is_not_a_status_is_reported_not_a_crash(tmp_path, monkeypatch, capsys):
    from lich_control.bridge import BadMessage
    from lich_control.status_cli import main
    from lich_control.unix_socket import Routes, UnixHttpServer

    server = UnixHttpServer(str(tmp_path / "odd.sock"), Routes(None, None, lambda: ["not", "a", "status"], BadMessage))
    server.listen()
    monkeypatch.setenv("LICH_CONTROL_RUN_DIR", str(tmp_path))
    try:
        main([])
    finally:
        server.close()
    assert "not a daemon's status" in capsys.readouterr().out
