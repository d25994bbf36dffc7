"""``task=lm_eval`` job: lm-eval's ``simple_evaluate`` under a cache policy, through the results contract.

``output_dir/`` (same contract as :mod:`keyformer.run.results`):

* ``config.yaml``: the resolved run config;
* ``predictions.jsonl``: one row per (task, doc): ``id, task, doc_id, target, loglikelihoods, is_greedy``
  and the per-doc metrics (``acc``, ``acc_norm``...); written when the run finishes;
* ``metrics.json``: ``tasks: {name: {acc, acc_stderr, acc_norm, acc_norm_stderr, n_samples, lm_eval_task}}``
  plus flat ``<task>/<metric>`` keys (for W&B), ``model, policy, budget, recent, policy_params, policy_spec,
  loglikelihood, num_fewshot, limit, seed, versions, git_commit, wall_s`` and ``complete: true``.

Resume: a complete ``output_dir`` is skipped; an incomplete one is recomputed (lm-eval runs are short;
sweeps get one directory per point). Validation, the resume identity, metrics.json, W&B and the summary
come from the job scaffold (:mod:`keyformer.run.scaffold`); this module is its ``lm_eval`` plug-in.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from keyformer.run.scaffold import Job, Task, policy_fields, run_job

TASKS_DIR = Path(__file__).resolve().parent / "tasks"
LOCAL_TASKS = ("piqa", "winogrande", "openbookqa", "copa", "hellaswag", "arc_easy", "arc_challenge",
               "lambada_openai")
METRICS = ("acc", "acc_norm", "perplexity", "exact_match")


def task_names(tasks: Any) -> list[str]:
    """``task.tasks`` as a list: a list, or one string with comma-separated names."""
    if isinstance(tasks, str):
        return [t.strip() for t in tasks.split(",") if t.strip()]
    return [str(t) for t in tasks]


def lm_eval_name(name: str, local: bool) -> str:
    """The lm-eval task that runs ``name``: the offline ``kf_<name>`` YAML when ``local`` and one exists."""
    return f"kf_{name}" if local and name in LOCAL_TASKS else name


def validate_lm_eval(cfg: Mapping[str, Any]) -> Any:
    """Cheap checks of the ``task`` node (ConfigError naming the key), of the shared keys (budget, device,
    dtype, model, policy) and of the task names: unknown to lm-eval, or needing the hub while it is
    offline. Returns the job's policy (built once, by the shared check)."""
    from keyformer.run.tasks.lm_eval.adapter import SEMANTICS
    from keyformer.run.validate import ConfigError, validate_common

    t = cfg["task"]
    if cfg.get("kv_quant") is not None:
        raise ConfigError("kv_quant", cfg["kv_quant"], "is not supported by task=lm_eval yet; valid: null")
    if not task_names(t.get("tasks") or []):
        raise ConfigError("task.tasks", t.get("tasks"), "name at least one lm-eval task, e.g. [piqa, copa]")
    if t.get("loglikelihood") not in SEMANTICS:
        raise ConfigError("task.loglikelihood", t.get("loglikelihood"), f"allowed: {', '.join(SEMANTICS)}")
    for key in ("num_fewshot", "batch_size", "bootstrap_iters"):
        v = t.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if key == "batch_size" else 0):
            raise ConfigError(f"task.{key}", v, "must be a non-negative integer (batch_size >= 1)")
    limit = t.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError("task.limit", limit, "null (all docs) or an integer >= 1 (first N docs per task)")
    policy = validate_common(cfg)
    if t["loglikelihood"] == "per_row":  # per_row implements some policies' rules only: refuse the others
        from keyformer.run.tasks.lm_eval.per_row import unsupported

        reason = unsupported(policy)
        if reason is not None:
            raise ConfigError("task.loglikelihood", "per_row", reason)
    check_task_names(task_names(t["tasks"]), bool(t.get("local", True)))
    return policy


