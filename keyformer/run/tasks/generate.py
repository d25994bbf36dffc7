"""The generation task (``task=generate``): load data and model, batch, generate with a KV policy, score.

A plug-in of the job scaffold (:mod:`keyformer.run.scaffold`, which owns validation, resume, the results
files, W&B and the summary, and builds the job's policy once: ``Job.policy``). The only dependency on the core
library is :func:`core_backend` (model loading and ``generate``); tests inject a fake :class:`Backend` to
exercise batching and resume.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keyformer.run.data import encode_prompt, load_records
from keyformer.run.metrics import ROUGE_KEYS, aggregate, score, sentence_splitter
from keyformer.run.scaffold import Job, Task, policy_fields, run_job
from keyformer.run.validate import ConfigError, JobError, first_line


@dataclass
class Backend:
    """The model-facing side of a run; see :func:`core_backend` for the real one."""

    load: Callable[[Mapping[str, Any]], tuple[Any, Any]]  # cfg -> (model, tokenizer)
    generate: Callable[..., Any]  # keyformer.core.generate.generate
    generate_from_context: Callable[..., Any] | None = None  # keyformer.core.generate.generate_from_context


def core_backend() -> Backend:
    """The real backend: ``keyformer.run.loading.load_model`` + the core's ``generate``."""
    from keyformer.core.generate import generate, generate_from_context
    from keyformer.run.loading import load_model

    return Backend(load=load_model, generate=generate,
                   generate_from_context=generate_from_context)


def _device(model: Any) -> Any:
    try:
        return next(model.parameters()).device
    except (AttributeError, StopIteration, TypeError):
        return getattr(model, "device", "cpu")


_PROMPT_MEMO: Any = None  # the process's PromptMemo (share_prompt=true), kept across the jobs of a queue


def prompt_memo(cfg: Mapping[str, Any]) -> Any:
    """The process-wide :class:`keyformer.core.prompt_memo.PromptMemo` when ``share_prompt`` is true (the
    points of a budget sweep run in one process share their prompt forwards), else None."""
    global _PROMPT_MEMO
    if not cfg.get("share_prompt", False):
        return None
    if _PROMPT_MEMO is None:
        from keyformer.core.prompt_memo import PromptMemo

        _PROMPT_MEMO = PromptMemo()
    return _PROMPT_MEMO


def _prefill_ms(prefill_s: float, reused: bool, forward_s: float | None) -> float:
    """A row's ``prefill_ms``: the prompt phase's own seconds; for a reused prompt forward (share_prompt),
    what that forward took when it ran plus this run's copy and cut."""
    return 1000.0 * (prefill_s + ((forward_s or 0.0) if reused else 0.0))


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
    from keyformer.run.loading import context_length

    limit = int(cfg["max_prompt_tokens"])
    ctx = context_length(model) if hasattr(model, "config") else None
    if ctx:
        limit = min(limit, ctx - int(cfg["generation"]["max_new_tokens"]))
    return limit


# The tasks' own metrics, as the run summary lists them (before ROUGE): RULER's string match, accuracy, QA.
TASK_METRICS = (("string_match_all", "string match (all) %"), ("string_match_part", "string match (part) %"),
                ("accuracy", "accuracy %"), ("token_f1", "token F1"), ("exact_match", "exact match %"),
                ("rougeL_longbench", "rougeL (LongBench)"))


