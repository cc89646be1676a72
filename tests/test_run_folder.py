"""The run folder: made private or refused, nothing planted in it written
through, and the session lock that admits one daemon per session."""
import os
import re
import stat
import threading
import time

import pytest

from conftest import symlinks

from lich_control.config import BadConfig
from lich_control.run_folder import LockHeld, NotOurs, check_socket, ensure, open_file, session_lock

MODES = pytest.mark.skipif(os.name == "nt", reason="Windows has no owner or mode bits to check (the profile's ACL keeps the run folder the user's)")
ROOT_ONLY = pytest.mark.skipif(os.name == "nt" or os.geteuid() != 0, reason="making a file of another user takes root (and a POSIX owner)")
UNIX_SOCKETS = pytest.mark.skipif(os.name == "nt", reason="no Unix socket on Windows: nothing checks a socket's name")
OTHER_UID = 54321


# -- the folder -----------------------------------------------------------------------------


@MODES
def test_a_run_folder_it_creates_is_0700_whatever_the_umask(tmp_path):
    folder = tmp_path / "run"
    old = os.umask(0o277)  # would leave it 0500, unusable
    try:
        ensure(str(folder))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_a_run_folder_that_cannot_be_made_is_refused_in_one_line_naming_the_variable(tmp_path):
    (tmp_path / "home").write_text("a file where the folder should go")
    folder = tmp_path / "home" / ".cache" / "lich-control" / "run"
    with pytest.raises(BadConfig) as refused:
        ensure(str(folder))
    assert str(refused.value).startswith(f"cannot create the run folder {folder}: ")
    assert str(refused.value).endswith("; set LICH_CONTROL_RUN_DIR to a folder you can write")
    assert "\n" not in str(refused.value)


@MODES
def test_an_existing_private_enough_run_folder_is_used_as_it_is(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    os.chmod(folder, 0o755)
    ensure(str(folder))
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o755


@MODES
@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o770, 0o757], ids=oct)
def test_a_folder_others_can_write_is_refused_and_its_mode_left_alone(tmp_path, mode):
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, mode)
    with pytest.raises(BadConfig, match=f"^the run folder {folder} is writable by other users .*set LICH_CONTROL_RUN_DIR to a private folder$"):
        ensure(str(folder))
    assert stat.S_IMODE(os.stat(folder).st_mode) == mode


@symlinks
def test_a_run_folder_that_is_a_link_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.symlink(real, tmp_path / "link")
    with pytest.raises(BadConfig, match="is a symbolic link"):
        ensure(str(tmp_path / "link"))


def test_a_run_folder_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(BadConfig, match="is not a folder"):
        ensure(str(tmp_path / "file"))


@ROOT_ONLY
def test_a_run_folder_of_another_user_is_refused_and_left_alone(tmp_path):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, OTHER_UID, -1)
    with pytest.raises(BadConfig, match="belongs to another user"):
        ensure(str(folder))
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700 and os.stat(folder).st_uid == OTHER_UID


# -- a file in it ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [pytest.param("symlink", marks=symlinks), pytest.param("dangling-symlink", marks=symlinks), "folder", pytest.param("other-users", marks=ROOT_ONLY)])
def test_what_is_not_a_plain_file_of_ours_is_refused_and_never_written_through(tmp_path, kind):
    victim, path = tmp_path / "victim", tmp_path / "s1.log"
    victim.write_text("theirs")
    if kind == "symlink":
        os.symlink(victim, path)
    elif kind == "dangling-symlink":
        os.symlink(tmp_path / "new", path)
    elif kind == "folder":
        path.mkdir()
    else:
        path.write_text("theirs")
        os.chown(path, OTHER_UID, -1)
    with pytest.raises(NotOurs, match=f"^{re.escape(str(path))} .*not a file the daemon made: it will not write through it; remove it$"):
        open_file(str(path), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    assert victim.read_text() == "theirs" and not (tmp_path / "new").exists()


@MODES
def test_a_file_of_ours_left_0644_is_made_0600_through_its_descriptor(tmp_path):
    path = tmp_path / "s1.log"
    path.write_text("old\n")
    os.chmod(path, 0o644)
    os.close(open_file(str(path), os.O_WRONLY | os.O_APPEND))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


@UNIX_SOCKETS
def test_only_a_socket_or_nothing_may_be_at_the_sockets_name(tmp_path):
    check_socket(str(tmp_path / "none.sock"))
    (tmp_path / "file.sock").write_text("")
    with pytest.raises(NotOurs, match="is not a socket"):
        check_socket(str(tmp_path / "file.sock"))


# -- the session lock ----------------------------------------------------------------------------


def test_the_lock_admits_one_holder_and_its_file_stays(tmp_path):
    path = str(tmp_path / "s1.lock")
    with session_lock(path, "s1", wait=0):
        with pytest.raises(LockHeld, match="^another daemon is still polling for session s1; exiting, to be started again once it is gone$"):
            with session_lock(path, "s1", wait=0):
                pass
        assert open(path).read() == f"{os.getpid()}\n"
    assert os.path.exists(path)  # every daemon locks this same file
    with session_lock(path, "s1", wait=0):
        pass


def test_a_second_holder_gets_the_lock_once_the_first_lets_go_within_its_wait(tmp_path):
    path = str(tmp_path / "s1.lock")
    first = session_lock(path, "s1", wait=0)
    first.__enter__()
    threading.Timer(0.2, first.__exit__, (None, None, None)).start()
    began = time.monotonic()
    with session_lock(path, "s1", wait=10):
        assert time.monotonic() - began < 5


@symlinks
def test_the_lock_refuses_a_link_planted_at_its_name(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("theirs")
    os.symlink(victim, tmp_path / "s1.lock")
    with pytest.raises(NotOurs, match="is a symbolic link"):
        with session_lock(str(tmp_path / "s1.lock"), "s1", wait=0):
            pass
    assert victim.read_text() == "theirs"
