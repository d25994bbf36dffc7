"""Sweeps on a real scheduler. The ``slurm`` group (``pytest -m slurm``; deselected by default) runs
against the single-node cluster of ``scripts/slurm_local.sh`` (started here unless ``SLURM_CONF`` names a
running one, and then stopped; skipped when its packages cannot be installed): a sweep through
``hydra/launcher=slurm`` equals the local sweep prediction for prediction, a cancelled job and a failed
node lose and duplicate nothing when the sweep is rerun, and ``keyformer-queue --slurm`` runs a queue as a
job array. The other tests (the ``slurm`` field of metrics.json, ``keyformer-queue``'s refusals) need no
cluster."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from test_runner import FakeCore, cfg_dict

from keyformer.lab import queue as rq
from keyformer.run.results import slurm_job
from keyformer.run.tasks.generate import run
from keyformer.run.validate import module_available

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "slurm_local.sh"
NODE, CLUSTER = "localnode", "keyformer"  # what slurm_local.sh names them
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline",
       "OMP_NUM_THREADS": "1"}
# the README's 6-job sweep, cheap: 2 samples of 4 tokens a job
SWEEP = ["model=tiny_llama", "policy=window,h2o,keyformer", "budget=0.2,0.5", "n_samples=2",
         "generation.max_new_tokens=4", "warmup=false", "progress=false"]
# the repository's SLURM launcher, fitted to the local node: no GPU, one CPU and 2 GB a job
LAUNCHER = ["hydra/launcher=slurm", "hydra.launcher.gpus_per_node=null", "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.mem_gb=2", "hydra.launcher.timeout_min=15"]
# Samples of a job long enough to be caught early and still be running when a cancel or requeue kills it:
# its processes get SIGTERM (which submitit ignores), then SIGKILL a few seconds later (KillWait=1, and srun
# waits 2 s more): 200 samples are about 12 s of generation here.
LONG = 200
# ... and tokens enough a sample that on a quiet machine too the job outlives the kill's grace period
LONG_TOKENS = 64


# -- no cluster needed ---------------------------------------------------------------------------------------
def test_slurm_job_reads_the_job_environment():
    assert slurm_job({}) is None and slurm_job({"SLURM_ARRAY_TASK_ID": "3"}) is None
    env = {"SLURM_JOB_ID": "17", "SLURM_ARRAY_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "5",
           "SLURMD_NODENAME": "n1", "SLURM_CLUSTER_NAME": "c", "SLURM_JOB_PARTITION": "gpu",
           "SLURM_RESTART_COUNT": "2"}
    assert slurm_job(env) == {"job_id": 17, "array_job_id": 12, "array_task_id": 5, "node": "n1",
                              "cluster": "c", "partition": "gpu", "restart_count": 2}
    assert slurm_job({"SLURM_JOB_ID": "17"}) == {"job_id": 17, "array_job_id": None, "array_task_id": None,
                                                "node": None, "cluster": None, "partition": None,
                                                "restart_count": 0}


def test_metrics_json_records_the_slurm_job(tmp_path, monkeypatch):
    for var in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_RESTART_COUNT"):
        monkeypatch.delenv(var, raising=False)
    run(cfg_dict(tmp_path / "here", "n_samples=1"), FakeCore().backend())
    assert json.loads((tmp_path / "here" / "metrics.json").read_text())["slurm"] is None
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    run(cfg_dict(tmp_path / "there", "n_samples=1"), FakeCore().backend())
    got = json.loads((tmp_path / "there" / "metrics.json").read_text())["slurm"]
    assert (got["job_id"], got["node"], got["array_task_id"], got["restart_count"]) == (41, "n7", None, 0)


def test_queue_slurm_options_are_refused_where_they_do_not_apply(tmp_path, monkeypatch):
    q = tmp_path / "q.txt"
    q.write_text("m/a 2 policy=h2o\n")
    with pytest.raises(SystemExit, match="--step apply to local copies only"):
        rq.main([str(q), "--slurm", "--step", "2"])
    with pytest.raises(SystemExit, match="--slurm submissions only"):
        rq.main([str(q), "--wait"])
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    with pytest.raises(SystemExit, match="SLURM_ARRAY_TASK_ID='1' is not a task of"):
        rq.main([str(q), "--slurm-task", "--root", str(tmp_path)])
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    with pytest.raises(SystemExit, match="needs the SLURM client commands"):
        rq.main([str(q), "--slurm", "--root", str(tmp_path)])


# -- the local cluster ---------------------------------------------------------------------------------------
def sh(env: dict, *cmd: str, check: bool = True) -> str:
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert r.returncode == 0, f"{' '.join(cmd)}: {r.stdout}{r.stderr}"
    return r.stdout


def wait_until(what: str, pred: Callable[[], object], timeout: float = 300, every: float = 0.2) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(every)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def cluster():
    """The environment of a running local cluster (``SLURM_CONF``): the one ``SLURM_CONF`` names when it
    answers, else one started here by scripts/slurm_local.sh and stopped afterwards."""
    if not module_available("hydra_plugins.hydra_submitit_launcher"):
        pytest.skip("hydra-submitit-launcher not installed (pip install -e '.[launchers]')")
    env = {**ENV, "PATH": f"{ENV['PATH']}{os.pathsep}/usr/sbin"}
    if env.get("SLURM_CONF") and shutil.which("scontrol", path=env["PATH"]) and subprocess.run(
            ["scontrol", "ping"], capture_output=True, env=env).returncode == 0:
        yield env
        return
    r = subprocess.run([str(SCRIPT), "start"], capture_output=True, text=True, timeout=900)
    if r.returncode == 3:
        pytest.skip(f"no local SLURM cluster: {r.stderr.strip().splitlines()[-1]}")
    assert r.returncode == 0, r.stdout + r.stderr
    env["SLURM_CONF"] = r.stdout.strip().splitlines()[-1].removeprefix("export SLURM_CONF=")
    if "already running" in r.stderr:  # someone else's: leave it running
        yield env
        return
    try:
        yield env
    finally:
        subprocess.run([str(SCRIPT), "stop"], capture_output=True, timeout=300)


def sweep(env: dict, out: Path, *overrides: str, wait: bool = True) -> subprocess.Popen:
    """``python run.py -m ... hydra.sweep.dir=out``; its output goes to ``out.log`` (appended)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, str(ROOT / "run.py"), "-m", *overrides, f"hydra.sweep.dir={out}"]
    with open(f"{out}.log", "a") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, env=env, cwd=out.parent)
    if not wait:
        return p
    p.wait(timeout=900)
    return p