def format_table(m: Mapping[str, Any]) -> str:
    """Human-readable one-run summary."""
    def f(v: Any, nd: int = 2) -> str:
        return f"{v:.{nd}f}" if isinstance(v, float) and math.isfinite(v) else str(v)

    kv = m.get("kv_bytes", float("nan"))
    rows = [
        ("model", m.get("model")), ("dataset", m.get("dataset")), ("policy", m.get("policy")),
        ("budget", m.get("budget")), ("samples", m.get("n_samples")),
        *[(label, f(m[k])) for k, label in TASK_METRICS if k in m],  # the task's own metric first
        *([] if "string_match_all" in m else [(k, f(m.get(k))) for k in ROUGE_KEYS]),  # RULER: not scored so
        *([("truncated samples", m["n_truncated"])] if "n_truncated" in m else []),
        ("prefill ms", f(m.get("prefill_ms"), 1)), ("decode ms/token", f(m.get("decode_ms_per_token"), 1)),
        ("tokens/s", f(m.get("tokens_per_s"), 1)),
        ("KV MiB (held)", f(kv / 2**20 if isinstance(kv, float | int) else kv, 3)),
        ("KV MiB (full)", f(m.get("kv_bytes_full", float("nan")) / 2**20, 3)),
        ("KV ratio", f(m.get("kv_ratio"), 3)),
    ]
    w = max(len(k) for k, _ in rows)
    line = "-" * (w + 24)
    return "\n".join([line, *(f"{k:<{w}}  {v}" for k, v in rows), line])


NEEDLE_FIELDS = ("needle_length", "needle_depth")  # copied from ``needle`` records into their rows
RULER_FIELDS = ("ruler_task", "ruler_length")  # copied from ``ruler`` records into their rows


def _with_prefix(tok: Any, rec: Mapping[str, Any], enc: tuple[list[int], int]) -> tuple[list[int], int]:
    """The prompt ids followed by the record's ``answer_prefix`` (RULER appends it after the prompt, after the
    chat template's assistant header), tokenized on its own."""
    prefix = rec.get("answer_prefix")
    if not prefix:
        return enc
    return list(enc[0]) + list(tok(prefix, add_special_tokens=False)["input_ids"]), enc[1]


def check_prompt_options(model: Mapping[str, Any]) -> None:
    """ConfigError for a hub model without a name, or a ``chat_template`` / ``prompt_style`` outside their
    choices."""
    from keyformer.run.data.prompts import CHAT_CHOICES, PROMPT_STYLES

    if model.get("source") == "hub" and not model.get("name"):
        raise ConfigError("model.name", model.get("name"),
                          "model=hub needs the hub id: model.name=<org/name>, e.g. model.name=Qwen/Qwen3-8B")
    if model.get("chat_template", False) not in CHAT_CHOICES:
        raise ConfigError("model.chat_template", model.get("chat_template"), "allowed: auto, true, false")
    if str(model.get("prompt_style") or "instruct") not in PROMPT_STYLES:
        raise ConfigError("model.prompt_style", model.get("prompt_style"),
                          f"allowed: {', '.join(PROMPT_STYLES)}")


def prompt_setup(cfg: Mapping[str, Any], tok: Any) -> tuple[bool, str]:
    """(chat template on?, the dataset template for this model's prompt style): ``model.chat_template`` and
    ``model.prompt_style`` (``keyformer.run.data.prompts``)."""
    from keyformer.run.data.prompts import styled_template, use_chat_template

    try:
        chat = use_chat_template(cfg["model"], tok)
    except ValueError as e:
        raise ConfigError("model.chat_template", cfg["model"].get("chat_template"), str(e)) from None
    template = styled_template(str(cfg["dataset"].get("template", "alpaca")),
                               str(cfg["model"].get("prompt_style") or "instruct"), chat)
    return chat, template


def check_uncut(rec: Mapping[str, Any], n_tokens: int, cut: int, limit: int, cfg: Mapping[str, Any]) -> None:
    """A RULER record is never cut: a prompt of ``n_tokens`` kept + ``cut`` tokens over ``limit`` is a
    ConfigError naming both numbers (``limit`` is ``max_prompt_tokens``, or lower where the model's positions
    end)."""
    if not cut or "ruler_task" not in rec:
        return
    mpt = cfg["max_prompt_tokens"]
    why = (f"max_prompt_tokens={mpt}" if limit == int(mpt) else
           f"the model's positions minus generation.max_new_tokens={cfg['generation']['max_new_tokens']}")
    msg = (f"RULER prompt {rec['id']} has {n_tokens + cut} tokens, more than the limit {limit} ({why}); "
           f"RULER prompts are never cut: raise max_prompt_tokens or lower dataset.length "
           f"(={rec.get('ruler_length')})")
    raise ConfigError("max_prompt_tokens", mpt, msg, message=msg)


