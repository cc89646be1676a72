"""Logging: every line made safe (the token out, escaped, cut), a private
rotating file that gives up rather than write through what it did not
make, and a stderr that never makes a thread wait."""
import logging
import os
import select
import signal
import sys
import threading
from urllib.parse import quote

import pytest

from conftest import symlinks

from lich_control import logs
from lich_control.logs import Logs, Redactor, escape
from lich_control.run_folder import NotOurs
from lich_dev.faults import AckAnswer

from relay import full_pipe

SECRET = "tok/en+with&odd=chars"
WAIT = 10.0


def written_by(tmp_path, *lines, level="DEBUG", logger="lich_control.test"):
    """What the log file holds once `lines` (callables taking the logger) ran."""
    path = tmp_path / "s1.log"
    setup = Logs(Redactor(SECRET), level, str(path))
    for line in lines:
        line(logging.getLogger(logger))
    setup.close()
    return path.read_text(encoding="utf-8")


# -- safe text -------------------------------------------------------------------------------


@pytest.mark.parametrize("form", [SECRET, quote(SECRET, safe=""), quote(SECRET), "tok%2fen%2bwith%26odd%3dchars"])
def test_the_token_is_redacted_in_each_form_a_url_gives_it(form):
    assert Redactor(SECRET).redact(f"GET /mod/acks?token={form} HTTP/1.1") == "GET /mod/acks?token=[token] HTTP/1.1"


def test_the_bridges_secret_is_redacted_beside_the_token_in_the_log_file(tmp_path):
    bridge = "Bq-5ecret_of-the-bridge"
    path = tmp_path / "s1.log"
    setup = Logs(Redactor(SECRET, bridge), "INFO", str(path))
    logging.getLogger("lich_control.test").warning("X-Lich-Control-Secret: %s, token=%s", bridge, quote(SECRET, safe=""))
    setup.close()
    written = path.read_text(encoding="utf-8")
    assert "X-Lich-Control-Secret: [token], token=[token]" in written and bridge not in written


@pytest.mark.parametrize(
    "char",
    ["\n", "\r", "\x1b", "\x00", "\x7f", "\x9b", "\udc80", "\u2028", "\u2029", "\u202e", "\u200b", "\ufeff", "\u2066", "\u00ad"],
    ids=repr,
)
def test_control_invisible_and_bidirectional_characters_are_escaped(char):
    shown = escape(f"m1{char}x", 200)
    assert shown == "m1" + char.encode("unicode_escape").decode() + "x" and shown.isprintable()


def test_a_cut_falls_between_escapes_never_inside_one():
    assert escape("a" * 300, 200) == "a" * 199 + "…"
    assert escape("ab\u202ecd", 200) == "ab\\u202ecd"
    assert escape("abc\u202e", 8) == "abc…"  # `\u202e` would not fit whole
    assert escape("日本語", 200) == "日本語"


# -- the log filter ---------------------------------------------------------------------------


def test_the_token_never_reaches_a_log_line(tmp_path, capfd):
    def lines(log):
        log.warning("url was http://x/?token=%s", SECRET)
        log.info("quoted: %s", quote(SECRET, safe=""))
        try:
            raise ValueError(f"boom {SECRET}")
        except ValueError:
            log.exception("failed with %s", SECRET)

    written = written_by(tmp_path, lines) + capfd.readouterr().err
    assert "[token]" in written and "boom" in written and "quoted: [token]" in written
    assert SECRET not in written and quote(SECRET, safe="") not in written


def test_an_uncaught_exception_in_a_thread_or_the_main_one_is_logged_redacted_never_written_raw(tmp_path, capfd):
    def lines(log):
        def fail():
            raise ConnectionError(f"GET http://127.0.0.1/mod/commands?token={quote(SECRET, safe='')}")

        thread = threading.Thread(target=fail, name="lich-test")
        thread.start()
        thread.join(WAIT)
        sys.excepthook(*exc_info_of(ValueError(f"boom {SECRET}")))

    written = written_by(tmp_path, lines) + capfd.readouterr().err
    assert "uncaught exception in thread lich-test" in written and "token=[token]" in written and "boom [token]" in written
    assert SECRET not in written and quote(SECRET, safe="") not in written


