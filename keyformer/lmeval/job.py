"""``task=lm_eval`` job: lm-eval's ``simple_evaluate`` under a cache policy, through the results contract.

``output_dir/`` (same contract as :mod:`keyformer.results`):

* ``config.yaml``: the resolved run config;
* ``predictions.jsonl``: one row per (task, doc): ``id, task, doc_id, target, loglikelihoods, is_greedy``
  and the per-doc metrics (``acc``, ``acc_norm``...); written when the run finishes;
* ``metrics.json``: ``tasks: {name: {acc, acc_stderr, acc_norm, acc_norm_stderr, n_samples, lm_eval_task}}``
  plus flat ``<task>/<metric>`` keys (for W&B), ``model, policy, budget, recent, policy_params,
  loglikelihood, num_fewshot, limit, seed, versions, git_commit, wall_s`` and ``complete: true``.

Resume: a complete ``output_dir`` is skipped; an incomplete one is recomputed (lm-eval runs are short;
sweeps get one directory per point).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

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


def validate_lm_eval(cfg: Mapping[str, Any]) -> None:
    """Cheap checks of the ``task`` node (ConfigError naming the key) and of the policy."""
    from keyformer.errors import ConfigError, check_budget, resolve_device, resolve_dtype
    from keyformer.lmeval.adapter import SEMANTICS
    from keyformer.policies import make_policy

    t = cfg["task"]
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
    check_budget(cfg["budget"])
    resolve_dtype(cfg["dtype"], resolve_device(cfg["device"]))
    from keyformer.runner import policy_kwargs

    name, kwargs = policy_kwargs(cfg)
    try:
        make_policy(name, **kwargs)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"policy ({name})", kwargs, str(e)) from None


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


def run_lm_eval(cfg: Mapping[str, Any], model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Run ``cfg['task']`` (``name: lm_eval``) under the configured policy; return and write metrics.

    ``model``/``tokenizer`` skip loading (tests); otherwise ``keyformer.loading.load_model(cfg)``.
    """
    import lm_eval
    import torch
    from lm_eval.tasks import TaskManager

    from keyformer.policies import make_policy
    from keyformer.results import ResultsDir, git_commit, versions
    from keyformer.runner import policy_kwargs

    from .adapter import KeyformerLM

    t_start = time.perf_counter()
    rd = ResultsDir(cfg["output_dir"])
    if cfg.get("resume", True) and rd.is_complete():
        print(f"[keyformer] {rd.path}: complete results found, skipping", flush=True)
        return rd.metrics() or {}
    for stale in ("predictions.jsonl", "metrics.json"):
        (rd.path / stale).unlink(missing_ok=True)
    rd.check_config(cfg)
    rd.write_config(cfg)

    t = cfg["task"]
    names = task_names(t["tasks"])
    local = bool(t.get("local", True))
    lm_tasks = [lm_eval_name(n, local) for n in names]
    seed = int(cfg["seed"])
    torch.manual_seed(seed)
    if model is None:
        from keyformer.loading import load_model

        model, tokenizer = load_model(cfg)
    pname, pkw = policy_kwargs(cfg)
    policy = make_policy(pname, **pkw)
    lm = KeyformerLM(model, tokenizer, policy, semantics=t["loglikelihood"], batch_size=int(t["batch_size"]),
                     seed=seed)
    builtin = any(lt == n for lt, n in zip(lm_tasks, names, strict=True))
    tm = TaskManager(include_path=str(TASKS_DIR), include_defaults=builtin)
    res = lm_eval.simple_evaluate(
        model=lm, tasks=lm_tasks, num_fewshot=int(t["num_fewshot"]), limit=t.get("limit"),
        task_manager=tm, bootstrap_iters=int(t["bootstrap_iters"]), log_samples=True, random_seed=seed,
        numpy_random_seed=seed, torch_random_seed=seed, fewshot_random_seed=int(t.get("fewshot_seed", 1234)),
        verbosity="WARNING",
    )
    if res is None:
        raise RuntimeError("lm_eval.simple_evaluate returned no results")
    per_task = {n: task_metrics(res, n, lt) for n, lt in zip(names, lm_tasks, strict=True)}
    for n, lt in zip(names, lm_tasks, strict=True):
        for row in _prediction_rows(n, res.get("samples", {}).get(lt, [])):
            rd.append_prediction(row)
    vers = versions()
    vers["lm-eval"] = lm_eval.__version__ if hasattr(lm_eval, "__version__") else _pkg_version("lm_eval")
    metrics: dict[str, Any] = {
        "task": "lm_eval", "tasks": per_task, "dataset": ",".join(names),
        **{f"{n}/{k}": v for n, m in per_task.items() for k, v in m.items() if k != "lm_eval_task"},
        "model": cfg["model"]["name"], "policy": pname,
        "budget": cfg["policy"].get("budget", cfg["budget"]) if pname != "full" else 1.0,
        "recent": cfg["policy"].get("recent", cfg["recent"]), "policy_params": _params(policy),
        "loglikelihood": t["loglikelihood"], "num_fewshot": int(t["num_fewshot"]), "limit": t.get("limit"),
        "seed": seed, "batch_size": int(t["batch_size"]), "versions": vers, "git_commit": git_commit(),
        "wall_s": time.perf_counter() - t_start, "complete": True,
    }
    rd.write_metrics(metrics)
    if (cfg.get("logger") or {}).get("name") == "wandb":
        from keyformer.logging_wandb import WandbLogger

        WandbLogger(cfg, cfg, rd.path).finish(metrics, rd.predictions(), bool(cfg["logger"].get("log_samples")))
    print(format_table(metrics), flush=True)
    print(f"[keyformer] results in {rd.path}", flush=True)
    return metrics


def _pkg_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _params(policy: Any) -> dict[str, Any]:
    import dataclasses

    return dataclasses.asdict(policy) if dataclasses.is_dataclass(policy) else {}


def format_table(m: Mapping[str, Any]) -> str:
    """One line per task: acc (± stderr) and acc_norm."""
    head = f"{m['model']} | {m['policy']} budget={m['budget']} | {m['loglikelihood']} | {m['num_fewshot']}-shot"
    lines = [head]
    for n, r in m["tasks"].items():
        def f(k: str, r: Mapping[str, Any] = r) -> str:
            v, s = r.get(k), r.get(f"{k}_stderr")
            return "-" if v is None else f"{v:.4f}" + (f" ± {s:.4f}" if s is not None else "")
        lines.append(f"  {n:<16} n={r.get('n_samples')}  acc={f('acc')}  acc_norm={f('acc_norm')}")
    return "\n".join(lines)