def log_tail(out: Path) -> str:
    return Path(f"{out}.log").read_text()[-4000:]


def rows(folder: Path) -> list[dict]:
    """A run folder's predictions, timings left out (they differ from run to run); a line torn by a kill
    is left out, as a resumed run drops it."""
    f = folder / "predictions.jsonl"
    out = []
    for line in f.read_text().splitlines() if f.is_file() else []:
        try:
            out.append({k: v for k, v in json.loads(line).items() if not k.endswith("_ms")})
        except json.JSONDecodeError:
            pass
    return out


def points(out: Path) -> list[Path]:
    return sorted(p for p in out.iterdir() if p.is_dir() and not p.name.startswith("."))


def metrics(folder: Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())


def states(env: dict, *job_ids: object) -> dict[str, str]:
    """{job id: state} from the accounting database (sacct), as submitit reads it."""
    out = sh(env, "sacct", "-X", "-n", "-P", "-o", "JobID,State", *[f"-j{j}" for j in job_ids])
    return dict(line.split("|")[:2] for line in out.splitlines() if line)


def queued(env: dict) -> list[str]:
    """The jobs the cluster holds, one ``<id> <state>`` each (array tasks one by one)."""
    return sh(env, "squeue", "-h", "-r", "-o", "%i %T").split("\n")[:-1]


def part_way(env: dict, out: Path, task: int | None = None) -> tuple[str, Path, int] | None:
    """A running task of the sweep ``out`` (``task``, or any) whose folder holds some of its samples, less
    than a quarter: (job id ``<array>_<task>``, or ``<id>`` for a one-job sweep; folder; samples done)."""
    for line in queued(env):
        job, state = line.split()
        if state != "RUNNING":
            continue
        k = int(job.split("_")[1]) if "_" in job else 0  # submitit submits a one-job sweep as a plain job
        folder = next((p for p in points(out) if p.name.startswith(f"{k}_")), None) if out.is_dir() else None
        n = len(rows(folder)) if folder else 0
        if (task is None or k == task) and 0 < n < LONG // 4:
            return job, folder, n
    return None


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory) -> Path:
    """The 6-job sweep run here, with Hydra's basic launcher."""
    out = tmp_path_factory.mktemp("local") / "sweep"
    r = sweep(ENV, out, *SWEEP)
    assert r.returncode == 0, log_tail(out)
    return out


