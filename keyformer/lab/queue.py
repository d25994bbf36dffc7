"""Run the points of queue files inside one Python process (no interpreter, import or Hydra start per call).
The scheduler of ``scripts/run_points.sh`` (which starts WORKERS copies of this with one thread each) and of
``scripts/gpu_studies.sh`` (eight copies sharing a GPU). Copies share the points through lock folders.

    keyformer-queue experiments/queues/exp7_cnndm.txt --set device=cuda dtype=float32 batch_size=32
    keyformer-queue experiments/queues/exp5.txt --step 16        # round-robin, 16 records a call

Queue lines are ``<output folder, relative to --root> <records> <run.py overrides...>`` (``#`` comments).
``--set`` overrides are appended to every line (they must not change a point's folder name: device, dtype and
batch size are not part of it). Queue files run in the order given: a point of the second is taken only when
every point of the first is finished or taken. Within a file, the unfinished point with the fewest finished
rounds goes first (a round: ``--step N`` records, ``stop_after=N`` per call, not part of a point's identity;
ties in queue order), so every point holds the same first rounds wherever the run stops, and a point left
part-way through a round by a killed run finishes that round in its queue place, not last. Without
``--step`` a call runs a whole point: queue order. Queue files are re-read at each pick, so they can
be edited while running. A failed point is logged and skipped; a point's folder resumes as with ``run.py``
(same config and code, or refused). ``--until`` (Unix time) stops taking new points then (the point in flight
finishes, or is killed by the caller; its records so far are kept). ``--clear-locks`` removes the lock and
failure markers a killed run left (only when no other copy is running).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
import traceback
from pathlib import Path

from keyformer.run.paths import CONF_DIR, ROOT


def read_queue(path: Path) -> list[tuple[str, int, list[str]]]:
    """Points of one queue file: (folder, records, overrides)."""
    if not path.is_file():
        raise SystemExit(f"error: no such queue file: {path}")
    points = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        if len(parts) < 2 or not parts[1].isdigit():
            raise SystemExit(f"error: malformed queue line in {path}: {line!r} (want: FOLDER RECORDS "
                             f"OVERRIDES...)")
        points.append((parts[0], int(parts[1]), parts[2:]))
    return points


def records_override(n: int, overrides: list[str]) -> list[str]:
    """``[n_samples=<records>]`` unless the line sets ``n_samples`` itself: the queue's record count is the
    point's n_samples, so a point that reached it is ``complete`` in its metrics.json too."""
    return [] if any(o.lstrip("+").startswith("n_samples=") for o in overrides) else [f"n_samples={n}"]


def done(root: Path, folder: str) -> int:
    f = root / folder / "predictions.jsonl"
    if not f.is_file():
        return 0
    return sum(1 for line in f.read_text().splitlines() if line.startswith("{") and line.endswith("}"))


def pick(queues: list[list[tuple[str, int, list[str]]]], root: Path, locks: Path, step: int | None = None):
    """The first queue's unfinished, unlocked, never-failed point with the fewest finished rounds (``step``
    records each; whole points: every point is at round 0), the first in queue order among those whose
    budget group (:func:`group`) no other copy is running, else the first of them; None."""
    for points in queues:
        free = [(done(root, f), f, n, o) for f, n, o in points
                if not (locks / key(f)).exists() and not (locks / f"failed_{key(f)}").exists()]
        free = [p for p in free if p[0] < p[2]]
        if free:
            low = min(p[0] // step if step else 0 for p in free)
            free = [p for p in free if (p[0] // step if step else 0) == low]
            busy = {group(f) for f, _, _ in points if (locks / key(f)).exists()}
            _, f, n, o = next((p for p in free if group(p[1]) not in busy), free[0])
            return f, n, o
    return None


def group(folder: str) -> str:
    """A point's folder less its ``budget=`` part: the points of one budget group share their prompt forwards
    within one process (``share_prompt=true``), so a copy keeps to its group while another copy runs
    another (queue files list a group's budgets together)."""
    head, _, name = folder.rpartition("/")
    return f"{head}/{','.join(p for p in name.split(',') if not p.startswith('budget='))}"


def key(folder: str) -> str:
    return folder.replace("/", "__")


def run_point(folder: str, overrides: list[str], root: Path) -> None:
    from hydra import compose, initialize_config_dir

    from keyformer.run.scaffold import check_overrides, job_config, run_job, task_for

    message = check_overrides(overrides)
    if message:
        raise ValueError(message)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=[*overrides, f"output_dir='{root / folder}'", "progress=false"])
    config = job_config(cfg)
    run_job(config, task_for(config))


def free_cuda_cache() -> None:
    """Hand the point's cached CUDA blocks back, so that workers sharing a GPU do not hoard each other's
    peaks."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("queues", nargs="+", type=Path)
    ap.add_argument("--set", nargs="*", default=[], dest="sets", help="overrides appended to every point")
    ap.add_argument("--root", type=Path, default=ROOT, help="where the folders go (default: this checkout)")
    ap.add_argument("--until", type=float, default=None, help="take no new point after this Unix time")
    ap.add_argument("--name", default=str(os.getpid()), help="worker name in the log lines")
    ap.add_argument("--step", type=int, default=None, help="records per call (stop_after); default: whole "
                                                           "points")
    ap.add_argument("--clear-locks", action="store_true", help="first remove stale locks and failure markers")
    args = ap.parse_args(argv)
    for q in args.queues:
        read_queue(q)  # a malformed or missing file fails here, before any work
    locks = args.root / "multirun" / ".locks_queue"
    if args.clear_locks and locks.is_dir():
        shutil.rmtree(locks)
    locks.mkdir(parents=True, exist_ok=True)
    step = [f"stop_after={args.step}"] if args.step else []
    t0 = time.monotonic()
    while args.until is None or time.time() < args.until:
        p = pick([read_queue(q) for q in args.queues], args.root, locks, args.step)
        if p is None:
            break
        folder, n, overrides = p
        try:
            (locks / key(folder)).mkdir()
        except FileExistsError:
            continue  # another worker took it first
        (args.root / folder).parent.mkdir(parents=True, exist_ok=True)
        t = time.monotonic()
        print(f"[{args.name} {time.strftime('%H:%M:%S')}] {folder}: {done(args.root, folder)}/{n} done",
              flush=True)
        try:
            run_point(folder, [*overrides, *records_override(n, overrides), *args.sets, *step], args.root)
            print(f"[{args.name}] {folder}: {done(args.root, folder)}/{n} after {time.monotonic() - t:.1f} "
                  f"s", flush=True)
        except BaseException as e:  # noqa: BLE001 - one failed point must not stop the others
            (locks / f"failed_{key(folder)}").write_text(traceback.format_exc())
            print(f"[{args.name}] failed: {folder}: {type(e).__name__}: {e}", flush=True)
            if isinstance(e, KeyboardInterrupt):
                raise
        finally:
            (locks / key(folder)).rmdir()
            free_cuda_cache()
    print(f"[{args.name}] done after {time.monotonic() - t0:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
