import os

import pytest

from lich_control.config import BadConfig, Config, NotInLich, expected_parent, lock_wait, parse_port, run_dir, session_path

WINDOWS = os.name == "nt"

POSIX = pytest.mark.skipif(WINDOWS, reason="Windows' run folder is in LOCALAPPDATA (tested below); no XDG, no uid")
FULL = {"LICH_PORT": "4242", "LICH_TOKEN": "t", "LICH_SESSION_ID": "s1", "LICH_CONTROL_RUN_DIR": "/tmp/r"}


@pytest.mark.parametrize("missing", ["LICH_PORT", "LICH_TOKEN", "LICH_SESSION_ID"])
def test_any_variable_missing_or_empty_means_outside_lich(missing):
    with pytest.raises(NotInLich):
        Config.from_env({k: v for k, v in FULL.items() if k != missing})
    with pytest.raises(NotInLich):
        Config.from_env(dict(FULL, **{missing: ""}))


def test_a_full_environment_gives_lich_on_loopback():
    config = Config.from_env(FULL)
    assert (config.lich_url, config.session_id) == ("http://127.0.0.1:4242", "s1")


@pytest.mark.parametrize("raw", ["0", "65536", "-5", "x", "", "4 2", "１２"])
def test_a_port_outside_1_to_65535_is_refused_naming_the_problem(raw):
    with pytest.raises(BadConfig, match="LICH_PORT must be a port number from 1 to 65535"):
        parse_port(raw)


def test_ports_at_the_edges_are_taken():
    assert (parse_port("1"), parse_port("65535")) == (1, 65535)


@POSIX
def test_the_run_folder_follows_the_documented_order(tmp_path):
    assert run_dir({"LICH_CONTROL_RUN_DIR": "/a", "XDG_RUNTIME_DIR": str(tmp_path)}) == "/a"
    assert run_dir({"XDG_RUNTIME_DIR": str(tmp_path)}) == str(tmp_path / "lich-control")
    # Not the temporary folder, which lich's macOS profile does not let a session write.
    assert run_dir({"HOME": "/home/u"}) == "/home/u/.cache/lich-control/run"
    # Removed at the user's last logout, and not ours to make again.
    assert run_dir({"XDG_RUNTIME_DIR": str(tmp_path / "gone"), "HOME": "/home/u"}) == run_dir({"HOME": "/home/u"})


# lich makes a window's session id a UUID, the CLI's 32 hex characters; a
# Mac's short user name is rarely longer than 40 bytes (45 still fit).
@POSIX
@pytest.mark.parametrize("name", ["ann", "christopher.montgomery-smith", "a" * 40])
@pytest.mark.parametrize("session_id", ["0f8e3c2a-9b1d-4c5e-8f7a-6b2d1e0c9a84", "0f8e3c2a9b1d4c5e8f7a6b2d1e0c9a84"])
def test_on_a_mac_the_default_socket_fits_macos_104_bytes_for_a_long_name_and_either_session_id(name, session_id):
    home = f"/Users/{name}"
    config = Config.from_env(dict(FULL, LICH_CONTROL_RUN_DIR="", LICH_SESSION_ID=session_id, HOME=home))
    assert config.run_dir == f"{home}/.cache/lich-control/run"
    assert len(os.fsencode(config.path("sock"))) < 104


@pytest.mark.skipif(not WINDOWS, reason="Windows' own run folder")
def test_on_windows_the_run_folder_is_in_local_app_data_unless_set(tmp_path):
    assert run_dir({"LOCALAPPDATA": str(tmp_path)}) == os.path.join(str(tmp_path), "lich-control", "run")
    assert run_dir({"LICH_CONTROL_RUN_DIR": str(tmp_path / "r"), "LOCALAPPDATA": str(tmp_path)}) == str(tmp_path / "r")
    assert run_dir({}) == os.path.join(os.path.expanduser("~"), "AppData", "Local", "lich-control", "run")


@POSIX
def test_a_relative_run_folder_is_made_absolute_and_a_relative_xdg_folder_ignored(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_dir({"LICH_CONTROL_RUN_DIR": "run"}) == str(tmp_path / "run")
    assert run_dir({"XDG_RUNTIME_DIR": "xdg"}) == run_dir({})  # the XDG spec: a relative path is invalid


def test_the_lock_wait_is_5_s_unless_set_to_a_number():
    assert (lock_wait({}), lock_wait({"LICH_CONTROL_LOCK_WAIT": "0.5"}), lock_wait({"LICH_CONTROL_LOCK_WAIT": "soon"})) == (5.0, 0.5, 5.0)


def test_a_plain_session_id_names_its_files():
    assert session_path("/r", "card-7", "sock") == os.path.join("/r", "card-7.sock")


@pytest.mark.parametrize("session", ["../escape", "a/b", "x" * 80, ".hidden", "sp ace"])
def test_an_awkward_session_id_gets_a_short_hashed_name(session):
    path = session_path("/r", session, "sock")
    assert os.path.dirname(path) == "/r" and os.path.basename(path).startswith("s-")
    assert session_path("/r", session, "sock") == path  # stable


def test_a_long_run_folder_falls_back_to_the_hashed_name():
    folder = "/tmp/" + "d" * 90
    assert os.path.basename(session_path(folder, "s1", "sock")).startswith("s-")


@pytest.mark.parametrize("name", ["LICH_TOKEN", "LICH_SESSION_ID", "LICH_CONTROL_RUN_DIR"])
def test_a_variable_whose_bytes_were_not_utf8_is_refused_without_its_value(name):
    # os.environ keeps bytes that are not UTF-8 as lone surrogates.
    with pytest.raises(BadConfig, match="is not valid UTF-8") as caught:
        Config.from_env(dict(FULL, **{name: "/secret-\udcff"}))
    assert "secret" not in str(caught.value) and "udcff" not in str(caught.value)
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_a_socket_path_too_long_for_a_bridge_server_is_refused_naming_the_variable_to_set():
    folder = "/tmp/" + "d" * 100
    if WINDOWS:  # no Unix socket there: its address file has no such limit
        assert Config.from_env(dict(FULL, LICH_CONTROL_RUN_DIR=folder)).run_dir == os.path.abspath(folder)
        return
    with pytest.raises(BadConfig, match="too long for a Unix socket; set LICH_CONTROL_RUN_DIR to a shorter folder"):
        Config.from_env(dict(FULL, LICH_CONTROL_RUN_DIR=folder))


def test_the_parent_is_the_one_the_spawner_names_else_the_one_found_at_the_start():
    assert (expected_parent({"LICH_CONTROL_PARENT_PID": "42"}, 7), expected_parent({}, 7)) == (42, 7)
    with pytest.raises(BadConfig, match="^LICH_CONTROL_PARENT_PID must be the spawner's process id, not 'me'$"):
        expected_parent({"LICH_CONTROL_PARENT_PID": "me"}, 7)