@pytest.mark.slurm
def test_sweep_through_the_slurm_launcher_equals_the_local_sweep(cluster, local_sweep, tmp_path):
    """Every job of ``run.py -m hydra/launcher=slurm`` runs as a task of one SLURM job array on the node,
    records its job in metrics.json, and writes the local sweep's predictions, folder for folder."""
    out = tmp_path / "slurm"
    r = sweep(cluster, out, *SWEEP, *LAUNCHER, "hydra.launcher.array_parallelism=2")
    assert r.returncode == 0, log_tail(out)
    assert [p.name for p in points(out)] == [p.name for p in points(local_sweep)] and len(points(out)) == 6
    jobs = []
    for here, there in zip(points(local_sweep), points(out), strict=True):
        m = metrics(there)
        assert m["complete"] and metrics(here)["slurm"] is None
        s = m["slurm"]
        assert (s["node"], s["cluster"], s["restart_count"]) == (NODE, CLUSTER, 0), s
        assert there.name.startswith(f"{s['array_task_id']}_")  # Hydra's job number is the array task
        jobs.append(s)
        assert rows(there) == rows(here) and len(rows(here)) == 2, there.name
    assert len({s["array_job_id"] for s in jobs}) == 1 and len({s["job_id"] for s in jobs}) == 6
    ids = [s["job_id"] for s in jobs]  # each ran to completion as a SLURM job (once srun has cleaned up)
    wait_until("COMPLETED in sacct", lambda: set(states(cluster, *ids).values()) == {"COMPLETED"}, timeout=60)


@pytest.mark.slurm
def test_scancel_mid_sweep_then_rerun_loses_and_duplicates_nothing(cluster, tmp_path):
    """A job cancelled part-way fails the sweep; once the array's other task has ended, the rerun skips the
    finished job and resumes the cancelled one after its last finished sample."""
    out = tmp_path / "sweep"
    args = ["model=tiny_llama", "policy=window,h2o", "budget=0.5", f"n_samples={LONG}",
            f"generation.max_new_tokens={LONG_TOKENS}", "warmup=false", "progress=false", *LAUNCHER,
            "hydra.launcher.array_parallelism=1"]
    driver = sweep(cluster, out, *args, wait=False)
    try:
        job, folder, _ = wait_until("task 0 part-way", lambda: part_way(cluster, out, task=0), every=0.1)
        sh(cluster, "scancel", job)
        wait_until(f"{job} cancelled", lambda: states(cluster, job).get(job, "").startswith("CANCELLED"))
        assert driver.wait(timeout=300) != 0, log_tail(out)  # the sweep reports the cancelled job
    finally:
        driver.kill()
        driver.wait()
    assert "CANCELLED" in log_tail(out)
    wait_until("the array's other task to end", lambda: not queued(cluster))
    before = rows(folder)
    assert 0 < len(before) < LONG and not (folder / "metrics.json").exists()
    finished = {p.name: (p / "metrics.json").read_bytes() for p in points(out) if p != folder}
    assert len(finished) == 1 and all(metrics(out / name)["complete"] for name in finished)
    r = sweep(cluster, out, *args)
    assert r.returncode == 0, log_tail(out)
    assert {name: (out / name / "metrics.json").read_bytes() for name in finished} == finished  # skipped
    after = rows(folder)
    ids = [x["id"] for x in after]
    assert after[: len(before)] == before and len(ids) == len(set(ids)) == LONG  # resumed: nothing lost
    m = metrics(folder)
    assert m["complete"] and m["n_samples"] == LONG and m["slurm"]["array_job_id"] != int(job.split("_")[0])


def job_processes(job_id: int) -> list[int]:
    """Processes on this machine (the one node) that run in SLURM job ``job_id``."""
    pids = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"SLURM_JOB_ID={job_id}\0".encode() in env.read_bytes():
                pids.append(int(env.parent.name))
        except OSError:
            pass
    return pids