def _unique_ids(records: list[dict]) -> list[dict]:
    seen: dict[str, int] = {}
    for r in records:
        n = seen.get(r["id"], 0)
        seen[r["id"]] = n + 1
        if n:
            r["id"] = f"{r['id']}#{n}"
    return records


class GenerateTask(Task):
    """``task=generate``: summarisation, conversation, retrieval and long-context QA datasets, scored with
    ROUGE plus the dataset's ``metrics`` (:func:`keyformer.run.metrics.score`)."""

    name = "generate"

    def __init__(self, backend: Backend | None = None):
        self.backend = backend

    def validate(self, cfg: Mapping[str, Any]) -> Any:
        from keyformer.run.data import check_options, check_source
        from keyformer.run.validate import validate

        check_prompt_options(cfg["model"])
        check_source(cfg["dataset"])  # a missing local file or an offline hub: DataError
        policy = validate(cfg)
        check_options(cfg["dataset"])  # truncation, metrics, the needle grid: ConfigError
        return policy

    def data_files(self, cfg: Mapping[str, Any]) -> dict[str, Any]:
        from keyformer.run.data.loaders import data_files

        return data_files(cfg["dataset"])

    def run(self, job: Job) -> dict[str, Any]:
        cfg = job.cfg
        from keyformer.run.data.loaders import check_count
        from keyformer.run.validate import ALL

        n = None if cfg["n_samples"] == ALL else int(cfg["n_samples"])
        records = _unique_ids(load_records(cfg["dataset"], n, int(cfg["seed"]), cfg["model"]))
        check_count(cfg["dataset"], records, n)  # fewer records than n_samples: refused before the model
        done = job.done_ids()
        todo = [r for r in records if r["id"] not in done]
        n_kept = sum(r["id"] in done for r in records)
        if n_kept and todo:
            note = f"[keyformer] {job.rd.path}: resuming after {n_kept} of {len(records)} samples"
            print(note, flush=True)
            job.rd.append_log(note)
        if cfg.get("stop_after") is not None:  # a time-boxed call: the point stays partial and resumes
            todo = todo[: int(cfg["stop_after"])]
        if todo:
            run_fn = _generate_agnostic if cfg["dataset"].get("query_agnostic") else _generate_all
            run_fn(cfg, self.backend or core_backend(), job, todo, len(records), len(done))
        rows_by_id = {r["id"]: r for r in job.rows()}
        rows = [rows_by_id[r["id"]] for r in records if r["id"] in rows_by_id]
        m: dict[str, Any] = aggregate(rows) if rows else {"n_samples": 0}
        m.update(policy_fields(job.policy))  # the policy that ran, as the scaffold built it
        m.update(dataset=cfg["dataset"]["name"], generation=dict(cfg["generation"]),
                 max_prompt_tokens=cfg["max_prompt_tokens"], batch_size=cfg["batch_size"],
                 sentence_splitter=sentence_splitter(), complete=len(rows) == len(records))
        return m

    def format_table(self, metrics: Mapping[str, Any]) -> str:
        return format_table(metrics)


def load_model_or_fail(backend: Backend, cfg: Mapping[str, Any]) -> tuple[Any, Any]:
    """``backend.load(cfg)``; a model that cannot be fetched (offline, unknown repo, no network) is a
    one-line JobError instead of a traceback."""
    try:
        return backend.load(cfg)
    except OSError as e:  # transformers/huggingface_hub report unreachable or unknown repos as OSError
        raise JobError(f"model {cfg['model']['name']!r} could not be loaded: {first_line(e)}") from None


