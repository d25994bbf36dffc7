"""Run the points of queue files inside one Python process (no interpreter, import or Hydra start per call).
The scheduler of ``scripts/run_points.sh`` (which starts WORKERS copies of this with one thread each) and of
the GPU scripts (several copies sharing a GPU). Copies share the points through lock folders.

    keyformer-queue my_queue.txt --set device=cuda dtype=float32 batch_size=32
    keyformer-queue my_queue.txt --step 16        # round-robin, 16 records a call

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

On a SLURM cluster, ``--slurm`` submits the points instead of running them here: one job array, one task
per point that is neither finished nor held by a still queued or running array of an earlier submission
(``squeue``), each task running its whole point as above (resume and skip included). The points go to a
snapshot queue file under ``<root>/multirun/.slurm_queue/`` (task logs beside it), so the queue files can
change after submission. Rerunning the command after a cancelled, failed, requeued or timed-out task
resubmits only what is unfinished. Array tasks take no lock folders: do not also run local copies on the
same points. ``docs/cluster.md``.

    keyformer-queue my_queue.txt --slurm --sbatch "--partition=gpu --gres=gpu:1 --time=240"
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
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


SLURM_DIR = Path("multirun") / ".slurm_queue"  # under --root: snapshots, their array job ids, task logs


def slurm_active(snapshot_dir: Path) -> dict[str, str]:
    """Folders of the points that a job array of an earlier ``--slurm`` submission still holds (a task
    pending, running, requeued or suspended, per ``squeue``): {folder: "array job id, task id, state"}."""
    held = {}
    for jobfile in sorted(snapshot_dir.glob("*.jobid")):
        array_id = jobfile.read_text().strip()
        snapshot = jobfile.with_suffix(".txt")
        if not array_id or not snapshot.is_file():
            continue
        r = subprocess.run(["squeue", "-h", "-r", "-j", array_id, "-o", "%K %T"], capture_output=True,
                           text=True, timeout=60)
        if r.returncode != 0:  # ended long enough ago that SLURM forgot it: holds nothing
            continue
        points = read_queue(snapshot)
        for line in r.stdout.splitlines():
            task, _, state = line.partition(" ")
            if task.isdigit() and int(task) < len(points):
                held[points[int(task)][0]] = f"job array {array_id}, task {task}, {state}"
    return held


def submit_slurm(queues: list[Path], root: Path, sets: list[str], sbatch: str, parallel: int | None,
                 wait: bool) -> int:
    """``--slurm``: submit the unfinished points of ``queues`` as one SLURM job array (see the module
    docstring); with ``wait``, return the exit status of ``sbatch --wait`` (the highest of the tasks')."""
    if shutil.which("sbatch") is None or shutil.which("squeue") is None:
        raise SystemExit("error: --slurm needs the SLURM client commands (sbatch, squeue) on PATH; on one "
                         "machine, scripts/slurm_local.sh start runs a local cluster")
    if parallel is not None and parallel < 1:
        raise SystemExit(f"error: --parallel {parallel}: want at least 1 task at a time")
    snapshot_dir = root / SLURM_DIR
    snapshot_dir.mkdir(parents=True, exist_ok=True)
    held = slurm_active(snapshot_dir)
    todo, finished = [], 0
    for q in queues:
        for folder, n, overrides in read_queue(q):
            if done(root, folder) >= n:
                finished += 1
            elif folder in held:
                print(f"[slurm] {folder}: still in {held[folder]}; not resubmitted", flush=True)
            elif folder not in {t[0] for t in todo}:
                todo.append((folder, n, [*overrides, *records_override(n, overrides), *sets]))
    if not todo:
        print(f"[slurm] nothing to submit: {finished} points finished, {len(held)} still queued or running",
              flush=True)
        return 0
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    snapshot = snapshot_dir / f"{stamp}.txt"
    spaced = [t for _, _, o in todo for t in o if not t or len(t.split()) != 1]
    if spaced:
        raise SystemExit(f"error: overrides {spaced} hold white space; a queue line splits at white space")
    snapshot.write_text("".join(f"{' '.join([f, str(n), *o])}\n" for f, n, o in todo))
    task = [sys.executable, "-m", "keyformer.lab.queue", str(snapshot.resolve()), "--root",
            str(root.resolve()), "--slurm-task"]
    cmd = ["sbatch", "--parsable", f"--array=0-{len(todo) - 1}{f'%{parallel}' if parallel else ''}",
           "--job-name=keyformer-queue", f"--output={snapshot_dir.resolve()}/%A_%a.out",
           *shlex.split(sbatch), *(["--wait"] if wait else []), "--wrap", shlex.join(task)]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = p.stdout.readline().strip()  # --parsable: "<job id>[;cluster]", printed at submission
    array_id = first.split(";")[0]
    if not array_id.isdigit():
        _, err = p.communicate()
        snapshot.unlink()
        raise SystemExit(f"error: sbatch refused the job array: {(first + ' ' + err).strip()}")
    snapshot.with_suffix(".jobid").write_text(array_id + "\n")
    print(f"[slurm] submitted job array {array_id}: {len(todo)} points ({finished} finished, {len(held)} "
          f"still queued or running: not resubmitted); logs: {snapshot_dir}/{array_id}_<task>.out; rerun "
          f"this command to resubmit what is unfinished", flush=True)
    _, err = p.communicate()
    if err.strip():
        print(err.strip(), file=sys.stderr, flush=True)
    if wait:
        print(f"[slurm] job array {array_id} ended (sbatch --wait exit status {p.returncode})", flush=True)
    return p.returncode


def slurm_task(snapshot: Path, root: Path) -> int:
    """``--slurm-task``: run the point of ``snapshot`` that this array task (``SLURM_ARRAY_TASK_ID``)
    holds."""
    task = os.environ.get("SLURM_ARRAY_TASK_ID", "")
    points = read_queue(snapshot)
    if not task.isdigit() or int(task) >= len(points):
        raise SystemExit(f"error: --slurm-task: SLURM_ARRAY_TASK_ID={task!r} is not a task of {snapshot} "
                         f"(0-{len(points) - 1}); this mode runs inside the job array that --slurm submits")
    folder, n, overrides = points[int(task)]
    (root / folder).parent.mkdir(parents=True, exist_ok=True)
    print(f"[slurm task {task}] {folder}: {done(root, folder)}/{n} done", flush=True)
    run_point(folder, overrides, root)
    print(f"[slurm task {task}] {folder}: {done(root, folder)}/{n} done", flush=True)
    return 0


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
    ap.add_argument("--slurm", action="store_true", help="submit the unfinished points to SLURM as one job "
                                                         "array instead of running them here")
    ap.add_argument("--sbatch", default="", help="--slurm: sbatch options, one string (e.g. "
                                                 "\"--partition=gpu --gres=gpu:1 --time=240\")")
    ap.add_argument("--parallel", type=int, default=None, help="--slurm: at most this many tasks at once")
    ap.add_argument("--wait", action="store_true", help="--slurm: return when the array has ended (sbatch "
                                                        "--wait; exit status: the highest task's)")
    ap.add_argument("--slurm-task", action="store_true", help=argparse.SUPPRESS)  # one task of that array
    args = ap.parse_args(argv)
    if args.slurm_task:
        if len(args.queues) != 1:
            raise SystemExit("error: --slurm-task takes the one snapshot queue file that --slurm wrote")
        return slurm_task(args.queues[0], args.root)
    if args.slurm:
        bad = [o for o, v in (("--step", args.step), ("--until", args.until)) if v is not None]
        if bad or args.clear_locks:
            raise SystemExit(f"error: --slurm runs whole points as array tasks; {', '.join(bad) or ''}"
                             f"{' --clear-locks' if args.clear_locks else ''} apply to local copies only")
        for q in args.queues:
            read_queue(q)  # a malformed or missing file fails here, before any submission
        return submit_slurm(args.queues, args.root, args.sets, args.sbatch, args.parallel, args.wait)
    if args.sbatch or args.parallel is not None or args.wait:
        raise SystemExit("error: --sbatch, --parallel and --wait apply to --slurm submissions only")
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
