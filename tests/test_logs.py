import logging
import os

from lich_control import logs
from lich_control.lifeline import SessionLock

SECRET = "tok/en+with&odd=chars"


def test_the_token_never_reaches_a_log_line(tmp_path, capfd):
    path = tmp_path / "s1.log"
    stop = logs.setup(SECRET, "DEBUG", str(path))
    try:
        log = logging.getLogger("lich_control.test")
        log.warning("url was http://x/?token=%s", SECRET)
        log.info("quoted: %s", "tok%2Fen%2Bwith%26odd%3Dchars")
        try:
            raise ValueError(f"boom {SECRET}")
        except ValueError:
            log.exception("failed with %s", SECRET)
    finally:
        stop()
    written = path.read_text() + capfd.readouterr().err
    assert "[token]" in written and "boom" in written and "quoted: [token]" in written
    assert SECRET not in written and "tok%2Fen%2Bwith%26odd%3Dchars" not in written


def test_stop_writes_every_queued_line(tmp_path):
    path = tmp_path / "s1.log"
    stop = logs.setup("tok-9x", "INFO", str(path))
    log = logging.getLogger("lich_control.test")
    for i in range(500):
        log.info("line %d", i)
    stop()
    lines = path.read_text().splitlines()
    assert len(lines) == 500 and lines[-1].endswith("line 499")


def test_the_level_decides_what_is_written(tmp_path):
    path = tmp_path / "s1.log"
    stop = logs.setup("tok-9x", "warning", str(path))
    log = logging.getLogger("lich_control.test")
    log.info("not this")
    log.warning("but this")
    stop()
    assert "not this" not in path.read_text() and "but this" in path.read_text()


def test_the_log_file_and_every_rotation_are_0600(tmp_path):
    path = str(tmp_path / "s2.log")
    handler = logs.PrivateRotatingFile(path, maxBytes=200, backupCount=2, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(message)s"))
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "y" * 120, None, None)
    for _ in range(6):
        handler.emit(record)
    handler.close()
    names = sorted(os.listdir(tmp_path))
    assert names == ["s2.log", "s2.log.1", "s2.log.2"]
    assert all((os.stat(tmp_path / n).st_mode & 0o777) == 0o600 for n in names)
    assert os.path.getsize(path) < 400


def test_a_session_lock_admits_one_holder_and_is_removed_on_release(tmp_path):
    path = str(tmp_path / "s1.lock")
    first, second = SessionLock(path), SessionLock(path)
    assert first.acquire(0)
    assert not second.acquire(0)  # held: refused at once
    first.release()
    assert not (tmp_path / "s1.lock").exists()
    third = SessionLock(path)
    assert third.acquire(0)
    third.release()


def test_urllib3s_warnings_are_redacted_and_its_debug_lines_never_written(tmp_path):
    path = tmp_path / "s1.log"
    stop = logs.setup(SECRET, "DEBUG", str(path))
    try:
        wire = logging.getLogger("urllib3.connectionpool")
        wire.debug('http://127.0.0.1:1 "GET /mod/commands?token=%s HTTP/1.1" 200 2', SECRET)
        wire.warning("Retrying after connection broken: /mod/commands?token=%s", SECRET)
    finally:
        stop()
    written = path.read_text()
    assert "Retrying after connection broken: /mod/commands?token=[token]" in written
    assert "GET /mod/commands" not in written and SECRET not in written


def test_a_lone_surrogate_is_logged_escaped(tmp_path, capfd):
    path = tmp_path / "s1.log"
    stop = logs.setup("tok-9x", "INFO", str(path))
    try:
        logging.getLogger("lich_control.test").info("lich sent %s again", "m\udc80")
    finally:
        stop()
    assert "lich sent m\\udc80 again" in path.read_text()
    assert "Logging error" not in capfd.readouterr().err
