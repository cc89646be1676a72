import logging

from lich_control import logs
from lich_control.lifeline import SessionLock

SECRET = "tok/en+with&odd=chars"


def test_the_token_never_reaches_a_log_line(tmp_path, capsys):
    path = tmp_path / "s1.log"
    root = logging.getLogger("lich_control")
    before = list(root.handlers)
    logs.setup(SECRET, "DEBUG", str(path))
    try:
        log = logging.getLogger("lich_control.test")
        log.warning("url was http://x/?token=%s", SECRET)
        log.info("quoted: %s", "tok%2Fen%2Bwith%26odd%3Dchars")
        try:
            raise ValueError(f"boom {SECRET}")
        except ValueError:
            log.exception("failed with %s", SECRET)
    finally:
        for handler in root.handlers[len(before):]:
            handler.close()
            root.removeHandler(handler)
    written = path.read_text() + capsys.readouterr().err
    assert "[token]" in written and "boom" in written
    assert SECRET not in written and "tok%2Fen%2Bwith%26odd%3Dchars" not in written


def test_the_log_file_is_0600(tmp_path):
    path = tmp_path / "s2.log"
    logs._create_private(str(path))
    assert (path.stat().st_mode & 0o777) == 0o600


def test_urllib3_request_lines_are_kept_below_debug(tmp_path):
    root = logging.getLogger("lich_control")
    before = list(root.handlers)
    logs.setup(SECRET, "DEBUG", None)
    for handler in root.handlers[len(before):]:
        root.removeHandler(handler)
    assert logging.getLogger("urllib3").getEffectiveLevel() >= logging.WARNING


def test_a_session_lock_admits_one_holder_and_is_removed_on_release(tmp_path):
    path = str(tmp_path / "s1.lock")
    first, second = SessionLock(path), SessionLock(path)
    assert first.acquire(0)
    assert not second.acquire(0.05)
    first.release()
    assert not (tmp_path / "s1.lock").exists()
    third = SessionLock(path)
    assert third.acquire(0)
    third.release()