@lru_cache(maxsize=2)
def _task_manager(include_defaults: bool) -> Any:
    """lm-eval's TaskManager over the local YAMLs, plus lm-eval's own tasks when asked (indexing them takes
    a few seconds, once per process)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS_DIR), include_defaults=include_defaults)


def _hf_home() -> Path:
    return Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface").expanduser()


def _dataset_cached(path: str) -> bool:
    """True when the hub dataset ``path`` is in a local cache (the hub cache or datasets' own)."""
    hub = Path(os.environ.get("HF_HUB_CACHE") or _hf_home() / "hub").expanduser()
    ds = Path(os.environ.get("HF_DATASETS_CACHE") or _hf_home() / "datasets").expanduser()
    return (hub / f"datasets--{path.replace('/', '--')}").is_dir() or (ds / path.replace("/", "___")).is_dir()


def _offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"))


def check_task_names(names: list[str], local: bool) -> None:
    """ConfigError for a task lm-eval does not know, or one whose hub data is not cached while offline."""
    from keyformer.run.validate import ConfigError

    builtin = [n for n in names if lm_eval_name(n, local) == n]
    if not builtin:
        return
    index = _task_manager(True).task_index
    for n in builtin:
        if n not in index:
            raise ConfigError("task.tasks", n, f"unknown lm-eval task; offline copies (task.local=true): "
                                               f"{', '.join(LOCAL_TASKS)}; lm-eval's own: `lm_eval --tasks "
                                               f"list`")
        entry_cfg = getattr(index[n], "cfg", None) or {}
        path = entry_cfg.get("dataset_path") if isinstance(entry_cfg, Mapping) else None
        if _offline() and isinstance(path, str) and not Path(path).exists() and not _dataset_cached(path):
            hint = "use task.local=true (offline copy in $KEYFORMER_DATA_DIR)" if n in LOCAL_TASKS else \
                "run it once with network access"
            raise ConfigError("task.tasks", n, f"lm-eval's {n} reads the hub dataset {path}, which is not "
                                               f"cached "
                                               f"and the hub is offline "
                                               f"(HF_DATASETS_OFFLINE/HF_HUB_OFFLINE); {hint}")


def _num(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def task_metrics(results: Mapping[str, Any], name: str, lm_task: str) -> dict[str, Any]:
    """``{acc, acc_stderr, acc_norm, acc_norm_stderr, ..., n_samples}`` of one task from lm-eval's results."""
    res = results["results"][lm_task]
    out: dict[str, Any] = {"lm_eval_task": lm_task}
    for m in METRICS:
        if f"{m},none" in res:
            out[m] = _num(res[f"{m},none"])
            out[f"{m}_stderr"] = _num(res.get(f"{m}_stderr,none"))
    n = (results.get("n-samples") or {}).get(lm_task) or {}
    out["n_samples"] = n.get("effective", n.get("original"))
    return out


def _prediction_rows(name: str, samples: list[dict]) -> list[dict]:
    rows = []
    for s in samples:
        resps = [r[0] if isinstance(r, list) and r else r for r in s.get("resps", [])]  # one per request
        row = {"id": f"{name}/{s['doc_id']}", "task": name, "doc_id": s["doc_id"], "target": s.get("target")}
        if resps and all(isinstance(r, list | tuple) and len(r) == 2 for r in resps):
            row["loglikelihoods"] = [float(r[0]) for r in resps]
            row["is_greedy"] = [bool(r[1]) for r in resps]
        else:
            row["response"] = resps
        row.update({m: s[m] for m in METRICS if m in s})
        rows.append(row)
    return rows


class LmEvalTask(Task):
    """``task=lm_eval``: lm-eval's ``simple_evaluate`` under the cache policy. Rows are written when the
    evaluation finishes, so a partial folder is recomputed (``resumable = False``)."""

    name = "lm_eval"
    resumable = False
    data = ("run/tasks/lm_eval/tasks",)  # the kf_* task YAMLs lm-eval reads

    def __init__(self, model: Any = None, tokenizer: Any = None):
        self.model, self.tokenizer = model, tokenizer

    def validate(self, cfg: Mapping[str, Any]) -> Any:
        return validate_lm_eval(cfg)

    def versions(self) -> dict[str, str]:
        return {"lm-eval": _pkg_version("lm_eval") or "unknown"}

    def run(self, job: Job) -> dict[str, Any]:
        import lm_eval
        import torch

        from .adapter import KeyformerLM

        cfg, t = job.cfg, job.cfg["task"]
        names = task_names(t["tasks"])
        local = bool(t.get("local", True))
        lm_tasks = [lm_eval_name(n, local) for n in names]
        seed = int(cfg["seed"])
        torch.manual_seed(seed)
        model, tokenizer = self.model, self.tokenizer
        if model is None:
            from keyformer.run.loading import load_model
            from keyformer.run.validate import JobError, first_line

            try:
                model, tokenizer = load_model(cfg)
            except OSError as e:
                raise JobError(f"model {cfg['model']['name']!r} could not be loaded: "
                               f"{first_line(e)}") from None
        policy = job.policy  # built once by the scaffold
        lm = KeyformerLM(model, tokenizer, policy, semantics=t["loglikelihood"],
                         batch_size=int(t["batch_size"]),
                         seed=seed)
        builtin = any(lt == n for lt, n in zip(lm_tasks, names, strict=True))
        tm = _task_manager(builtin)
        job.begin(model)
        try:
            res = lm_eval.simple_evaluate(
                model=lm, tasks=lm_tasks, num_fewshot=int(t["num_fewshot"]), limit=t.get("limit"),
                task_manager=tm, bootstrap_iters=int(t["bootstrap_iters"]), log_samples=True,
                                          random_seed=seed,
                numpy_random_seed=seed, torch_random_seed=seed,
                                          fewshot_random_seed=int(t.get("fewshot_seed", 1234)),
                verbosity="ERROR",
            )
        except (ConnectionError, FileNotFoundError) as e:  # the data of a task cannot be fetched
            from keyformer.run.validate import JobError, first_line

            raise JobError(f"lm-eval could not load the data of task.tasks={names}: "
                           f"{first_line(e)}") from None
        if res is None:
            raise RuntimeError("lm_eval.simple_evaluate returned no results")
        per_task = {n: task_metrics(res, n, lt) for n, lt in zip(names, lm_tasks, strict=True)}
        for n, lt in zip(names, lm_tasks, strict=True):
            for row in _prediction_rows(n, res.get("samples", {}).get(lt, [])):
                job.add(row)
        return {
            "tasks": per_task, "dataset": ",".join(names),
            **{f"{n}/{k}": v for n, m in per_task.items() for k, v in m.items() if k != "lm_eval_task"},
            **policy_fields(policy),
            "loglikelihood": t["loglikelihood"], "num_fewshot": int(t["num_fewshot"]),
                "limit": t.get("limit"),
            "batch_size": int(t["batch_size"]), "complete": True,
        }

    def format_table(self, metrics: Mapping[str, Any]) -> str:
        return format_table(metrics)


def run_lm_eval(cfg: Mapping[str, Any], model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Run ``cfg['task']`` (``name: lm_eval``) under the configured policy through the job scaffold; return
    and write metrics. ``model``/``tokenizer`` skip loading (tests); otherwise
    ``keyformer.run.loading.load_model``.
    """
    return run_job(cfg, LmEvalTask(model, tokenizer))


def _pkg_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def format_table(m: Mapping[str, Any]) -> str:
    """One line per task: acc (± stderr) and acc_norm."""
    head = (f"{m['model']} | {m['policy']} budget={m['budget']} | {m['loglikelihood']} | "
            f"{m['num_fewshot']}-shot")
    lines = [head]
    for n, r in m["tasks"].items():
        def f(k: str, r: Mapping[str, Any] = r) -> str:
            v, s = r.get(k), r.get(f"{k}_stderr")
            return "-" if v is None else f"{v:.4f}" + (f" ± {s:.4f}" if s is not None else "")
        lines.append(f"  {n:<16} n={r.get('n_samples')}  acc={f('acc')}  acc_norm={f('acc_norm')}")
    return "\n".join(lines)
