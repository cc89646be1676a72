"""The benchmark still runs: `--smoke` once, every section in the table and
the JSON. Nothing here is about time; `make bench` is where figures live."""
import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from lich_bench import floor
from lich_dev.procs import ROOT, daemon_env

SECTIONS = ("startup", "floor", "dispatch", "ack", "burst", "asks", "idle", "scale")


@pytest.mark.skipif(sys.platform != "linux", reason="the bench measures the daemon through Linux's /proc")
def test_the_smoke_benchmark_prints_the_table_and_the_json_with_every_section():
    done = subprocess.run(
        [sys.executable, "-m", "lich_bench", "--smoke", "--quiet"],
        cwd=ROOT, env=daemon_env(), capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    table, _, rest = done.stdout.partition("\n\n")
    for section in SECTIONS:
        assert f"\n{section}" in table, (section, table)
    doc = json.loads(rest)
    assert set(doc) >= {"machine", "sizes", "summary", "checks", "runs", "idle", "scale"}
    for section in SECTIONS:
        assert any(key.startswith(section) for key in doc["summary"]), section
    for key, entry in doc["summary"].items():
        assert entry["median"] is not None, key
    assert doc["checks"]["burst_acks_in_order"] and doc["checks"]["scale_all_acked_ok"]
    # Ack latency and burst rate are read against the floors of the same run.
    assert doc["summary"]["ack_ms.p50"]["ratio_to"] == "floor.sum_ms" and doc["summary"]["ack_ms.p50"]["ratio"] > 0
    assert doc["summary"]["burst.per_s"]["ratio_to"] == "floor.per_s" and doc["summary"]["burst.per_s"]["ratio"] > 0


def test_a_failed_floor_says_why_without_the_token(monkeypatch, capsys):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens on it once closed
    monkeypatch.setenv("LICH_TOKEN", "floor-sekrit")
    assert floor.main([str(port), "1"]) == 1
    out = capsys.readouterr()
    assert out.err == "the ack to lich failed (ConnectionError)\n"
    assert "floor-sekrit" not in out.out + out.err


@pytest.mark.skipif(os.name == "nt", reason="the setup's benchmark times CPU with resource, POSIX's")
def test_the_setup_benchmark_measures_a_first_and_a_next_session(tmp_path):
    # A plugin whose package needs nothing: no package index, and a real venv.
    plugin = tmp_path / "plugin"
    (plugin / "hooks").mkdir(parents=True)
    (plugin / ".claude-plugin").mkdir()
    (plugin / "lich_control").mkdir()
    (plugin / ".claude-plugin" / "plugin.json").write_text('{"version": "0.1.0"}')
    (plugin / "setup.cfg").write_text("[options]\npython_requires = >=3.9\n")
    (plugin / "lich_control" / "__init__.py").write_text("")
    (plugin / "lich_control" / "daemon.py").write_text("")
    for name in ("lich_runtime.py", "lich_package.py", "lich_children.py", "lich_system.py"):
        shutil.copy(os.path.join(ROOT, "hooks", name), str(plugin / "hooks"))
    for name in ("posix.py", "windows.py"):
        shutil.copy(os.path.join(ROOT, "lich_control", name), str(plugin / "lich_control"))
    figures = tmp_path / "setup.json"
    done = subprocess.run(
        [sys.executable, "-m", "lich_bench.setup", "--runs", "1", "--plugin", str(plugin), "--python", sys.executable,
         "--json", str(figures)], cwd=os.path.join(ROOT, "tests"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [line.split()[:2] for line in done.stdout.splitlines()[1:3]] == [["first", "session"], ["next", "session"]]
    [run] = json.loads(figures.read_text())["runs"]
    assert run["first session"]["built"] is True and run["next session"]["built"] is False
    assert run["first session"]["cpu_s"] > 0
