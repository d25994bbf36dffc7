"""Results contract of one run (public: notebooks, W&B and checks read it), atomic writes and resume.

``output_dir/``
  * ``config.yaml``: the resolved Hydra config of the job, plus ``resolved``: what it ran as (device and
    dtype after ``auto``, model revision, the versions of torch, transformers and this project's code).
  * ``predictions.jsonl``: one JSON object per finished sample, appended as it finishes:
    ``id, prompt_tokens, truncated_tokens, generated_tokens, prediction, reference, rouge1, rouge2, rougeL,
    rougeLsum, kv_bytes, kv_bytes_full, batch, batch_size, prefill_ms, decode_ms, n_decode_steps``
    (timings are per batch, repeated on each of its samples).
  * ``metrics.json``: aggregate metrics (see ``keyformer.run.metrics.aggregate``) plus ``model, dataset,
    policy, budget, recent, policy_params, seed, n_samples, versions, git_commit, sentence_splitter``,
    ``slurm`` (the SLURM job that wrote it, :func:`slurm_job`; null outside SLURM) and ``complete: true``
    once every sample is done.

Resume: a directory whose metrics.json says ``complete`` is skipped; otherwise samples whose ids are
already in predictions.jsonl are not recomputed. A torn last line (a kill mid-write) is dropped.
A folder whose config.yaml differs (other than in :data:`VOLATILE_KEYS`) or whose ``resolved`` identity
differs is never resumed, skipped, overwritten or deleted: :meth:`ResultsDir.check` raises ResumeError; so is
a folder holding results without a config.yaml. While a job writes, it holds the folder
(:mod:`keyformer.run.folder_lock`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from keyformer.run.validate import UserError

CONFIG, PREDICTIONS, METRICS = "config.yaml", "predictions.jsonl", "metrics.json"
# the run's log: what it printed (summary, resume line); Hydra's job log when it is the run folder
LOG = "run.log"
# Keys that may differ between the original run and its resumption.
VOLATILE_KEYS = frozenset({"output_dir", "logger", "progress", "resume", "stop_after", "share_prompt",
                           "name"})
RESOLVED = "resolved"  # the identity block of config.yaml
# Packages whose version can change a number (model code, tokenization, scoring): recorded in ``resolved``
# and compared on resume like the rest of the identity (a different version refuses the resume).
IDENTITY_PACKAGES = ("torch", "transformers", "tokenizers", "rouge-score", "nltk")
# Identity entries added after folders were first written: a folder that lacks one resumes (with a line
# saying so) and records it; a folder that has one compares it.
ADDED_IDENTITY = ("versions.tokenizers", "versions.rouge-score", "versions.nltk", "policy_code", "data_files")


class ResumeError(UserError, ValueError):
    """output_dir holds results of a different configuration or identity (nothing was changed)."""


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, Mapping) and d:
        return {k2: v2 for k, v in d.items() for k2, v2 in _flat(v, f"{prefix}{k}.").items()}
    return {prefix.rstrip("."): d}


def _short(v: Any, n: int = 40) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."


def config_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``key: old -> new`` for each differing leaf (dotted keys), volatile keys and the identity excluded."""
    a = _flat({k: v for k, v in old.items() if k not in VOLATILE_KEYS and k != RESOLVED})
    b = _flat({k: v for k, v in new.items() if k not in VOLATILE_KEYS and k != RESOLVED})
    missing = object()
    return [f"{k}: {_short(a.get(k, missing)) if k in a else '(absent)'} -> "
            f"{_short(b[k]) if k in b else '(absent)'}"
            for k in sorted(set(a) | set(b)) if a.get(k, missing) != b.get(k, missing)]


def _prefix(key: str, prefixes: Sequence[str]) -> str | None:
    return next((p for p in prefixes if key == p or key.startswith(p + ".")), None)


def _added(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, str]:
    """``{dotted key: entry}`` of ``new`` that ``old`` predates (an :data:`ADDED_IDENTITY` entry it has not
    at all), and ``model_revision`` when an embedded model's weights checksum was added to a revision
    recorded without one."""
    a, b = _flat(dict(old)), _flat(dict(new))
    out = {}
    for k in b:
        p = _prefix(k, ADDED_IDENTITY)
        if p and not any(_prefix(x, (p,)) for x in a):
            out[k] = p
    ra, rb = old.get("model_revision"), new.get("model_revision")
    if isinstance(ra, str) and isinstance(rb, str) and "+" not in ra and rb.startswith(ra + "+"):
        out["model_revision"] = "model_revision (weights checksum)"
    return out


