"""The long benchmark's memory guard: passes a command through, stops a runaway tree, refuses bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from keyformer.lab.rss_guard import KILLED_RC, guard, main, tree_rss

ROOT = Path(__file__).resolve().parents[1]

# Writes a "journal" line, then grows by 32 MiB of touched memory every 50 ms up to 1 GiB.
GROW = ("import sys, time; open(sys.argv[1], 'a').write('done 1\\n'); b = []\n"
        "for _ in range(32):\n    b.append(bytearray(32 * 2**20)); time.sleep(0.05)\n"
        "open(sys.argv[1], 'a').write('done 2\\n')")


def test_passes_status_and_logs_peak(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    log, trace = tmp_path / "log.txt", tmp_path / "rss.tsv"
    code = "import time; b = bytearray(64 * 2**20); time.sleep(0.5); print('out'); raise SystemExit(5)"
    rc = guard([sys.executable, "-c", code], max_bytes=4 * 2**30, every_s=0.05, log=log, trace=trace)
    assert rc == 5
    assert "out" in capfd.readouterr().out
    line = log.read_text()
    assert "exited rc 5" in line and "limit 4.0 GiB" in line
    peak = float(line.split("peak RSS ")[1].split(" GiB")[0])
    assert 0.06 < peak < 1.0  # the 64 MiB buffer plus the interpreter
    samples = [float(x.split("\t")[1]) for x in trace.read_text().splitlines()]
    assert len(samples) >= 3 and max(samples) >= 64


def test_stops_a_runaway_and_keeps_what_was_written(tmp_path: Path) -> None:
    log, journal = tmp_path / "log.txt", tmp_path / "journal.txt"
    rc = guard([sys.executable, "-c", GROW, str(journal)], max_bytes=256 * 2**20, every_s=0.02, log=log)
    assert rc == KILLED_RC
    assert journal.read_text() == "done 1\n"  # stopped before its end, its first line intact
    line = log.read_text()
    assert "stopped" in line and "past the limit of 0.2 GiB" in line and "rerun to resume" in line


def test_counts_descendants(tmp_path: Path) -> None:
    """A grandchild's memory counts: the parent itself stays small."""
    journal = tmp_path / "journal.txt"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {GROW!r}, {str(journal)!r}])"
    rc = guard([sys.executable, "-c", parent], max_bytes=256 * 2**20, every_s=0.02, log=None)
    assert rc == KILLED_RC
    assert journal.read_text() == "done 1\n"


def test_stopping_the_guard_stops_its_command(tmp_path: Path) -> None:
    """SIGTERM to the guard alone stops the command's tree too (nothing left running unguarded)."""
    marker = tmp_path / "pid"
    child = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    guard_cmd = [sys.executable, "-m", "keyformer.lab.rss_guard", "--every", "0.05", "--",
                 sys.executable, "-c", child]
    proc = subprocess.Popen(guard_cmd, cwd=ROOT)
    for _ in range(200):
        if marker.exists() and marker.read_text():
            break
        subprocess.run(["sleep", "0.05"])
    pid = int(marker.read_text())
    assert tree_rss(pid) > 0
    proc.terminate()
    assert proc.wait(timeout=20) == 128 + 15
    assert tree_rss(pid) == 0


def test_tree_rss_reads_a_live_process() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(128 * 2**20); time.sleep(3)"])
    try:
        deadline = 0
        while tree_rss(proc.pid) < 128 * 2**20 and deadline < 100:
            subprocess.run(["sleep", "0.05"])
            deadline += 1
        assert tree_rss(proc.pid) >= 128 * 2**20
    finally:
        proc.kill()
        proc.wait()
    assert tree_rss(proc.pid) == 0


@pytest.mark.parametrize("argv, message", [
    (["--max-gib", "0", "--", "true"], "--max-gib must be a positive number of GiB, got 0"),
    (["--every", "-1", "--", "true"], "--every must be a positive number of seconds, got -1"),
    (["--max-gib", "1"], "no command given: put it after --"),
])
def test_bad_input_is_named(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_long_script_runs_the_bench_under_the_guard() -> None:
    """scripts/run_bench_long.sh wraps each setting in the guard and stops on its exit status."""
    text = (ROOT / "scripts/run_bench_long.sh").read_text()
    call = text.split('"$PY" -m keyformer.lab.rss_guard', 1)[1].split("\n  rc=")[0]
    assert '-- "$PY" -m keyformer.lab.bench.long' in call and '--log "$log"' in call
    assert f'[ "$rc" = {KILLED_RC} ]' in text


def test_the_quoted_incident_is_the_run_logs() -> None:
    """The "23 GiB" that the guard's docs quote is the RSS results/bench/long/run_log.txt recorded."""
    import re

    log = (ROOT / "results/bench/long/run_log.txt").read_text()
    gib = float(re.search(r"benchmark process at (\d+\.\d) GiB RSS", log).group(1))
    quoted = f"{gib:.0f} GiB"
    for path, phrase in (("docs/performance.md", f"grew to {quoted} on a 24 GB host"),
                         ("keyformer/lab/rss_guard.py", f"grew to {quoted} of RSS on a 24 GB host"),
                         ("scripts/run_bench_long.sh", f"reached {quoted} on a 24 GB host")):
        assert phrase in " ".join((ROOT / path).read_text().split()), path