@pytest.mark.slurm
def test_failed_then_drained_node_requeues_the_job_and_it_resumes(cluster, tmp_path):
    """Draining the node lets its running job go on; setting it down kills that job, which SLURM requeues;
    while the node is drained the job waits; once the node is resumed the job continues its folder (same
    job id, restart count 1); a rerun of the sweep then skips it."""
    out = tmp_path / "sweep"
    args = ["model=tiny_llama", "policy=window", "budget=0.5", f"n_samples={LONG}",
            f"generation.max_new_tokens={LONG_TOKENS}", "warmup=false", "progress=false", *LAUNCHER]
    driver = sweep(cluster, out, *args, wait=False)
    node = ["scontrol", "update", f"nodename={NODE}"]
    try:
        job, folder, _ = wait_until("the job part-way", lambda: part_way(cluster, out, task=0), every=0.1)
        sh(cluster, *node, "state=drain", "reason=keyformer-test")
        assert sh(cluster, "sinfo", "-h", "-n", NODE, "-o", "%t").strip() in ("drng", "drain")
        assert f"{job} RUNNING" in queued(cluster)  # draining lets a running job go on
        sh(cluster, *node, "state=down", "reason=keyformer-test")  # a node failure: the job is requeued
        wait_until(f"{job} requeued", lambda: f"{job} PENDING" in queued(cluster))
        # the killed job's processes end once the node answers again (ReturnToService=2 brings it back)
        wait_until(f"the processes of job {job} to end", lambda: not job_processes(int(job)), timeout=120)
        before = rows(folder)
        assert 0 < len(before) < LONG and not (folder / "metrics.json").exists()
        sh(cluster, *node, "state=drain", "reason=keyformer-test")
        sh(cluster, "scontrol", "update", f"jobid={job}", "starttime=now")  # lift the requeue's 2-minute hold
        time.sleep(4)
        assert f"{job} PENDING" in queued(cluster)  # eligible, but the drained node starts nothing
        sh(cluster, *node, "state=resume")
        wait_until("the requeued job to end", lambda: not queued(cluster), timeout=600)
        # the sweep ends well, or reports the node failure when submitit polled sacct before the requeued
        # job started again (its first run's state, NODE_FAIL): either way the job itself finished
        assert driver.wait(timeout=120) == 0 or "NODE_FAIL" in log_tail(out), log_tail(out)
    finally:
        driver.kill()
        driver.wait()
        subprocess.run([*node, "state=resume"], capture_output=True, env=cluster)
    after = rows(folder)
    ids = [x["id"] for x in after]
    assert after[: len(before)] == before and len(ids) == len(set(ids)) == LONG  # resumed: nothing lost
    m = metrics(folder)
    assert m["complete"] and m["slurm"]["restart_count"] == 1 and m["slurm"]["job_id"] == int(job)
    done = (folder / "metrics.json").read_bytes()
    r = sweep(cluster, out, *args)
    assert r.returncode == 0, log_tail(out)
    assert (folder / "metrics.json").read_bytes() == done  # skipped


@pytest.mark.slurm
def test_queue_as_a_job_array_is_collected(cluster, local_sweep, tmp_path):
    """``keyformer-queue --slurm`` submits a 6-point queue as one job array (a second submission while it
    runs submits nothing), its points equal the local sweep's, and keyformer-collect gathers them."""
    q = tmp_path / "q6.txt"
    q.write_text("".join(f"multirun/q6/budget={b},policy={p} 2 model=tiny_llama policy={p} budget={b} "
                         f"generation.max_new_tokens=4 warmup=false\n"
                         for p in ("window", "h2o", "keyformer") for b in (0.2, 0.5)))
    cmd = [sys.executable, "-m", "keyformer.lab.queue", str(q), "--root", str(tmp_path), "--slurm",
           "--parallel", "2", "--sbatch=--cpus-per-task=1 --mem=2G --time=15 --begin=now+20"]
    # --begin holds the array queued for 20 s, so the second submission below always meets it unfinished
    first = subprocess.Popen([*cmd, "--wait"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=cluster)
    try:
        wait_until("the job array", lambda: queued(cluster))
        again = subprocess.run(cmd, capture_output=True, text=True, env=cluster, timeout=120)
        out, _ = first.communicate(timeout=600)
    finally:
        first.kill()
    assert first.returncode == 0, out
    assert again.returncode == 0 and "nothing to submit: 0 points finished, 6 still queued" in again.stdout, (
        again.stdout + again.stderr)
    array_id = int(out.split("submitted job array ")[1].split(":")[0])
    sweep_dir = tmp_path / "multirun" / "q6"
    local = {(metrics(p)["policy"], metrics(p)["budget"]): p for p in points(local_sweep)}
    tasks = []
    for folder in points(sweep_dir):
        m = metrics(folder)
        assert m["complete"] and m["slurm"]["array_job_id"] == array_id and m["slurm"]["node"] == NODE
        tasks.append(m["slurm"]["array_task_id"])
        assert rows(folder) == rows(local[m["policy"], m["budget"]]), folder.name
    assert sorted(tasks) == list(range(6))
    from keyformer.lab.collect import main as collect

    assert collect([str(sweep_dir), str(tmp_path / "results")]) == 0
    import pandas as pd

    got = pd.read_csv(tmp_path / "results" / "points.csv")
    assert len(got) == 6 and got["complete"].all() and (got["n_done"] == 2).all()
    assert len(pd.read_csv(tmp_path / "results" / "samples.csv")) == 12
    r = subprocess.run(cmd, capture_output=True, text=True, env=cluster, timeout=120)
    assert r.returncode == 0 and "nothing to submit: 6 points finished" in r.stdout, r.stdout + r.stderr