def sampling(gen: Mapping[str, Any]) -> dict[str, Any]:
    """``generate`` kwargs for ``generation.do_sample=true`` (temperature, top_p, top_k); empty for greedy and
    beam search."""
    if not gen.get("do_sample"):
        return {}
    return {"do_sample": True, "temperature": float(gen.get("temperature", 1.0)),
            "top_p": float(gen.get("top_p", 1.0)), "top_k": int(gen.get("top_k", 0))}


def run(cfg: Mapping[str, Any], backend: Backend | None = None) -> dict[str, Any]:
    """Run one generation job described by the resolved config ``cfg`` (a plain dict); return its metrics."""
    return run_job(cfg, GenerateTask(backend))


def _generate_all(
    cfg: Mapping[str, Any], backend: Backend, job: Job, todo: list[dict], total: int, n_done: int,
) -> None:
    import torch
    from tqdm import tqdm

    from keyformer.core.generate import left_pad
    from keyformer.core.noise import sample_seed

    torch.manual_seed(int(cfg["seed"]))
    model, tok = load_model_or_fail(backend, cfg)
    policy = job.policy  # built once by the scaffold
    ds, gen = cfg["dataset"], cfg["generation"]
    limit = prompt_limit(cfg, model)
    chat, template = prompt_setup(cfg, tok)
    truncation, metrics = str(ds.get("truncation", "end")), tuple(ds.get("metrics") or ())
    encoded = [encode_prompt(tok, r, template, ds.get("instruction", ""), limit, chat,
                             truncation) for r in todo]
    encoded = [_with_prefix(tok, r, e) for r, e in zip(todo, encoded, strict=True)]
    for r, e in zip(todo, encoded, strict=True):
        check_uncut(r, len(e[0]), e[1], limit, cfg)
    device, bs = _device(model), int(cfg["batch_size"])
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    from keyformer.core.quant import kv_quant_from

    kv_quant = kv_quant_from(cfg.get("kv_quant"))
    if kv_quant is not None:  # refused before anything is written, in one line
        c = model.config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        if int(head_dim) % kv_quant.group_size:
            raise ConfigError("kv_quant.group_size", kv_quant.group_size,
                              f"does not divide this model's head dim {head_dim}; valid: a divisor of "
                              f"{head_dim}")
    gen_kwargs = dict(max_new_tokens=int(gen["max_new_tokens"]), num_beams=int(gen["num_beams"]),
                      seed=int(cfg["seed"]), mode=gen.get("mode", "physical"), eos_token_id=tok.eos_token_id,
                      pad_token_id=pad_id, min_new_tokens=int(gen.get("min_new_tokens", 0)),
                      beam_scores=gen.get("beam_scores", "per_beam"), kv_quant=kv_quant, **sampling(gen))
    memo = prompt_memo(cfg)
    steps = getattr(job, "steps", None)  # per-step records for W&B's history, kept only when it logs them
    if steps is not None:
        gen_kwargs["step_trace"] = True
    job.begin(model)
    with torch.inference_mode():
        if cfg.get("warmup", True):
            ids, mask = left_pad([encoded[0][0][-32:]], pad_id, device)
            backend.generate(model, ids, mask, policy,
                             **{**gen_kwargs, "max_new_tokens": 2, "min_new_tokens": 0})
        bar = tqdm(total=total, initial=n_done, unit="sample", disable=not cfg.get("progress", True))
        for start in range(0, len(todo), bs):
            batch, enc = todo[start:start + bs], encoded[start:start + bs]
            ids, mask = left_pad([e[0] for e in enc], pad_id, device)
            seeds = [sample_seed(int(cfg["seed"]), rec["id"]) for rec in batch]  # per article, not per batch
            if gen_kwargs.get("do_sample"):  # sampled tokens: seeded per batch, by its first record
                torch.manual_seed(seeds[0])
            out = backend.generate(model, ids, mask, policy, **{**gen_kwargs, "seeds": seeds},
                                   **({"prompt_memo": memo} if memo is not None else {}))
            reused = bool(getattr(out, "prompt_reused", False))
            if steps is not None:
                steps.append({"rows": len(batch), "step_s": list(getattr(out, "step_s", None) or []),
                              "kv_bytes": list(getattr(out, "step_kv_bytes", None) or [])})
            seqs = out.sequences.tolist()
            for j, rec in enumerate(batch):
                toks = _generated(seqs[j], tok.eos_token_id, pad_id)
                text = _postprocess(tok.decode(toks, skip_special_tokens=True), gen.get("stop") or [])
                row = {
                    "id": rec["id"], "prompt_tokens": len(enc[j][0]), "truncated_tokens": enc[j][1],
                    "generated_tokens": len(toks), "prediction": text, "reference": rec["reference"],
                    **({"answers": rec["answers"]} if len(rec.get("answers") or ()) > 1 else {}),
                    **score(text, rec, metrics),
                    **{k: rec[k] for k in (*NEEDLE_FIELDS, *RULER_FIELDS) if k in rec},
                    "kv_bytes": int(out.kv_bytes[j]), "kv_bytes_full": int(out.kv_bytes_full[j]),
                    "batch": batch[0]["id"], "batch_size": len(batch),
                    "prefill_ms": _prefill_ms(out.prefill_s, reused, getattr(out, "prompt_forward_s", None)),
                    "decode_ms": 1000.0 * out.decode_s, "n_decode_steps": int(out.n_decode_steps),
                    **({"prompt_reused": reused} if memo is not None else {}),
                }
                job.add(row)
                bar.update(1)
        bar.close()


