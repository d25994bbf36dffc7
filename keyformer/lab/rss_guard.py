"""Run a command and stop it when its memory runs away: the long benchmark's watchdog.

One run of the long benchmark once grew to 23 GiB of RSS on a 24 GB host and thrashed it for a quarter of
an hour (``results/bench/long/run_log.txt``; not reproduced, cause unknown). This wrapper starts the command,
reads the resident memory of its whole process tree (the command and every descendant, from ``/proc``) every
``--every`` seconds, and past ``--max-gib`` stops the tree (SIGTERM, then SIGKILL after 10 s) and exits with
:data:`KILLED_RC`. The benchmark's journal is flushed after every measurement, so a stopped run loses only the
one in progress and resumes. Either way one line goes to ``--log``: the command's exit status (or the kill),
its peak RSS and the limit; ``--trace`` keeps every sample (``time<TAB>rss_mib``), the evidence of when a
growth began.

    python -m keyformer.lab.rss_guard --max-gib 12 --log run_log.txt --trace rss.tsv -- python -m ... --out x

Linux only (``/proc``). Default limit: half of the physical memory.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

KILLED_RC = 3
"""Exit status when the guard stopped the command (the command's own status is passed through otherwise)."""

GIB = 1024**3


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, for every process readable in /proc."""
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:  # the process ended while we read
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4; the name in (...) may hold spaces
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def tree_pids(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    kids, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def rss_bytes(pid: int) -> int:
    """Resident memory of one process (VmRSS), 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss(pid: int) -> int:
    """Summed RSS of ``pid`` and its descendants (shared pages count once per process: an upper bound)."""
    return sum(rss_bytes(p) for p in tree_pids(pid))


def physical_memory() -> int:
    """MemTotal in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def _stop(pid: int, grace_s: float = 10.0) -> None:
    pids = tree_pids(pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(rss_bytes(p) for p in pids):
            time.sleep(0.1)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def guard(cmd: list[str], max_bytes: int, every_s: float = 5.0, log: Path | None = None,
          trace: Path | None = None) -> int:
    """Run ``cmd`` under the limit; returns its exit status, or :data:`KILLED_RC` when stopped."""
    name = " ".join(cmd[:3])
    proc = subprocess.Popen(cmd)

    def forward(signum: int, _frame: object) -> None:  # the guard stopped alone: stop the tree too
        _stop(proc.pid)
        raise SystemExit(128 + signum)

    old_term = signal.signal(signal.SIGTERM, forward)
    peak, killed_at, start = 0, 0, time.monotonic()
    trace_f = open(trace, "a") if trace else None
    try:
        while proc.poll() is None:
            rss = tree_rss(proc.pid)
            peak = max(peak, rss)
            if trace_f:
                trace_f.write(f"{_now()}\t{rss / 2**20:.0f}\n")
                trace_f.flush()
            if rss > max_bytes:
                killed_at = rss
                _stop(proc.pid)
                break
            try:
                proc.wait(timeout=every_s)
            except subprocess.TimeoutExpired:
                pass
        rc = proc.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the command too (same process group): let it finish its exit
        rc = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, old_term)
        if trace_f:
            trace_f.close()
    minutes = (time.monotonic() - start) / 60
    if killed_at:
        line = (f"rss_guard {_now()}: stopped `{name} ...` after {minutes:.1f} min at "
                f"{killed_at / GIB:.1f} GiB RSS, past the limit of {max_bytes / GIB:.1f} GiB; "
                f"finished measurements are journaled: rerun to resume")
        rc = KILLED_RC
    else:
        line = (f"rss_guard {_now()}: `{name} ...` exited rc {rc} after {minutes:.1f} min; peak RSS "
                f"{peak / GIB:.2f} GiB (sampled every {every_s:g} s; limit {max_bytes / GIB:.1f} GiB)")
    print(line, file=sys.stderr)
    if log:
        with open(log, "a") as f:
            f.write(line + "\n")
    return rc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                usage="python -m keyformer.lab.rss_guard [options] -- COMMAND ...")
    p.add_argument("--max-gib", type=float, default=None,
                   help="stop the command past this RSS in GiB (default: half of the physical memory)")
    p.add_argument("--every", type=float, default=5.0, help="seconds between samples (default 5)")
    p.add_argument("--log", type=Path, help="append the outcome line here")
    p.add_argument("--trace", type=Path, help="append every sample here (time, RSS MiB)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the command, after --")
    args = p.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        p.error("no command given: put it after --")
    if args.max_gib is not None and args.max_gib <= 0:
        p.error(f"--max-gib must be a positive number of GiB, got {args.max_gib:g}")
    if args.every <= 0:
        p.error(f"--every must be a positive number of seconds, got {args.every:g}")
    max_bytes = int(args.max_gib * GIB) if args.max_gib is not None else physical_memory() // 2
    return guard(cmd, max_bytes, args.every, args.log, args.trace)


if __name__ == "__main__":
    sys.exit(main())
