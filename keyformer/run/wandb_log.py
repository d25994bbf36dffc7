"""Optional Weights & Biases logging: one run per job, grouped by sweep. Failures are warnings only.

Mode: ``logger.mode`` if set, else ``WANDB_MODE`` if set, else ``online`` when an API key is configured
(``WANDB_API_KEY`` or a ``api.wandb.ai`` entry in ~/.netrc from ``wandb login``), else ``offline``
(sync later with ``wandb sync``). Local results are always written before anything is sent to W&B.

Group (:func:`group_name`): ``logger.group``, else the top-level ``name``, else the experiment
(``+experiment=<study>``), else the sweep folder's name unless it is Hydra's default time stamp, else
``<dataset>-<date>_<time>`` from the default folders. Per run: the config, the summary metrics, a
per-sample table (``logger.log_samples``) and a per-step history (``logger.log_steps``,
:func:`step_history`). ``docs/wandb.md`` says what each holds.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

STEP_KEY = "decode_step"  # the x axis of the per-step history
_STAMP = re.compile(r"\d{4}-\d{2}-\d{2}|\d{2}-\d{2}-\d{2}")  # Hydra's default ${now:...} folder names


def _configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


def wandb_mode(requested: str | None = None) -> str:
    if requested:
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if _configured() else "offline"


def logs_steps(cfg: Mapping[str, Any]) -> bool:
    """Whether this job's W&B run gets the per-step history (``logger=wandb`` with ``logger.log_steps``)."""
    lg = cfg.get("logger") or {}
    return lg.get("name") == "wandb" and bool(lg.get("log_steps", True))