def split_question(tok: Any, rec: Mapping[str, Any], template: str, instruction: str, limit: int, chat: bool,
                   truncation: str) -> tuple[list[int], list[int], int]:
    """(context ids, question ids, document tokens cut) of one record: the prompt of the question-aware mode
    (:func:`encode_prompt` + answer prefix), split where the text after the document begins."""
    from keyformer.run.data.prompts import prompt_parts

    ids, cut = _with_prefix(tok, rec, encode_prompt(tok, rec, template, instruction, limit, chat, truncation))
    _, after = prompt_parts(rec, template, instruction, tok, chat)
    n_after = len(tok(after, add_special_tokens=False)["input_ids"]) if after else 0
    if rec.get("answer_prefix"):
        n_after += len(tok(rec["answer_prefix"], add_special_tokens=False)["input_ids"])
    if n_after == 0:
        raise ConfigError("dataset.template", template, "query_agnostic needs text after {document} (the "
                                                        "question)")
    return list(ids[: len(ids) - n_after]), list(ids[len(ids) - n_after:]), cut


def record_queries(rec: Mapping[str, Any]) -> list[dict]:
    """The records the query-agnostic mode asks over one context: one per entry of ``rec["queries"]``
    (``question``, ``answer_prefix``, ``answers``), or the record itself."""
    out = []
    for q in rec.get("queries") or [{}]:
        r = {k: v for k, v in rec.items() if k != "queries"}
        r.update(q)
        if "answers" in q:
            r["reference"] = ", ".join(q["answers"])
        out.append(r)
    return out


def _mean_scores(scores: list[dict]) -> dict[str, Any]:
    """Per-question score fields averaged over the questions (bools: all true; strings: the first)."""
    out: dict[str, Any] = {}
    for k, v in scores[0].items():
        vals = [s[k] for s in scores]
        if isinstance(v, bool):
            out[k] = all(vals)
        elif isinstance(v, int | float):
            out[k] = sum(float(x) for x in vals) / len(vals)
        else:
            out[k] = v
    return out