def exc_info_of(exc):
    try:
        raise exc
    except type(exc):
        return sys.exc_info()


def test_a_newline_or_a_bidirectional_mark_in_an_id_cannot_forge_a_line_and_a_traceback_keeps_its_lines(tmp_path):
    def lines(log):
        log.info("acked %s (abort)", "m1\n2026-12-01 00:00:00,000 INFO lich_control.worker: forged\x1b]0;x\x07\u202e")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed")

    lines_ = written_by(tmp_path, lines).splitlines()
    assert not any(line.startswith("2026-12-01 00:00:00,000") for line in lines_)
    assert any(line.endswith("acked m1\\n2026-12-01 00:00:00,000 INFO lich_control.worker: forged\\x1b]0;x\\x07\\u202e (abort)") for line in lines_)
    frames = lines_[lines_.index("Traceback (most recent call last):") + 1 :]
    assert frames[0].startswith('  File "') and frames[-1] == "ValueError: boom"


def test_a_15_mb_message_is_not_a_15_mb_log_line(tmp_path):
    written = written_by(tmp_path, lambda log: log.warning("lich sent kind %s", "k" * 15_000_000 + SECRET))
    assert len(written) < 5_000 and written.rstrip("\n").endswith("…")


def test_urllib3s_warnings_are_redacted_and_its_debug_lines_never_written(tmp_path):
    def lines(log):
        log.debug('http://127.0.0.1:1 "GET /mod/commands?token=%s HTTP/1.1" 200 2', SECRET)
        log.warning("Retrying after connection broken: /mod/commands?token=%s", SECRET)

    written = written_by(tmp_path, lines, logger="urllib3.connectionpool")
    assert "Retrying after connection broken: /mod/commands?token=[token]" in written
    assert "GET /mod/commands" not in written and SECRET not in written


def test_the_level_decides_what_is_written_and_close_writes_every_line(tmp_path):
    def lines(log):
        log.info("not this")
        for i in range(500):
            log.warning("line %d", i)

    written = written_by(tmp_path, lines, level="warning").splitlines()
    assert len(written) == 500 and written[-1].endswith("line 499")


def test_close_puts_back_everything_the_setup_changed(tmp_path):
    touched = [logging.getLogger("lich_control"), logging.getLogger("urllib3")]
    hooks = sys.excepthook, threading.excepthook
    before = [(lg.level, lg.propagate, list(lg.handlers)) for lg in touched]
    Logs(Redactor(SECRET), "DEBUG", str(tmp_path / "s1.log")).close()
    assert [(lg.level, lg.propagate, list(lg.handlers)) for lg in touched] == before
    assert (sys.excepthook, threading.excepthook) == hooks


# -- the file --------------------------------------------------------------------------------


@pytest.mark.skipif(os.name == "nt", reason="Windows has no mode bits: the profile's ACL keeps the run folder the user's")
def test_the_log_file_and_every_rotation_are_0600(tmp_path):
    path = str(tmp_path / "s2.log")
    handler = logs.PrivateRotatingFile(path, maxBytes=200, backupCount=2, encoding="utf-8")
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "y" * 120, None, None)
    for _ in range(6):
        handler.emit(record)
    handler.close()
    names = sorted(os.listdir(tmp_path))
    assert names == ["s2.log", "s2.log.1", "s2.log.2"]
    assert all((os.stat(tmp_path / n).st_mode & 0o777) == 0o600 for n in names)


@symlinks
def test_a_link_at_the_logs_name_stops_the_start(tmp_path):
    os.symlink(tmp_path / "elsewhere", tmp_path / "s1.log")
    with pytest.raises(NotOurs, match="is a symbolic link"):
        Logs(Redactor(SECRET), "INFO", str(tmp_path / "s1.log"))
    assert not (tmp_path / "elsewhere").exists()