def hydra_experiment() -> str | None:
    """The ``+experiment=<study>`` of the running Hydra job, or None (no Hydra, or no experiment)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().runtime.choices.get("experiment") if HydraConfig.initialized() else None
    except Exception:  # noqa: BLE001 - a name is a convenience, never a failure
        return None


def group_name(cfg: Mapping[str, Any], output_dir: str | os.PathLike, experiment: str | None = None) -> str:
    """The W&B group of a job: ``logger.group``; else ``name``; else the ``experiment`` (default: the running
    Hydra job's ``+experiment``); else the sweep folder's name (the parent of ``output_dir``) unless it is a
    date or a time (Hydra's default ``multirun/<date>/<time>``); else ``<dataset>-<date>_<time>`` from the
    nearest date and time folders above the job, so every job of one default sweep shares it and two sweeps
    never do."""
    lg = cfg.get("logger") or {}
    for given in (lg.get("group"), cfg.get("name"), experiment or hydra_experiment()):
        if given not in (None, ""):
            return str(given)
    out = Path(output_dir).resolve()
    if out.parent.name and not _STAMP.fullmatch(out.parent.name):
        return out.parent.name
    stamps = [p for p in out.parts if _STAMP.fullmatch(p)]
    dataset = str((cfg.get("dataset") or {}).get("name") or "run")
    return f"{dataset}-{'_'.join(stamps[-2:])}" if stamps else f"{dataset}-{out.name}"


def step_history(steps: Sequence[Mapping[str, Any]]) -> list[dict[str, float | int]]:
    """One history row per decode step ``t`` from the per-call records of a job (``{"rows": samples,
    "step_s": [seconds of decode step 1, 2, ...], "kv_bytes": [mean live KV bytes per sample after the
    prompt, after step 1, ...]}``), over the calls that reached ``t``: ``step/decode_ms`` (mean of the
    calls' step latency), ``step/tokens_per_s`` (their samples / their summed seconds), ``step/kv_bytes``
    (mean per sample, weighted by samples) and ``step/samples``. Row 0 is the prompt's: KV bytes only."""
    n = max((max(len(s.get("step_s") or ()) + 1, len(s.get("kv_bytes") or ())) for s in steps), default=0)
    out = []
    for t in range(n):
        row: dict[str, float | int] = {STEP_KEY: t}
        kv = [(s["rows"], s["kv_bytes"][t]) for s in steps if len(s.get("kv_bytes") or ()) > t]
        if kv:
            row["step/kv_bytes"] = sum(r * b for r, b in kv) / sum(r for r, _ in kv)
        sec = [(s["rows"], s["step_s"][t - 1]) for s in steps if t > 0 and len(s.get("step_s") or ()) >= t]
        if sec:
            row["step/decode_ms"] = 1000.0 * sum(x for _, x in sec) / len(sec)
            total = sum(x for _, x in sec)
            row["step/tokens_per_s"] = sum(r for r, _ in sec) / total if total > 0 else float("nan")
        row["step/samples"] = max(sum(r for r, _ in kv), sum(r for r, _ in sec))
        out.append(row)
    return out


def _table(rows: Sequence[Mapping[str, Any]]) -> Any:
    import wandb

    cols = list(dict.fromkeys(c for r in rows for c in r))
    return wandb.Table(columns=cols, data=[[r.get(c) for c in cols] for r in rows])


class WandbLogger:
    """Thin wrapper; every call swallows exceptions into warnings."""

    def __init__(self, cfg: Mapping[str, Any], config: Mapping[str, Any], output_dir: str | os.PathLike):
        self.run: Any = None
        lg = cfg.get("logger") or {}
        out = Path(output_dir).resolve()
        try:
            import wandb

            self.run = wandb.init(
                project=lg.get("project") or "keyformer",
                entity=lg.get("entity"),
                group=group_name(cfg, out),
                name=out.name,
                tags=list(lg.get("tags") or []),
                config=dict(config),
                dir=str(out),
                mode=wandb_mode(lg.get("mode")),
                reinit="finish_previous",
            )
        except Exception as e:  # noqa: BLE001 - W&B must never cost results
            warnings.warn(f"W&B disabled for this job: {type(e).__name__}: {e}", stacklevel=2)

    def finish(self, metrics: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
               log_samples: bool = True, steps: Sequence[Mapping[str, Any]] | None = None) -> None:
        if self.run is None:
            return
        try:
            history = step_history(steps or [])
            if history:
                self.run.define_metric(STEP_KEY)
                self.run.define_metric("step/*", step_metric=STEP_KEY)
                for row in history:
                    self.run.log(row)
            self.run.summary.update({k: v for k, v in metrics.items()
                                     if isinstance(v, int | float | str | bool)})
            if log_samples and rows:
                self.run.log({"samples": _table(rows)})
            self.run.finish()
            if self.run.offline:  # the file is closed after finish returns: a reader in this process waits
                from .wandb_offline import wait_written

                wait_written(self.run.settings.sync_file)
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"W&B logging failed (local results are complete): {type(e).__name__}: {e}",
                          stacklevel=2)
        finally:
            self.run = None


def findings_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The findings of a ``findings.json`` document as flat rows: each finding's fields, its ``meta`` keys
    prefixed ``meta_`` (lists and dicts as text)."""
    rows = []
    for f in doc.get("findings") or []:
        row = {k: v for k, v in f.items() if k != "meta"}
        row.update({f"meta_{k}": v for k, v in (f.get("meta") or {}).items()})
        rows.append({k: v if isinstance(v, int | float | str | bool) or v is None else str(v)
                     for k, v in row.items()})
    return rows


def log_findings_table(run_or_group: Any, doc: Mapping[str, Any], key: str = "findings", *,
                       project: str = "keyformer", entity: str | None = None, mode: str | None = None,
                       directory: str | os.PathLike | None = None) -> None:
    """Log a sweep's findings (a ``findings.json`` document, ``keyformer-report --sweep``) as the W&B Table
    ``key``: into ``run_or_group`` when it is a run, else into a run named ``findings`` (job type
    ``findings``) of the group of that name, which it starts and finishes (offline: returns once the run's
    file is written). Raises on failure (an explicit call, not a side effect of a job)."""
    import wandb

    rows = findings_rows(doc)
    if not rows:
        raise ValueError(f"findings document {doc.get('study') or ''!r} has no findings to log")
    if not isinstance(run_or_group, str):
        run_or_group.log({key: _table(rows)})
        return
    run = wandb.init(project=project, entity=entity, group=run_or_group, name="findings", job_type="findings",
                     config={k: v for k, v in doc.items() if k != "findings"}, mode=wandb_mode(mode),
                     dir=str(directory) if directory is not None else None, reinit="finish_previous")
    try:
        run.log({key: _table(rows)})
    finally:
        run.finish()
    if run.offline:  # W&B closes the run's file after finish returns: wait, so a reader right after sees it
        from .wandb_offline import wait_written

        wait_written(run.settings.sync_file)