def _generate_agnostic(
    cfg: Mapping[str, Any], backend: Backend, job: Job, todo: list[dict], total: int, n_done: int,
) -> None:
    """``dataset.query_agnostic=true``: per record, prefill and compress the context once (no question), then
    answer each of its questions (:func:`record_queries`) from a copy of the compressed cache
    (``keyformer.core.generate.generate_from_context``). One row per record: its metrics are the mean over its
    questions; ``predictions`` lists the answers when there are several. Batch size 1 (one context at a
    time)."""
    import torch
    from tqdm import tqdm

    from keyformer.core.noise import sample_seed
    from keyformer.core.quant import kv_quant_from

    if backend.generate_from_context is None:
        raise JobError("this backend has no generate_from_context: query_agnostic needs the core's")
    torch.manual_seed(int(cfg["seed"]))
    model, tok = load_model_or_fail(backend, cfg)
    policy = job.policy  # built once by the scaffold
    ds, gen = cfg["dataset"], cfg["generation"]
    if int(gen["num_beams"]) != 1:
        raise ConfigError("generation.num_beams", gen["num_beams"], "query_agnostic decodes greedily: use 1")
    limit = prompt_limit(cfg, model)
    chat, template = prompt_setup(cfg, tok)
    truncation, metrics = str(ds.get("truncation", "end")), tuple(ds.get("metrics") or ())
    instruction = ds.get("instruction", "")
    device = _device(model)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    kv_quant = kv_quant_from(cfg.get("kv_quant"))
    memo = prompt_memo(cfg)
    job.begin(model)
    bar = tqdm(total=total, initial=n_done, unit="sample", disable=not cfg.get("progress", True))
    for rec in todo:
        queries = record_queries(rec)
        parts = [split_question(tok, q, template, instruction, limit, chat, truncation) for q in queries]
        ctx = parts[0][0]
        check_uncut(rec, len(ctx) + len(parts[0][1]), parts[0][2], limit, cfg)
        if any(p[0] != ctx for p in parts):
            raise ConfigError("dataset.template", template,
                              "query_agnostic needs every question after the document (one shared context)")
        prefill_s, outs = backend.generate_from_context(
            model, torch.tensor([ctx], dtype=torch.long, device=device), [p[1] for p in parts], policy,
            max_new_tokens=int(gen["max_new_tokens"]), seed=sample_seed(int(cfg["seed"]), rec["id"]),
            mode=gen.get("mode", "physical"), eos_token_id=tok.eos_token_id, kv_quant=kv_quant,
            **({"prompt_memo": memo} if memo is not None else {}))
        reused = memo is not None and memo.last_hit
        texts, scores = [], []
        for q, o in zip(queries, outs, strict=True):
            toks = _generated(o.tokens, tok.eos_token_id, pad_id)
            texts.append(_postprocess(tok.decode(toks, skip_special_tokens=True), gen.get("stop") or []))
            scores.append(score(texts[-1], q, metrics))
        n = len(outs)
        row = {
            "id": rec["id"], "prompt_tokens": len(ctx), "question_tokens": [len(p[1]) for p in parts],
            "truncated_tokens": parts[0][2], "query_agnostic": True,
            "generated_tokens": sum(len(_generated(o.tokens, tok.eos_token_id, pad_id)) for o in outs),
            "prediction": "\n".join(texts), **({"predictions": texts} if n > 1 else {}),
            "reference": rec["reference"],
            **({"answers": rec["answers"]} if len(rec.get("answers") or ()) > 1 else {}),
            **_mean_scores(scores),
            **{k: rec[k] for k in (*NEEDLE_FIELDS, *RULER_FIELDS) if k in rec},
            "kv_bytes": int(sum(o.kv_bytes for o in outs) / n),
            "kv_bytes_full": int(sum(o.kv_bytes_full for o in outs) / n),
            "batch": rec["id"], "batch_size": 1,
            "prefill_ms": _prefill_ms(prefill_s, reused, memo.last_forward_s if memo is not None else None),
            "question_ms": 1000.0 * sum(o.question_s for o in outs),
            "decode_ms": 1000.0 * sum(o.decode_s for o in outs),
            "n_decode_steps": sum(o.n_decode_steps for o in outs),
            **({"prompt_reused": reused} if memo is not None else {}),
        }
        job.add(row)
        bar.update(1)
    bar.close()
