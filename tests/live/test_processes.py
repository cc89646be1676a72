"""The live tests' process watch claims its own sessions and no one else's,
and waits for them to end."""
import subprocess
import sys

import pytest

from processes import ProcessWatch


def row(pid, ppid, sid, start, name):
    return (pid, "S", ppid, sid, start, (name,))


def ours(watch, table):
    return sorted(argv[0] for _, _, _, argv in watch._ours(table))


def test_a_session_id_reused_by_a_stranger_once_ours_ended_is_not_claimed():
    watch = ProcessWatch()
    watch._sessions[100] = 5  # ours, its leader started at tick 5
    table = [row(100, 1, 100, 9, "stranger"), row(101, 100, 100, 10, "stranger's child")]
    assert ours(watch, table) == []
    # and not later either, when the stranger's leader has gone and its child stays
    assert ours(watch, [row(101, 1, 100, 10, "stranger's child")]) == []


def test_what_our_session_runs_is_claimed_after_its_leader_ended_and_so_are_the_sessions_it_starts():
    watch = ProcessWatch()
    watch._sessions[100] = 5
    table = [row(101, 1, 100, 6, "orphan of ours"), row(300, 101, 300, 7, "leads its own session")]
    assert ours(watch, table) == ["leads its own session", "orphan of ours"]
    table.append(row(301, 1, 300, 8, "in the session it started"))
    assert ours(watch, table) == ["in the session it started", "leads its own session", "orphan of ours"]


def test_the_end_of_the_watched_processes_is_waited_for_not_judged_on_one_look():
    # Just after its stdin closes, the child is still running, or ending
    # with its argv already empty: neither is a verdict.
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, start_new_session=True)
    with ProcessWatch() as watch:
        watch.track(child.pid)
        assert [p.pid for p in watch.alive()] == [child.pid]
        with pytest.raises(AssertionError, match=r"the child to end: not within 0.2 s; still running: \[Seen\(pid=%d" % child.pid):
            watch.wait_ended("the child to end", 0.2)
        child.stdin.close()
        watch.wait_ended("the child to end", 10)
        assert watch.alive() == []  # ended, a zombie until reaped
    child.wait(10)
