"""One experiment job: load data and model, batch, generate with a KV policy, score, write results.

The only dependency on the core library is :func:`core_backend` (model loading, ``make_policy`` and
``generate``); tests inject a fake :class:`Backend` to exercise batching, results and resume.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keyformer.data import encode_prompt, load_records
from keyformer.metrics import ROUGE_KEYS, aggregate, rouge, sentence_splitter
from keyformer.results import ResultsDir, git_commit, versions


@dataclass
class Backend:
    """The model-facing side of a run; see :func:`core_backend` for the real one."""

    load: Callable[[Mapping[str, Any]], tuple[Any, Any]]  # cfg -> (model, tokenizer)
    make_policy: Callable[..., Any]  # make_policy(name, **kwargs) -> Policy
    generate: Callable[..., Any]  # keyformer.generate.generate


def core_backend() -> Backend:
    """The real backend: ``keyformer.loading.load_model`` + the core's ``make_policy`` and ``generate``."""
    from keyformer.generate import generate
    from keyformer.loading import load_model
    from keyformer.policies import make_policy

    return Backend(load=load_model, make_policy=make_policy, generate=generate)


def policy_kwargs(cfg: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(name, kwargs) of the ``policy`` node (``_target_`` + the policy's dataclass fields)."""
    from keyformer.policies import split_node

    return split_node(cfg["policy"])


def _policy_params(policy: Any) -> dict[str, Any]:
    if dataclasses.is_dataclass(policy) and not isinstance(policy, type):
        return dataclasses.asdict(policy)
    return {}


def _device(model: Any) -> Any:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return getattr(model, "device", "cpu")


def _left_pad(prompts: Sequence[Sequence[int]], pad_id: int, device: Any) -> tuple[Any, Any]:
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def _generated(tokens: Sequence[int], eos_id: int | None, pad_id: int | None) -> list[int]:
    """Generated tokens up to and including the first eos (the core pads after eos)."""
    out = list(tokens)
    if eos_id is not None and eos_id in out:
        return out[: out.index(eos_id) + 1]
    while out and pad_id is not None and out[-1] == pad_id:
        out.pop()
    return out


def _postprocess(text: str, stops: Sequence[str]) -> str:
    for s in stops or ():
        if s and s in text:
            text = text[: text.index(s)]
    return text.strip()


def prompt_limit(cfg: Mapping[str, Any], model: Any) -> int:
    """``max_prompt_tokens``, lowered so prompt + new tokens fit the model's positional limit."""
    from keyformer.loading import context_length

    limit = int(cfg["max_prompt_tokens"])
    ctx = context_length(model) if hasattr(model, "config") else None
    if ctx:
        limit = min(limit, ctx - int(cfg["generation"]["max_new_tokens"]))
    return limit


def format_table(m: Mapping[str, Any]) -> str:
    """Human-readable one-run summary."""
    def f(v: Any, nd: int = 2) -> str:
        return f"{v:.{nd}f}" if isinstance(v, float) and math.isfinite(v) else str(v)

    kv = m.get("kv_bytes", float("nan"))
    rows = [
        ("model", m.get("model")), ("dataset", m.get("dataset")), ("policy", m.get("policy")),
        ("budget", m.get("budget")), ("samples", m.get("n_samples")),
        *[(k, f(m.get(k))) for k in ROUGE_KEYS],
        ("prefill ms", f(m.get("prefill_ms"), 1)), ("decode ms/token", f(m.get("decode_ms_per_token"), 1)),
        ("tokens/s", f(m.get("tokens_per_s"), 1)),
        ("KV MiB (held)", f(kv / 2**20 if isinstance(kv, float | int) else kv, 3)),
        ("KV MiB (full)", f(m.get("kv_bytes_full", float("nan")) / 2**20, 3)),
        ("KV ratio", f(m.get("kv_ratio"), 3)),
    ]
    w = max(len(k) for k, _ in rows)
    line = "-" * (w + 24)
    return "\n".join([line, *(f"{k:<{w}}  {v}" for k, v in rows), line])


def _unique_ids(records: list[dict]) -> list[dict]:
    seen: dict[str, int] = {}
    for r in records:
        n = seen.get(r["id"], 0)
        seen[r["id"]] = n + 1
        if n:
            r["id"] = f"{r['id']}#{n}"
    return records


def run(cfg: Mapping[str, Any], backend: Backend | None = None) -> dict[str, Any]:
    """Run one job described by the resolved config ``cfg`` (a plain dict) and return its metrics."""
    t_start = time.perf_counter()
    rd = ResultsDir(cfg["output_dir"])
    if cfg.get("resume", True):
        rd.check_config(cfg)  # never skip or extend results of a different config
    if cfg.get("resume", True) and rd.is_complete():
        metrics = rd.metrics() or {}
        print(f"[keyformer] {rd.path}: complete results found, skipping", flush=True)
        print(format_table(metrics), flush=True)
        return metrics
    if not cfg.get("resume", True):
        for name in ("predictions.jsonl", "metrics.json"):
            (rd.path / name).unlink(missing_ok=True)
    rd.write_config(cfg)

    records = _unique_ids(load_records(cfg["dataset"], int(cfg["n_samples"]), int(cfg["seed"])))
    done = {r["id"] for r in rd.predictions()}
    todo = [r for r in records if r["id"] not in done]
    name, kwargs = policy_kwargs(cfg)
    policy_params: dict[str, Any] = {}
    if todo:
        backend = backend or core_backend()
        policy_params = _generate_all(cfg, backend, rd, todo, len(records), len(done), name, kwargs)
    rows_by_id = {r["id"]: r for r in rd.predictions()}
    rows = [rows_by_id[r["id"]] for r in records if r["id"] in rows_by_id]
    metrics = _metrics(cfg, rows, complete=len(rows) == len(records), name=name, params=policy_params,
                       wall_s=time.perf_counter() - t_start)
    rd.write_metrics(metrics)
    if (cfg.get("logger") or {}).get("name") == "wandb":
        from keyformer.logging_wandb import WandbLogger

        WandbLogger(cfg, cfg, rd.path).finish(metrics, rows, bool(cfg["logger"].get("log_samples", True)))
    print(format_table(metrics), flush=True)
    print(f"[keyformer] results in {rd.path}", flush=True)
    return metrics


def _generate_all(
    cfg: Mapping[str, Any], backend: Backend, rd: ResultsDir, todo: list[dict], total: int, n_done: int,
    name: str, kwargs: dict[str, Any],
) -> dict[str, Any]:
    import torch
    from tqdm import tqdm

    torch.manual_seed(int(cfg["seed"]))
    model, tok = backend.load(cfg)
    policy = backend.make_policy(name, **kwargs)
    ds, gen = cfg["dataset"], cfg["generation"]
    limit = prompt_limit(cfg, model)
    chat = bool(cfg["model"].get("chat_template")) and getattr(tok, "chat_template", None) is not None
    encoded = [encode_prompt(tok, r, ds.get("template", "alpaca"), ds.get("instruction", ""), limit, chat)
               for r in todo]
    device, bs = _device(model), int(cfg["batch_size"])
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    gen_kwargs = dict(max_new_tokens=int(gen["max_new_tokens"]), num_beams=int(gen["num_beams"]),
                      seed=int(cfg["seed"]), mode=gen.get("mode", "physical"), eos_token_id=tok.eos_token_id,
                      pad_token_id=pad_id, min_new_tokens=int(gen.get("min_new_tokens", 0)))
    with torch.inference_mode():
        if cfg.get("warmup", True):
            ids, mask = _left_pad([encoded[0][0][-32:]], pad_id, device)
            backend.generate(model, ids, mask, policy, **{**gen_kwargs, "max_new_tokens": 2, "min_new_tokens": 0})
        bar = tqdm(total=total, initial=n_done, unit="sample", disable=not cfg.get("progress", True))
        for start in range(0, len(todo), bs):
            batch, enc = todo[start:start + bs], encoded[start:start + bs]
            ids, mask = _left_pad([e[0] for e in enc], pad_id, device)
            out = backend.generate(model, ids, mask, policy, **gen_kwargs)
            seqs = out.sequences.tolist()
            for j, rec in enumerate(batch):
                toks = _generated(seqs[j], tok.eos_token_id, pad_id)
                text = _postprocess(tok.decode(toks, skip_special_tokens=True), gen.get("stop") or [])
                row = {
                    "id": rec["id"], "prompt_tokens": len(enc[j][0]), "truncated_tokens": enc[j][1],
                    "generated_tokens": len(toks), "prediction": text, "reference": rec["reference"],
                    **rouge(text, rec["reference"]),
                    "kv_bytes": int(out.kv_bytes[j]), "kv_bytes_full": int(out.kv_bytes_full[j]),
                    "batch": batch[0]["id"], "batch_size": len(batch), "prefill_ms": 1000.0 * out.prefill_s,
                    "decode_ms": 1000.0 * out.decode_s, "n_decode_steps": int(out.n_decode_steps),
                }
                rd.append_prediction(row)
                bar.update(1)
        bar.close()
    return _policy_params(policy)


def _metrics(cfg: Mapping[str, Any], rows: list[dict], complete: bool, name: str, params: dict[str, Any],
             wall_s: float) -> dict[str, Any]:
    from keyformer.errors import resolve_device, resolve_dtype

    device = resolve_device(cfg["device"])
    m: dict[str, Any] = aggregate(rows) if rows else {"n_samples": 0}
    m.update(
        model=cfg["model"]["name"], dataset=cfg["dataset"]["name"], policy=name,
        budget=cfg["policy"].get("budget", cfg["budget"]) if name != "full" else 1.0,
        recent=cfg["policy"].get("recent", cfg["recent"]), policy_params=params or dict(cfg["policy"]),
        seed=cfg["seed"], generation=dict(cfg["generation"]), max_prompt_tokens=cfg["max_prompt_tokens"],
        batch_size=cfg["batch_size"], device=device, dtype=resolve_dtype(cfg["dtype"], device),
        sentence_splitter=sentence_splitter(), versions=versions(), git_commit=git_commit(),
        wall_s=wall_s, complete=complete,
    )
    return m
