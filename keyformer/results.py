"""Results contract of one run (public: notebooks, W&B and checks read it), atomic writes and resume.

``output_dir/``
  * ``config.yaml``: the resolved Hydra config of the job.
  * ``predictions.jsonl``: one JSON object per finished sample, appended as it finishes:
    ``id, prompt_tokens, truncated_tokens, generated_tokens, prediction, reference, rouge1, rouge2, rougeL,
    rougeLsum, kv_bytes, kv_bytes_full, batch, batch_size, prefill_ms, decode_ms, n_decode_steps``
    (timings are per batch, repeated on each of its samples).
  * ``metrics.json``: aggregate metrics (see ``keyformer.metrics.aggregate``) plus ``model, dataset, policy,
    budget, recent, policy_params, seed, n_samples, versions, git_commit, sentence_splitter`` and
    ``complete: true`` once every sample is done.

Resume: a directory whose metrics.json says ``complete`` is skipped; otherwise samples whose ids are
already in predictions.jsonl are not recomputed. A torn last line (a kill mid-write) is dropped.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CONFIG, PREDICTIONS, METRICS = "config.yaml", "predictions.jsonl", "metrics.json"
# Keys that may differ between the original run and its resumption.
VOLATILE_KEYS = frozenset({"output_dir", "logger", "progress", "resume"})


class ResumeError(ValueError):
    """output_dir holds results of a different configuration."""


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
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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

    def check_config(self, config: Mapping[str, Any]) -> None:
        """Raise ResumeError if an existing config.yaml differs from ``config`` in a non-volatile key."""
        p = self.path / CONFIG
        if not p.is_file():
            return
        from omegaconf import OmegaConf

        old = OmegaConf.to_container(OmegaConf.load(p))
        keys = sorted(k for k in set(old) | set(config) if k not in VOLATILE_KEYS and old.get(k) != config.get(k))
        if keys:
            raise ResumeError(
                f"output_dir {self.path} holds results of a different config (keys differ: {', '.join(keys)}); "
                "choose another output_dir or delete it"
            )

    def write_config(self, config: Mapping[str, Any]) -> None:
        from omegaconf import OmegaConf

        atomic_write_text(self.path / CONFIG, OmegaConf.to_yaml(OmegaConf.create(dict(config))))

    def write_metrics(self, metrics: Mapping[str, Any]) -> None:
        atomic_write_json(self.path / METRICS, dict(metrics))


def git_commit(repo: str | os.PathLike | None = None) -> str | None:
    """HEAD commit of the project checkout (suffixed ``-dirty`` when there are local changes), or None."""
    cwd = str(repo or Path(__file__).resolve().parent.parent)
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return head.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def versions() -> dict[str, str]:
    """Versions of the packages that determine the numbers."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for pkg in ("keyformer-lab", "torch", "transformers", "rouge-score", "hydra-core"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out
