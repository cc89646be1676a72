"""The run folder under hostile hands: nothing planted there is written
through, and a folder the daemon did not make keeps its mode."""
import logging
import os
import stat
import subprocess
import sys

import pytest

from lich_control import logs
from lich_control.config import BadConfig, ensure_run_dir
from lich_dev import procs
from lich_control.lifeline import SessionLock
from lich_control.runfiles import NotOurs
from lich_control.unix_socket import Routes, UnixHttpServer
from lich_control.bridge import BadMessage

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="making a file of another user takes root")
OTHER_UID = 54321
BEFORE = "the victim's own text\n"


@pytest.fixture
def victim(tmp_path):
    """A file elsewhere that a planted link points at: it must stay as it is."""
    path = tmp_path / "victim"
    path.write_text(BEFORE)
    return path


def plant(kind, path, victim):
    """Puts at `path` something that is not a plain file of ours."""
    if kind == "symlink":
        os.symlink(victim, path)
    elif kind == "dangling-symlink":
        os.symlink(str(victim) + ".new", path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "hard-link":
        os.link(victim, path)
    elif kind == "other-users":
        path.write_text(BEFORE)
        os.chown(path, OTHER_UID, -1)
    elif kind == "folder":
        path.mkdir()


PLANTED = ["symlink", "dangling-symlink", "fifo", "hard-link", pytest.param("other-users", marks=ROOT_ONLY), "folder"]


def untouched(victim):
    assert victim.read_text() == BEFORE
    assert not os.path.exists(str(victim) + ".new")


# -- the lock ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", PLANTED)
def test_the_lock_refuses_what_is_not_a_plain_file_of_ours(tmp_path, victim, kind):
    path = tmp_path / "s1.lock"
    plant(kind, path, victim)
    with pytest.raises(NotOurs, match=f"^{path} "):
        SessionLock(str(path)).acquire(timeout=1)
    untouched(victim)


def test_a_lock_file_of_ours_left_0644_is_made_0600(tmp_path):
    path = tmp_path / "s1.lock"
    path.write_text("123\n")
    os.chmod(path, 0o644)
    lock = SessionLock(str(path))
    assert lock.acquire(timeout=1)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    lock.release()


# -- the log -------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", PLANTED)
def test_the_log_refuses_what_is_not_a_plain_file_of_ours(tmp_path, victim, kind):
    path = tmp_path / "s1.log"
    plant(kind, path, victim)
    with pytest.raises(NotOurs, match=f"^{path} "):
        stop = logs.setup("tok", "INFO", str(path))
        logging.getLogger("lich_control.test").warning("written through")
        stop()
    untouched(victim)


def test_a_link_planted_at_a_rotation_is_not_written_through_and_the_daemon_goes_on(tmp_path, victim, capfd):
    path = tmp_path / "s1.log"
    handler = logs.PrivateRotatingFile(str(path), maxBytes=200, backupCount=2, encoding="utf-8")

    def rotate_then_plant(source, dest):  # the moment a racing hand would choose
        os.rename(source, dest)
        os.symlink(victim, source)

    handler.rotator = rotate_then_plant
    log = logging.getLogger("lich_control.rotation-test")
    log.addHandler(handler)
    logging.getLogger("lich_control").addHandler(stderr := logging.StreamHandler(sys.stderr))
    try:
        for i in range(20):
            log.warning("line %d, long enough to fill the file soon", i)
    finally:
        log.removeHandler(handler)
        logging.getLogger("lich_control").removeHandler(stderr)
        handler.close()
    untouched(victim)
    assert handler.given_up
    err = capfd.readouterr().err
    assert f"no more log file: {path} is a symbolic link" in err and "Traceback" not in err


# -- the socket ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["symlink", "fifo", "hard-link", "folder"])
def test_the_socket_is_bound_only_where_nothing_but_a_socket_of_ours_was(tmp_path, victim, kind):
    path = tmp_path / "s1.sock"
    plant(kind, path, victim)
    server = UnixHttpServer(str(path), Routes(None, None, dict, BadMessage))
    with pytest.raises(NotOurs, match=f"^{path} "):
        server.listen()
    assert os.path.lexists(path) and not stat.S_ISSOCK(os.lstat(path).st_mode)  # left as it was
    untouched(victim)


# -- the run folder ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o770, 0o757], ids=oct)
def test_a_folder_others_can_write_is_refused_and_its_mode_left_alone(tmp_path, mode):
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, mode)
    with pytest.raises(BadConfig, match=f"^the run folder {folder} is writable by other users .*set LICH_CONTROL_RUN_DIR to a private folder$"):
        ensure_run_dir(str(folder))
    assert stat.S_IMODE(os.stat(folder).st_mode) == mode


def test_a_run_folder_that_is_a_link_is_refused_even_to_a_private_folder(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    os.symlink(real, link)
    with pytest.raises(BadConfig, match="is a symbolic link"):
        ensure_run_dir(str(link))


@ROOT_ONLY
def test_a_run_folder_of_another_user_is_refused_and_left_alone(tmp_path):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, OTHER_UID, -1)
    with pytest.raises(BadConfig, match="belongs to another user"):
        ensure_run_dir(str(folder))
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700 and os.stat(folder).st_uid == OTHER_UID


# -- the daemon: exit 2 and one line -----------------------------------------------------------


def daemon(daemon_env, **env):
    return subprocess.run(
        [sys.executable, "-m", "lich_control.daemon"], cwd=procs.ROOT, env=procs.daemon_env(**dict(daemon_env, **env)),
        stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
    )


@pytest.mark.parametrize("name", ["s1.lock", "s1.log", "s1.sock"])
def test_the_daemon_refuses_a_link_planted_in_its_run_folder(daemon_env, run_dir, lich, victim, name):
    planted = os.path.join(run_dir, name)
    os.symlink(victim, planted)
    done = daemon(daemon_env)
    lines = done.stderr.decode().splitlines()
    assert (done.returncode, done.stdout, len(lines)) == (2, b"", 1), done
    assert lines[0] == f"lich-control: {planted} is a symbolic link, not a file the daemon made: it will not write through it; remove it"
    untouched(victim)
    assert os.path.islink(planted) and not os.path.exists(os.path.join(run_dir, "s1.lock" if name != "s1.lock" else "s1.sock"))
    assert lich.record.polls == []


def test_the_daemon_refuses_a_shared_sticky_folder_and_leaves_its_mode(daemon_env, tmp_path, lich):
    shared = tmp_path / "tmp"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    done = daemon(daemon_env, LICH_CONTROL_RUN_DIR=str(shared))
    lines = done.stderr.decode().splitlines()
    assert (done.returncode, len(lines)) == (2, 1) and "set LICH_CONTROL_RUN_DIR to a private folder" in lines[0]
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o1777 and os.listdir(shared) == []