def identity_added(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """The identity entries an older folder did not record (they are recorded from its next write on)."""
    return sorted(set(_added(old, new).values())) if old else []


def identity_diff(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> list[str]:
    """Differences of the ``resolved`` identity; a model revision unknown on one side is not compared, nor
    an entry the old folder predates (:func:`identity_added`). A changed dataset file is named."""
    if not old:
        return [f"{RESOLVED}: not recorded (written by an older version) -> {_short(new.get('dtype'))} on "
                f"{_short(new.get('device'))}"]
    a, b = _flat(dict(old)), _flat(dict(new))
    skip = set(_added(old, new))
    out = []
    for k in sorted(set(a) | set(b)):
        if k in skip or k == "model_revision" and (a.get(k) is None or b.get(k) is None):
            continue
        if a.get(k) == b.get(k):
            continue
        if k.startswith("data_files."):
            name = k.split(".", 1)[1]
            out.append(f"dataset file {name} changed since these rows were computed (sha256 "
                       f"{_short(a.get(k))} -> {_short(b.get(k))})")
        else:
            out.append(f"{RESOLVED}.{k}: {_short(a.get(k))} -> {_short(b.get(k))}")
    return out


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file in the same folder and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, file_mode())  # mkstemp makes 0600: give every result file the mode open() gives
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def file_mode() -> int:
    """The mode ``open()`` gives a new file under the current umask (0644 under the usual 022)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


class ResultsDir:
    """Reads and writes the files of one run's ``output_dir``."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)

    def metrics(self) -> dict | None:
        p = self.path / METRICS
        return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None

    def is_complete(self) -> bool:
        m = self.metrics()
        return bool(m and m.get("complete"))

    def predictions(self) -> list[dict]:
        """Finished samples; a torn trailing line is dropped and the file rewritten without it."""
        p = self.path / PREDICTIONS
        if not p.is_file():
            return []
        rows, good, torn = [], [], False
        for line in p.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
                good.append(line)
            except json.JSONDecodeError:
                torn = True
        if torn:
            atomic_write_text(p, "".join(g + "\n" for g in good))
        return rows

    def append_prediction(self, row: Mapping[str, Any]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        with (self.path / PREDICTIONS).open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def append_log(self, text: str) -> None:
        """Append ``text`` (and a newline) to ``run.log`` when the folder exists (the run's own log)."""
        if self.path.is_dir():
            with (self.path / LOG).open("a", encoding="utf-8") as f:
                f.write(text.rstrip("\n") + "\n")

    def stored_config(self) -> dict | None:
        p = self.path / CONFIG
        if not p.is_file():
            return None
        from omegaconf import OmegaConf

        return OmegaConf.to_container(OmegaConf.load(p))

    def has_results(self) -> bool:
        return (self.path / PREDICTIONS).is_file() or (self.path / METRICS).is_file()

    def check(self, config: Mapping[str, Any], identity: Mapping[str, Any]) -> None:
        """Raise ResumeError, changing nothing, if the folder holds results of a config that differs from
        ``config`` (a non-volatile key) or an identity that differs from ``identity``; whether ``resume`` is
        true or false. A folder with no results, or a config.yaml alone, is free; results without a
        config.yaml are refused (whose they are cannot be known)."""
        old = self.stored_config()
        if not self.has_results():
            return
        if old is None:
            raise ResumeError(f"output_dir {self.path} holds results but no {CONFIG} (what made them is "
                              "unknown); nothing was changed. Choose a new output_dir, or move those files "
                              "away")
        diffs = config_diff(old, config) + identity_diff(old.get(RESOLVED), identity)
        if diffs:
            shown = "; ".join(diffs[:6]) + (f"; and {len(diffs) - 6} more" if len(diffs) > 6 else "")
            raise ResumeError(
                f"output_dir {self.path} holds results of another run ({shown}); nothing was changed. "
                "Ways out: a new output_dir, or resume=false into an empty folder"
            )

    def write_config(self, config: Mapping[str, Any], identity: Mapping[str, Any] | None = None) -> None:
        from omegaconf import OmegaConf

        data = {k: v for k, v in config.items() if k != RESOLVED}
        if identity is not None:
            data[RESOLVED] = dict(identity)
        atomic_write_text(self.path / CONFIG, OmegaConf.to_yaml(OmegaConf.create(data)))

    def clear(self) -> None:
        """Remove predictions and metrics (a restart of the *same* config: callers check first)."""
        for name in (PREDICTIONS, METRICS):
            (self.path / name).unlink(missing_ok=True)

    def remove_if_empty(self) -> None:
        """Remove the folder if nothing is left in it."""
        try:
            self.path.rmdir()
        except OSError:
            pass

    def discard(self, remove_dir: bool = False) -> None:
        """Undo a job that failed before its first result: remove its config.yaml (and the folder if it
        made it and it is now empty)."""
        (self.path / CONFIG).unlink(missing_ok=True)
        if remove_dir:
            try:
                self.path.rmdir()
            except OSError:
                pass

    def write_metrics(self, metrics: Mapping[str, Any]) -> None:
        atomic_write_json(self.path / METRICS, dict(metrics))


def _git(args: list[str], cwd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=5)


def git_dirty_files(repo: str | os.PathLike | None = None) -> list[str] | None:
    """Tracked files of the project checkout with uncommitted changes (``git status --porcelain`` paths,
    sorted; empty when clean), or None outside a git checkout."""
    cwd = str(repo or Path(__file__).resolve().parents[2])
    try:
        out = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return sorted(line[3:].split(" -> ")[-1] for line in out.stdout.splitlines() if line.strip())


def git_commit(repo: str | os.PathLike | None = None, dirty: list[str] | None = None) -> str | None:
    """HEAD commit of the project checkout (suffixed ``-dirty`` when there are local changes; which files:
    :func:`git_dirty_files`, or ``dirty`` when the caller already has them), or None."""
    cwd = str(repo or Path(__file__).resolve().parents[2])
    try:
        head = _git(["rev-parse", "HEAD"], cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("-dirty" if (git_dirty_files(repo) if dirty is None else dirty) else "")


CODE_PATHS = ("keyformer", "pyproject.toml")  # what computes a number; results, docs and tests do not


def code_tree(repo: str | os.PathLike | None = None, paths: Sequence[str] = CODE_PATHS) -> str | None:
    """Identity of the code that computes numbers: the git object ids of ``paths`` (default ``CODE_PATHS``)
    at HEAD (12 hex digits each, joined by ``+``), suffixed ``-dirty.<hash of the diff>`` when any of them has
    uncommitted changes; None outside a git checkout (or when a path is not in HEAD). Two commits that differ
    only outside ``paths`` (results, docs, tests) give the same value."""
    cwd = str(repo or Path(__file__).resolve().parents[2])
    try:
        out = _git(["rev-parse", *(f"HEAD:{p}" for p in paths)], cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    tree = "+".join(x[:12] for x in out.stdout.split())
    diff = _git(["diff", "HEAD", "--", *paths], cwd).stdout
    if not diff:
        return tree
    return f"{tree}-dirty.{hashlib.sha256(diff.encode()).hexdigest()[:8]}"  # which uncommitted changes


# metrics.json's ``slurm`` fields and the variables SLURM sets in a job's environment
SLURM_ENV = {"job_id": "SLURM_JOB_ID", "array_job_id": "SLURM_ARRAY_JOB_ID",
             "array_task_id": "SLURM_ARRAY_TASK_ID", "node": "SLURMD_NODENAME",
             "cluster": "SLURM_CLUSTER_NAME", "partition": "SLURM_JOB_PARTITION",
             "restart_count": "SLURM_RESTART_COUNT"}
SLURM_INTS = frozenset({"job_id", "array_job_id", "array_task_id", "restart_count"})


def slurm_job(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The SLURM job this process runs in, from its environment: ``job_id`` (the job's own id, unique per
    array task), ``array_job_id`` and ``array_task_id`` (null outside an array), ``node``, ``cluster``,
    ``partition`` and ``restart_count`` (0 unless SLURM requeued the job); None outside a SLURM job."""
    env = os.environ if environ is None else environ
    if not env.get("SLURM_JOB_ID"):
        return None
    out: dict[str, Any] = {}
    for field, var in SLURM_ENV.items():
        value = env.get(var) or None
        if value is not None and field in SLURM_INTS:
            value = int(value) if value.isdigit() else value  # ids are integers; keep anything else verbatim
        out[field] = value
    out["restart_count"] = out["restart_count"] or 0
    return out


def versions() -> dict[str, str]:
    """Versions of the packages that determine the numbers."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("keyformer-lab", *IDENTITY_PACKAGES, "hydra-core"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out