@symlinks
def test_a_link_planted_at_a_rotation_is_never_written_through_said_once_and_outlived(tmp_path):
    path, victim = tmp_path / "s1.log", tmp_path / "victim"
    victim.write_text("theirs")
    said = []
    handler = logs.PrivateRotatingFile(str(path), say=said.append, maxBytes=200, backupCount=2, encoding="utf-8")

    def rotate_then_plant(source, dest):  # the moment a racing hand would choose
        os.rename(source, dest)
        os.symlink(victim, source)

    handler.rotator = rotate_then_plant
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "a line long enough to fill the file soon", None, None)
    for _ in range(20):
        handler.handle(record)
    assert victim.read_text() == "theirs"
    assert said == [f"lich-control: writing the log file {path} failed ({path} is a symbolic link, not a file the daemon made: it will not write through it; remove it): its lines are lost until a write works again"]
    os.unlink(path)
    handler.rotator = None
    handler.handle(record)
    handler.close()
    assert path.read_text().count("a line long enough") == 1 and len(said) == 1


def test_a_log_file_that_cannot_be_written_is_said_once_and_never_with_a_traceback(tmp_path, capfd):
    # logging's own handleError printed a traceback per failed line, with a
    # blocking write to stderr: with the relay not reading it, the worker
    # blocked in its ack's log line and every later command waited.
    path, said = tmp_path / "s1.log", []
    handler = logs.PrivateRotatingFile(str(path), say=said.append, encoding="utf-8", delay=True)
    handler.stream = open("/dev/full", "w", encoding="utf-8")  # every write fails, as on a full disk
    for _ in range(3):
        handler.handle(logging.LogRecord("x", logging.INFO, __file__, 1, "a line", None, None))
    handler.close()  # its last flush fails too: no crash on the way out
    assert said == [f"lich-control: writing the log file {path} failed (ENOSPC): its lines are lost until a write works again"]
    assert capfd.readouterr().err == ""


# -- stderr ----------------------------------------------------------------------------------


def test_a_full_stderr_drops_lines_and_counts_them_without_waiting(tmp_path):
    read_fd, write_fd = full_pipe()
    handler = logs.StderrLines(write_fd)
    handler.setFormatter(logging.Formatter("%(message)s"))
    try:
        for n in range(3):
            handler.handle(logging.LogRecord("x", logging.WARNING, __file__, 1, f"line {n}", None, None))
        assert handler.dropped == 3
        os.read(read_fd, 1 << 20)  # room again
        handler.handle(logging.LogRecord("x", logging.WARNING, __file__, 1, "line 3", None, None))
        assert os.read(read_fd, 1 << 16).endswith(b"line 3\n") and handler.dropped == 3
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_a_line_goes_out_in_one_write_a_pipe_takes_whole():
    assert logs.one_write("short") == b"short\n"
    long = logs.one_write("字" * 10000)
    assert len(long) <= logs.ONE_WRITE and long.endswith(b"...\n")
    long.decode("utf-8")  # never cut inside a character


def test_a_stderr_nobody_reads_holds_back_no_command_nor_the_exit_and_the_status_counts_its_lost_lines(relay, lich):
    read_fd, write_fd = full_pipe()
    r = relay(stderr=write_fd)
    try:
        r.wait_hello()
        assert lich.wait_polled("s1", WAIT, parked=True)
        lich.faults.script_acks(AckAnswer(status=400), AckAnswer(status=400))  # each a warning line
        lich.queue_all("s1", [{"id": "m1", "kind": "rewind"}, {"id": "m2", "kind": "rewind"}, {"id": "m3", "kind": "rewind"}])
        assert lich.record.ack_for("m3")["error"] == "unknown kind"
        assert r.wait_status(lambda s: s["daemon"]["stderr_dropped"] == 2, WAIT)
        with open(os.path.join(r.run_dir, "s1.log"), encoding="utf-8") as f:
            assert "refused the ack for m1" in f.read()  # the log file has every line
        if os.name != "nt":  # Windows has no signal to stop it by (test_daemon.py): its stop kills it
            r.proc.send_signal(signal.SIGTERM)
            assert r.wait_exit(2.0) == 0
    finally:
        r.stop()
        os.close(read_fd)
        os.close(write_fd)
