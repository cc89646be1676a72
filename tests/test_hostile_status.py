"""The status document, lich-mod-status and the log under hostile text: the
token never shows, what lich sends cannot bloat them, and no id or text can
crash them or forge a line.

The unit tests feed Activity and the log filter directly; the integration
tests go through a real daemon, the development lich and lich-mod-status
as a person runs it."""
import json
import logging
import os
import subprocess
import sys
from urllib.parse import quote

import pytest

from conftest import SCAN_TOKEN
from lich_control import logs
from lich_dev.faults import AckAnswer, Answer
from lich_dev.procs import ROOT, daemon_env
from lich_control.bridge import Overrides, Turns
from lich_control.status import Activity
from lich_control.unix_socket import unix_request

TOKEN = "tok/en+with&odd=chars"
QUOTED = quote(TOKEN, safe="")
WAIT = 10.0


def activity(token=False):
    """An Activity as the daemon makes it: with the token's `clean`, or (for
    what holds without it) its default, which cuts and escapes."""
    if not token:
        return Activity("s1", "relay", Turns())
    from lich_control.safe_text import Scrub  # here: each test fails on its own claim before the fix

    return Activity("s1", "relay", Turns(), clean=Scrub.of(TOKEN))


def strings(value):
    """Every string in a JSON-like document, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


# -- the token ------------------------------------------------------------------


def test_no_text_given_to_activity_brings_the_token_into_the_document():
    said = f"lich said: GET /mod/acks?token={QUOTED} (raw {TOKEN})"
    a = activity(token=True)
    a.poll_failed(said, 1.0)
    a.received(f"m{TOKEN}", f"kind{QUOTED}")
    a.received("m2", "prompt")
    a.waiting("m2", said)
    a.acked(f"m{TOKEN}", f"kind{QUOTED}", False, said, sent=said)
    a.abandoned(said, said)
    a.error(said)
    a.set_overrides(Overrides(model=said, effort=said))
    doc = json.dumps(a.snapshot(), ensure_ascii=False)
    a.poll_stopped(said)
    doc += json.dumps(a.snapshot(), ensure_ascii=False)
    assert TOKEN not in doc and QUOTED not in doc
    assert "token=[token] (raw [token])" in doc


def test_the_log_and_the_status_share_one_redaction():
    from lich_control.safe_text import Scrub

    scrub = Scrub.of(TOKEN)
    record = logging.LogRecord("lich_control.x", logging.WARNING, __file__, 1, "url %s", (f"?token={QUOTED}",), None)
    logs.Redact(TOKEN).filter(record)
    assert record.getMessage() == f"url {scrub(f'?token={QUOTED}')}" == "url ?token=[token]"
    assert scrub(f"/{quote(TOKEN)}/") == "/[token]/"  # quoted with its `/` left as it is
    assert TOKEN not in repr(scrub) and QUOTED not in repr(scrub)


# -- bounded --------------------------------------------------------------------


def test_a_15_mb_kind_id_and_error_are_cut_as_they_enter():
    huge = "k" * 15_000_000
    a = activity()
    a.received(huge, huge)
    a.received("m2", huge)
    a.acked(huge, huge, False, huge, sent=huge)
    a.poll_failed(huge, 1.0)
    a.error(huge)
    doc = a.snapshot()
    assert len(json.dumps(doc)) < 20_000
    (entry,) = doc["in_flight"]
    assert entry["kind"] == "k" * 199 + "…"
    assert doc["recent"][0]["id"] == "k" * 199 + "…"


def test_counts_name_at_most_16_kinds_and_count_the_rest_together():
    a = activity()
    for n in range(20_000):
        a.acked(f"m{n}", f"kind-{n}", n % 2 == 0, None if n % 2 == 0 else "unknown kind", sent=None)
    a.acked("m-p", "prompt", True, None, sent=None)  # a contract kind is always named
    counts = a.snapshot()["counts"]
    assert len(counts) <= 17 and "prompt" in counts
    assert sum(c["ok"] + c["failed"] for c in counts.values()) == 20_001
    other = counts["(other)"]
    assert other["ok"] + other["failed"] == 20_000 - (len(counts) - 2)


def test_in_flight_shows_the_oldest_50_and_how_many_more():
    a = activity()
    for n in range(1_000):
        a.received(f"m{n}", "prompt")
    doc = a.snapshot()
    assert [e["id"] for e in doc["in_flight"]] == [f"m{n}" for n in range(50)]
    assert doc["in_flight_more"] == 950


def test_ids_cut_alike_are_still_told_apart():
    first, second = "x" * 500 + "1", "x" * 500 + "2"
    a = activity()
    a.received(first, "prompt")
    a.received(second, "abort")
    a.acked(second, "abort", True, None, sent=None)
    (left,) = a.snapshot()["in_flight"]
    assert left["kind"] == "prompt"


# -- escaped --------------------------------------------------------------------


def test_control_characters_and_lone_surrogates_are_escaped_in_the_document():
    nasty = "m\udc80\n2026-12-01 INFO forged\x1b[31m\r\u2028"
    a = activity()
    a.received(nasty, nasty)
    a.acked(nasty, nasty, False, nasty, sent=nasty)
    a.received(nasty, nasty)
    a.error(nasty)
    doc = a.snapshot()
    json.dumps(doc, ensure_ascii=False).encode("utf-8")  # strict: no lone surrogate left
    for text in strings(doc):
        assert text.isprintable() or text == "", repr(text)
    assert doc["recent"][0]["id"] == "m\\udc80\\n2026-12-01 INFO forged\\x1b[31m\\r\\u2028"


def test_a_newline_in_a_logged_id_cannot_forge_a_line_and_a_traceback_keeps_its_lines(tmp_path, capfd):
    path = tmp_path / "s1.log"
    stop = logs.setup(TOKEN, "INFO", str(path))
    try:
        log = logging.getLogger("lich_control.test")
        log.info("acked %s (abort)", "m1\n2026-12-01 00:00:00,000 INFO lich_control.worker: forged\x1b]0;x\x07")
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed")
    finally:
        stop()
    lines = path.read_text().splitlines()
    assert not any(line.startswith("2026-12-01 00:00:00,000") for line in lines)
    assert any(line.endswith("acked m1\\n2026-12-01 00:00:00,000 INFO lich_control.worker: forged\\x1b]0;x\\x07 (abort)") for line in lines)
    frames = lines[lines.index("Traceback (most recent call last):") + 1 :]
    assert frames[0].startswith('  File "') and frames[-1] == "ValueError: boom"
    assert "\x1b" not in capfd.readouterr().err


def test_a_15_mb_message_is_not_a_15_mb_log_line(tmp_path):
    path = tmp_path / "s1.log"
    stop = logs.setup(TOKEN, "INFO", str(path))
    try:
        logging.getLogger("lich_control.test").warning("lich sent kind %s", "k" * 15_000_000 + TOKEN)
    finally:
        stop()
    written = path.read_text()
    assert len(written) < 5_000 and written.rstrip("\n").endswith("…")


# -- lich-mod-status --------------------------------------------------------------


def odd_status():
    """A status document as an older or broken daemon could give it."""
    nasty = "m\udc80\n\x1b[2Jforged"
    return {
        "daemon": {"pid": 1, "version": "0", "contract_release": "0", "session_id": "odd", "engine": "relay", "uptime_s": 1.0, "socket": "/x", "log_file": "/y"},
        "poll": {"state": "backing off", "reason": nasty, "backoff": 1.0, "retry_in_s": None, "last_poll_age_s": 1.0, "last_answer_age_s": None, "polls": 1, "failures": 1},
        "turn": nasty,
        "overrides": {"model": nasty, "effort": None},
        "in_flight": [{"id": nasty, "kind": nasty, "waiting_on": "worker", "age_s": 0.5}],
        "counts": {nasty: {"ok": 1, "failed": 0, "unsent": 0}},
        "recent": [{"id": nasty, "kind": nasty, "ok": False, "error": nasty, "took_ms": 1.0, "ack": "sent", "age_s": 1.0}],
        "errors": [{"what": nasty, "age_s": 1.0}],
    }


def lich_mod_status(run_dir, *args):
    env = daemon_env(LICH_CONTROL_RUN_DIR=run_dir, PYTHONIOENCODING="utf-8")
    env.pop("NO_COLOR", None)
    return subprocess.run([sys.executable, "-m", "lich_control.status_cli", *args], cwd=ROOT, env=env, capture_output=True, timeout=30)


def test_lich_mod_status_prints_whatever_a_document_holds(tmp_path):
    from lich_control.bridge import BadMessage
    from lich_control.unix_socket import Routes, UnixHttpServer

    server = UnixHttpServer(str(tmp_path / "odd.sock"), Routes(None, None, odd_status, BadMessage))
    server.listen()
    try:
        runs = {args: lich_mod_status(str(tmp_path), *args) for args in ((), ("--json",), ("odd",), ("odd", "--json"))}
    finally:
        server.close()
    for args, done in runs.items():
        assert (done.returncode, done.stderr) == (0, b""), args
        done.stdout.decode("utf-8")  # strict
        assert b"\x1b" not in done.stdout and b"\nforged" not in done.stdout, args
    assert "m\\udc80\\n\\x1b[2Jforged" in runs[("odd",)].stdout.decode()
    listed = json.loads(runs[("--json",)].stdout)
    assert listed["daemons"][0]["status"]["turn"] == odd_status()["turn"]
    assert json.loads(runs[("odd", "--json")].stdout)["status"]["errors"] == odd_status()["errors"]


# -- through a real daemon ---------------------------------------------------------


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
    for args in ((), ("--json",), ("s1",), ("s1", "--json")):
        done = lich_mod_status(run_dir, *args)
        assert done.returncode == 0, done.stderr
        shown.append(done.stdout + done.stderr)
    assert b"lich refused it: 400 no route for POST /mod/acks?token=[token] (token [token])" in shown[2 + 2]
    for form in (SCAN_TOKEN, quote(SCAN_TOKEN, safe=""), quote(SCAN_TOKEN)):
        assert not any(form.encode() in out for out in shown), form


def test_an_id_with_a_lone_surrogate_and_a_newline_is_acked_and_shown_escaped(lich, relay, run_dir):
    daemon = relay()
    daemon.wait_hello()
    daemon.autoanswer()
    lich.faults.script(Answer(raw=b'[{"id": "m\\udc80\\n2026-12-01 00:00:00,000 INFO forged", "kind": "abort"}]'))
    daemon.wait_status(lambda s: len(s["recent"]) == 1, WAIT)
    runs = [lich_mod_status(run_dir, *args) for args in ((), ("--json",), ("s1",), ("s1", "--json"))]
    for done in runs:
        assert (done.returncode, done.stderr) == (0, b"")
        done.stdout.decode("utf-8")  # strict
    assert "m\\udc80\\n2026-12-01 00:00:00,000 INFO forged" in runs[2].stdout.decode()
    assert json.loads(runs[3].stdout)["status"]["recent"][0]["id"] == "m\\udc80\\n2026-12-01 00:00:00,000 INFO forged"
    with open(os.path.join(run_dir, "s1.log"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert any("m\\udc80\\n2026-12-01" in line for line in lines)
    assert not any(line.startswith("2026-12-01 00:00:00,000 INFO forged") for line in lines)


# -- a LICH_* variable that is not UTF-8 ------------------------------------------------


@pytest.mark.parametrize("name", ["LICH_TOKEN", "LICH_SESSION_ID"])
def test_a_variable_that_is_not_utf8_is_a_bad_configuration(name, lich, tmp_path):
    run_dir = str(tmp_path / "run")
    env = {os.fsencode(k): os.fsencode(v) for k, v in daemon_env().items()}
    env.update({b"LICH_PORT": str(lich.port).encode(), b"LICH_TOKEN": b"tok-\xff\xfe-secret", b"LICH_SESSION_ID": b"s1", b"LICH_CONTROL_RUN_DIR": os.fsencode(run_dir)})
    if name == "LICH_SESSION_ID":
        env[b"LICH_TOKEN"], env[b"LICH_SESSION_ID"] = b"tok-plain-secret", b"s-\xff\xfe"
    done = subprocess.run([sys.executable, "-m", "lich_dev.sim"], cwd=ROOT, env=env, capture_output=True, timeout=30)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count(b"\n") == 1 and f"{name} is not valid UTF-8".encode() in done.stderr
    assert b"secret" not in done.stderr and b"\xff" not in done.stderr and b"\\udcff" not in done.stderr
    assert not os.path.exists(run_dir) or not [n for n in os.listdir(run_dir) if n.endswith(".lock")]
    assert done.stdout == b""
