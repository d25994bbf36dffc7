"""Long generations at a fixed KV memory budget (``keyformer-bench --long``): the field's speed unit.

R-KV and TriAttention fix a memory budget, fit the largest batch each method allows, and report tokens/s on
long generations ("batch gain x throughput gain"). This module does that for our policies:

* **Memory budget** ``M`` (bytes of K/V tensors): ``--memory-mb``, or by default what the full cache's K/V
  tensors take at batch ``--full-batch`` (4) at the longest setting, *measured* (a full prompt forward at that
  batch; the full cache preallocates prompt + generation).
* **Largest batch, measured.** For every (setting, policy, budget), ``peak_kv_bytes(b)`` runs the prompt
  forward at batch ``b`` (and, while the cache still grows, e.g. an absolute budget above the prompt, the
  decode steps until every layer holds its budget) and reads the K/V tensors' bytes; the batch is the largest
  ``b`` whose measured peak fits in ``M``. The search starts from one measured sample's bytes and is then
  confirmed by measuring ``b`` (fits) and ``b + 1`` (does not fit); every probe is recorded.
* **Timed runs.** ``rounds`` interleaved rounds (full, then each policy@budget) of prompt forward + greedy
  decode of ``new_tokens`` tokens at that batch; generated tok/s end to end (prefill included) and of the
  decode alone, medians with IQR, and each run's token agreement with full (same prompts; the rows both
  batches hold). Memory: the measured peak K/V bytes at the run's batch (the quantity the budget caps), and
  the run's peak RSS increase over the RSS before it, the C heap trimmed first (:mod:`.memory`: without
  that, the increase depended on the runs before it in the process).
* **Gains.** ``batch_gain`` = B_policy / B_full; ``seq_gain`` = per-sequence tok/s ratio; ``gain`` = their
  product = total tok/s ratio (decode and end to end).
* **Bytes model** beside every gain: a decode step reads the weights once plus every sample's attended K/V, at
  the read bandwidth measured in the run (a large ``torch.sum``); the predicted equal-memory gain is
  ``(B_p / t_p) / (B_f / t_f)``. **Compute floor**: a decode step at the same batch over an almost empty
  cache (8 tokens), measured; where it exceeds the bytes model's step, compute bounds the step, and
  ``floor_share`` (floor ms / measured ms) says how close the policy's step comes to it.
* **Beams** (``--beams nb``): ``generate(num_beams=nb)`` prefill and decode seconds of full and each policy,
  with the prompt run once per sample (default) and once per beam (transformers' way), same sequences.

Outputs go to ``--out`` (default ``outputs/bench_long``, git-ignored; never ``results/`` unless asked):
``long.json``, ``long.txt`` (the table) and ``command.txt``, rewritten after every setting, and
``journal.jsonl``: every finished measurement (memory budget, batch probes, timed runs, floors, beams) as it
ends. The same command run again resumes from the journal: finished measurements are skipped, more
``--rounds`` or settings add to it, and a run with other measurement options (model, dtype, seed, threads,
memory budget, the code that runs here: :func:`keyformer.run.results.code_tree` over ``BENCH_CODE``, so
commits that change only results, docs, tests or the analysis resume it; each session's commit is
journaled) is refused (:mod:`keyformer.lab.bench.journal`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from keyformer.core.generate import generate, make_cache
from keyformer.core.models import layer_windows
from keyformer.core.policies import make_policy
from keyformer.run.results import code_tree

from .cpu import (
    BENCH_MODELS,
    environment,
    kv_bytes_per_token,
    load_bench_model,
    make_prompts,
    measure_bandwidth,
    median,
    prompt_tokens,
    spread,
    weight_bytes,
)
from .journal import Journal
from .memory import start_peak, status_mb

DEFAULT_OUT = "outputs/bench_long"
DEFAULTS = {"settings": "512+2048,512+4096,2048+2048", "budgets": "256,512,1024,0.5",
            "policies": "window,h2o,keyformer", "full_batch": 4, "rounds": 3, "max_batch": 64, "beams": 4}
# --quick: a tiny random model and short settings, seconds (tests, CI smoke)
QUICK = {"model": "tiny", "prompt": "random", "settings": "32+8", "budgets": "16,0.5", "policies": "h2o",
         "full_batch": 2, "rounds": 1, "max_batch": 8, "beams": 2, "bandwidth_mb": 8}


@dataclass(frozen=True)
class Setting:
    prompt_len: int
    new_tokens: int

    @property
    def label(self) -> str:
        return f"{self.prompt_len}+{self.new_tokens}"


def parse_settings(text: str) -> list[Setting]:
    """``"512+2048,2048+2048"`` -> settings (prompt tokens + generated tokens)."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        a, plus, b = part.partition("+")
        if not plus or not a.isdigit() or not b.isdigit() or int(a) < 1 or int(b) < 2:
            raise ValueError(f"setting {part!r} is not PROMPT+NEW (ints, NEW >= 2), e.g. 512+2048")
        out.append(Setting(int(a), int(b)))
    if not out:
        raise ValueError(f"settings={text!r} is empty; give e.g. 512+2048,2048+2048")
    return out


def parse_budgets(text: str) -> list[float | int]:
    """``"256,0.5"`` -> [256, 0.5]: ints are absolute token budgets, fractions in (0, 1) of the prompt."""
    out: list[float | int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            v = float(part)
        except ValueError:
            v = math.nan
        if part.isdigit() and int(part) >= 1:
            out.append(int(part))
        elif 0 < v < 1:
            out.append(v)
        else:
            raise ValueError(f"budget {part!r} must be an int >= 1 (tokens) or a fraction in (0, 1)")
    return out


def budget_label(b: float | int | None) -> str:
    return "" if b is None else (str(b) if isinstance(b, int) else f"{b:g}")


def _policy(name: str, budget: float | int | None):
    return make_policy("full") if name == "full" else make_policy(name, budget=budget)


# ---------------------------------------------------------------------------------------------------------
# Memory: measured peak K/V bytes and the largest batch that fits


def peak_kv_bytes(model: Any, ids: torch.Tensor, name: str, budget: float | int | None, n_new: int,
                  seed: int = 0) -> int:
    """Measured peak bytes of the K/V tensors of a ``name@budget`` cache over ``ids`` [B, L] generating
    ``n_new`` tokens: after the prompt forward (the full cache preallocates prompt + generation), then through
    the decode steps while some layer still grows towards its budget (absolute budgets above the prompt) or
    its sliding window (a sliding layer grows from the prompt's length to ``W - 1``, even under full)."""
    pol = _policy(name, budget)
    mask = torch.ones_like(ids)
    cache = make_cache(model, pol, mask, max_new_tokens=n_new, seed=seed)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, cache=cache, logits_to_keep=1)
        peak = cache.tensor_bytes()
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        steps = 0
        def growing() -> bool:
            return (pol.schedule.when == "step" and not all(lay.steady for lay in cache.layers)) \
                or any(lay.window is not None and lay.length < lay.window - 1 for lay in cache.layers)

        while growing() and steps < n_new - 1:
            out = model(input_ids=tok, cache=cache, logits_to_keep=1)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            peak = max(peak, cache.tensor_bytes())
            steps += 1
    return int(peak)


def largest_batch(measure: Callable[[int], int], limit: int, max_batch: int) -> tuple[int, list[list[int]]]:
    """The largest batch ``b <= max_batch`` with ``measure(b) <= limit`` (0 if even 1 does not fit), and every
    probe as [b, bytes]. Starts from one measured sample's bytes, then confirms ``b`` and ``b + 1`` by
    measurement (memory per sample need not be exactly linear)."""
    probes: list[list[int]] = []

    def m(b: int) -> int:
        v = int(measure(b))
        probes.append([b, v])
        return v

    one = m(1)
    if one > limit:
        return 0, probes
    b = max(1, min(max_batch, limit // max(1, one)))
    if b > 1:
        while b > 1 and m(b) > limit:
            b -= 1
    while b < max_batch and m(b + 1) <= limit:
        b += 1
    return b, probes


# ---------------------------------------------------------------------------------------------------------
# Timed runs


def timed_run(model: Any, ids: torch.Tensor, name: str, budget: float | int | None, n_new: int,
              seed: int = 0) -> dict[str, Any]:
    """Prompt forward + ``n_new - 1`` greedy decode steps (``n_new`` tokens per sample). Returns seconds,
    the generated tokens [B, n_new] and the peak RSS increase (MiB) of the run."""
    pol = _policy(name, budget)
    mask = torch.ones_like(ids)
    rss0 = start_peak()  # the heap trimmed first (see .memory): the increase is this run's
    with torch.inference_mode():
        cache = make_cache(model, pol, mask, max_new_tokens=n_new, seed=seed)
        t0 = time.perf_counter()
        out = model(input_ids=ids, attention_mask=mask, cache=cache, logits_to_keep=1)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        t1 = time.perf_counter()
        toks = [tok]
        for _ in range(n_new - 1):
            out = model(input_ids=tok, cache=cache, logits_to_keep=1)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)
            toks.append(tok)
        t2 = time.perf_counter()
    kv = cache.tensor_bytes()
    del cache, out
    return {"prefill_s": t1 - t0, "decode_s": t2 - t1, "tokens": torch.cat(toks, dim=1),
            "peak_rss_delta_mb": status_mb("VmHWM") - rss0, "kv_tensor_bytes_end": int(kv)}


def step_floor_ms(model: Any, batch: int, vocab: int, steps: int = 8, seed: int = 0) -> float:
    """Compute floor of a decode step at ``batch``: median ms of full-cache steps over an 8-token prompt (the
    weight GEMMs and per-layer fixed costs, almost no K/V read)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (batch, 8), generator=g)
    r = timed_run(model, ids, "full", None, steps + 1, seed)
    return 1000 * r["decode_s"] / steps


def agreement(tokens: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """Token agreement with full over the rows both hold: ``match`` = share of equal positions, ``prefix`` =
    mean share of the generation before the first difference."""
    n = min(tokens.shape[0], ref.shape[0])
    a, b = tokens[:n], ref[:n]
    eq = a == b
    first = torch.where(eq.all(-1), eq.shape[1], (~eq).float().argmax(-1))
    return {"match": float(eq.float().mean()), "prefix": float(first.float().mean() / eq.shape[1]), "rows": n}


# ---------------------------------------------------------------------------------------------------------
# Bytes model


def attended_avg(name: str, budget: float | int | None, L: int, n_new: int,
                 windows: Sequence[int | None] | None = None) -> float:
    """Mean K/V slots a decode step attends, per sample and layer, over the ``n_new - 1`` steps (the new token
    included). full: L + t; step-evicting policies: min(L + t - 1, k) + 1; prompt-compressing ones: min(L, k)
    + t. ``windows`` (:func:`keyformer.core.models.layer_windows`): a sliding layer of window ``W`` attends
    min(L + t, W) whatever the policy (the budget applies to the global layers: a hybrid model's default; a
    policy that compresses the sliding layers, as on an all-sliding model, is not modelled); the mean is over
    layers."""
    steps = range(1, n_new)
    if name == "full":
        glob = sum(L + t for t in steps) / len(steps)
    else:
        pol = _policy(name, budget)
        k = int(pol.budget_tokens(torch.tensor([L]))[0])
        if pol.schedule.when == "prompt":
            glob = sum(min(L, k) + t for t in steps) / len(steps)
        else:
            glob = sum(min(L + t - 1, k) + 1 for t in steps) / len(steps)
    if not windows:
        return glob
    per_layer = [glob if w is None else sum(min(L + t, w) for t in steps) / len(steps) for w in windows]
    return sum(per_layer) / len(per_layer)


def bytes_step_ms(w_bytes: int, per_token: int, batch: int, slots: float, read_gbs: float) -> float:
    """Bytes model of one decode step: weights once + every sample's attended K/V, at ``read_gbs``."""
    return 1000 * (w_bytes + batch * slots * per_token) / (read_gbs * 1e9)


# ---------------------------------------------------------------------------------------------------------
# Driver


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole long-generation benchmark; returns the report (also written under ``args.out``)."""
    t_start = time.perf_counter()
    if args.threads:
        torch.set_num_threads(int(args.threads))
    torch.manual_seed(args.seed)
    env = environment()
    log(f"[long] {env}")
    settings = parse_settings(args.settings)
    budgets = parse_budgets(args.budgets)
    policies = [p for p in args.policies.split(",") if p]
    for p in policies:
        make_policy(p, budget=0.5)  # unknown names fail here, with the valid ones listed
    cfg = {"model_name": args.model, "dtype": args.dtype, "prompt": args.prompt, "data_dir": args.data_dir}
    model, tok = load_bench_model(cfg)
    vocab = model.config.vocab_size
    dtype = next(model.parameters()).dtype
    longest = (parse_settings(args.memory_ref)[0] if args.memory_ref
               else max(settings, key=lambda s: s.prompt_len + s.new_tokens))
    text_ids = prompt_tokens(cfg, tok, max(s.prompt_len for s in [*settings, longest]) * (args.max_batch + 1))
    journal = Journal(Path(args.out) / "journal.jsonl", journal_header(args, env), log)
    sessions = [journal.get(k) for k in sorted(k for k in journal.entries if k.startswith("session/"))]
    journal.put(f"session/{len(sessions)}", {"git_commit": env["git_commit"], "loadavg": env["loadavg"]})
    env["sessions_commits"] = sorted({x["git_commit"] for x in sessions} | {env["git_commit"]})
    bw = journal.once("bandwidth", lambda: measure_bandwidth(args.bandwidth_mb))
    w_bytes, per_token = weight_bytes(model), kv_bytes_per_token(model, dtype)
    windows = layer_windows(model.config)  # sliding layers keep their window (hybrid models: attended_avg)
    pool: dict[Setting, torch.Tensor] = {}

    def prompts(s: Setting, b: int) -> torch.Tensor:
        """[b, L]: the first b of one fixed set of prompts, so a row is the same prompt at every batch."""
        if s not in pool or pool[s].shape[0] < b:
            pool[s] = make_prompts(text_ids, vocab, s.prompt_len, max(b, args.max_batch + 1), args.seed)
        return pool[s][:b]

    if args.memory_mb:
        limit = int(args.memory_mb * 2**20)
        limit_src = f"--memory-mb {args.memory_mb}"
    else:
        limit = journal.once("limit", lambda: peak_kv_bytes(model, prompts(longest, args.full_batch), "full",
                                                            None, longest.new_tokens, args.seed))
        limit_src = f"full cache at batch {args.full_batch}, {longest.label} (measured)"
    log(f"[long] KV memory budget {limit / 2**20:.2f} MiB = {limit} B ({limit_src}); bandwidth "
        f"{bw['read_gbs']:.1f} GB/s read; "
        f"weights {w_bytes / 2**20:.0f} MiB; K/V {per_token} B/token")
    rows: list[dict[str, Any]] = []
    floors: dict[int, float] = {}
    with torch.inference_mode():
        timed_run(model, prompts(settings[0], 1), policies[0], budgets[0], 3, args.seed)  # warm-up
        for s in settings:
            journal.check(f"prompts/{s.label}", prompt_digest(prompts(s, args.max_batch + 1)),
                          f"the {s.label} prompts")
            confs = [("full", None)] + [(p, b) for b in budgets for p in policies]
            batch: dict[tuple[str, Any], int] = {}
            probes: dict[tuple[str, Any], list[list[int]]] = {}
            for name, b in confs:
                L_t = torch.tensor([s.prompt_len])
                k = None if name == "full" else int(_policy(name, b).budget_tokens(L_t)[0])

                def measure(n: int, s=s, name=name, b=b, k=k) -> int:
                    """Measured once per identical cache (same policy, kept tokens, lengths and batch)."""
                    return journal.once(f"probe/{name}/{k}/{s.label}/{n}", lambda: peak_kv_bytes(
                        model, prompts(s, n), name, b, s.new_tokens, args.seed))

                fit, pr = largest_batch(measure, limit, args.max_batch)
                batch[(name, b)], probes[(name, b)] = fit, pr
                log(f"[long] {s.label} {name}{'@' + budget_label(b) if b is not None else ''}: batch {fit} "
                    f"(probes {pr})")
            runs: dict[tuple[str, Any], list[dict[str, Any]]] = {c: [] for c in confs if batch[c] > 0}
            ref: torch.Tensor | None = None  # full's first-round tokens: the agreement reference
            for rnd in range(args.rounds):
                for c in runs:
                    cfg = f"{c[0]}{'@' + budget_label(c[1]) if c[1] is not None else ''}"
                    key = f"run/{s.label}/{cfg}/B{batch[c]}/r{rnd}"
                    done = key in journal
                    if not done:
                        r = timed_run(model, prompts(s, batch[c]), c[0], c[1], s.new_tokens, args.seed)
                        r["loadavg"] = list(os.getloadavg())
                        if c[0] == "full":
                            r["tokens"] = r["tokens"].tolist() if rnd == 0 else None
                        else:
                            r["agreement"] = agreement(r.pop("tokens"), ref) if ref is not None else None
                        journal.put(key, r)
                    r = journal.get(key)
                    if c[0] == "full" and rnd == 0:
                        ref = torch.tensor(r["tokens"])
                    runs[c].append(r)
                    log(f"  {s.label} round {rnd + 1} {cfg} B{batch[c]}: prefill {r['prefill_s']:.2f} s, "
                        f"decode {r['decode_s']:.2f} s{' (journal)' if done else ''}")
            for bsz in {batch[c] for c in runs}:
                if bsz not in floors:
                    floors[bsz] = journal.once(
                        f"floor/B{bsz}", lambda bsz=bsz: step_floor_ms(model, bsz, vocab, seed=args.seed))
            rows += summarize(s, runs, batch, probes, floors, w_bytes, per_token, bw["read_gbs"], windows)
            report = make_report(args, env, bw, w_bytes, per_token, limit, limit_src, settings, budgets,
                                 policies, rows, None, t_start, journal, complete=False)
            write_outputs(Path(args.out), report, format_table(report))  # a table after every setting
    beam_key = (f"beams/{args.beams}/{settings[0].label}/{args.beam_new_tokens}/{','.join(policies)}"
                f"/r{args.rounds}")  # every option the section depends on
    beams = (journal.once(beam_key, lambda: beam_section(model, text_ids, vocab, policies, args, log))
             if args.beams > 1 else None)
    report = make_report(args, env, bw, w_bytes, per_token, limit, limit_src, settings, budgets, policies,
                         rows, beams, t_start, journal, complete=True)
    text = format_table(report)
    log(text)
    write_outputs(Path(args.out), report, text)
    return report


# The code a long-generation measurement runs: the core, the runner's loading and data, this benchmark and the
# dependencies. keyformer/lab's analysis, report, collect and queue are not imported here.
BENCH_CODE = ("keyformer/__init__.py", "keyformer/core", "keyformer/run", "keyformer/lab/__init__.py",
              "keyformer/lab/bench", "pyproject.toml")


def journal_header(args: argparse.Namespace, env: dict[str, Any]) -> dict[str, Any]:
    """What must not change between the sessions of one resumed run (rounds, settings, budgets, policies and
    beams may grow: they are part of each measurement's key)."""
    keep = ("model", "dtype", "prompt", "seed", "threads", "memory_mb", "memory_ref", "full_batch",
            "max_batch", "bandwidth_mb")
    return {**{k: getattr(args, k) for k in keep}, "code": code_tree(paths=BENCH_CODE), "cpu": env["cpu"],
            "torch": env["torch"], "transformers": env["transformers"]}


def prompt_digest(ids: torch.Tensor) -> str:
    """sha256 of a prompt tensor's ids (a resumed run must time the same prompts)."""
    import hashlib

    return hashlib.sha256(ids.to(torch.int64).numpy().tobytes()).hexdigest()[:16]


def make_report(args: argparse.Namespace, env: dict[str, Any], bw: dict[str, float], w_bytes: int,
                per_token: int, limit: int, limit_src: str, settings: list[Setting], budgets: list,
                policies: list[str], rows: list[dict[str, Any]], beams: dict[str, Any] | None, t_start: float,
                journal: Journal, complete: bool) -> dict[str, Any]:
    return {"method": __doc__, "environment": env, "command": " ".join(sys.argv), "bandwidth": bw,
            "weight_bytes": w_bytes, "kv_bytes_per_token": per_token, "kv_memory_budget_bytes": limit,
            "kv_memory_budget_source": limit_src, "settings": [asdict(s) for s in settings],
            "budgets": budgets, "policies": policies, "rounds": args.rounds, "rows": rows, "beams": beams,
            "complete": complete,
            "journal": {"path": str(journal.path), "resumed_measurements": journal.resumed},
            "seconds_this_session": time.perf_counter() - t_start}


def summarize(s: Setting, runs: dict, batch: dict, probes: dict, floors: dict[int, float], w_bytes: int,
              per_token: int, read_gbs: float,
              windows: Sequence[int | None] | None = None) -> list[dict[str, Any]]:
    """One row per configuration of a setting: tok/s (median, IQR), gains vs full, bytes model (``windows``:
    the model's sliding layers, :func:`attended_avg`), floor."""
    n = s.new_tokens
    full = runs.get(("full", None))
    out = []
    stats: dict[tuple[str, Any], dict[str, Any]] = {}
    for c, rs in runs.items():
        B = batch[c]
        e2e = [B * n / (r["prefill_s"] + r["decode_s"]) for r in rs]
        dec = [B * (n - 1) / r["decode_s"] for r in rs]
        step_ms = [1000 * r["decode_s"] / (n - 1) for r in rs]
        slots = attended_avg(c[0], c[1], s.prompt_len, n, windows)
        model_ms = bytes_step_ms(w_bytes, per_token, B, slots, read_gbs)
        stats[c] = {"e2e": e2e, "dec": dec, "step_ms": median(step_ms), "model_ms": model_ms}
        row = {"setting": s.label, "prompt_len": s.prompt_len, "new_tokens": n, "policy": c[0],
               "budget": c[1], "batch": B, "batch_probes": probes[c], "e2e_tok_s": spread(e2e),
               "batch_capped": B not in [b - 1 for b, _ in probes[c]],  # B + 1 never probed: --max-batch
               "decode_tok_s": spread(dec), "step_ms": median(step_ms),
               "prefill_s": median([r["prefill_s"] for r in rs]),
               "peak_rss_delta_mb": max(r["peak_rss_delta_mb"] for r in rs),
               "peak_kv_bytes": next((v for b, v in probes[c] if b == B), None),
               "kv_tensor_bytes_end": rs[0]["kv_tensor_bytes_end"], "attended_slots_avg": slots,
               "bytes_model_step_ms": model_ms, "floor_step_ms": floors.get(B),
               "compute_bound": bool(floors.get(B, 0.0) > model_ms)}
        ag = [r["agreement"] for r in rs if r.get("agreement")]
        if ag and c[0] != "full":
            row["agreement"] = {k: median([a[k] for a in ag]) for k in ("match", "prefix", "rows")}
        out.append(row)
    if full:
        f = stats[("full", None)]
        fb = batch[("full", None)]
        for row in out:
            st = stats[(row["policy"], row["budget"])]
            row["batch_gain"] = row["batch"] / fb
            row["decode_gain"] = median(st["dec"]) / median(f["dec"])
            row["e2e_gain"] = median(st["e2e"]) / median(f["e2e"])
            row["seq_gain"] = row["decode_gain"] / row["batch_gain"]
            # bytes model: equal-memory tok/s ratio, decode (B / step time)
            row["bytes_model_gain"] = (row["batch"] / st["model_ms"]) / (fb / f["model_ms"])
            row["share_of_bytes_model"] = row["decode_gain"] / row["bytes_model_gain"]
            bound = max(st["model_ms"], row["floor_step_ms"] or 0.0)
            row["bound_gain"] = (row["batch"] / bound) / (fb / max(f["model_ms"], floors.get(fb) or 0.0))
            row["share_of_bound"] = row["decode_gain"] / row["bound_gain"]
            row["floor_share"] = (row["floor_step_ms"] / row["step_ms"]) if row["floor_step_ms"] else None
            # end to end: each side's measured prefill plus its decode steps at the bytes model's time
            e2e_t = lambda r, ms: r["prefill_s"] + (n - 1) * ms / 1000  # noqa: E731
            full_row = next(x for x in out if x["policy"] == "full")
            row["e2e_model_gain"] = ((row["batch"] / e2e_t(row, st["model_ms"]))
                                     / (fb / e2e_t(full_row, f["model_ms"])))
    return out


def beam_section(model: Any, text_ids: list[int] | None, vocab: int, policies: Sequence[str],
                 args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    """``generate(num_beams=nb)`` at batch 1 over the first setting's prompt: prefill and decode seconds of
    full and each policy at budget 0.5, prompt once per sample vs once per beam (medians of ``rounds``)."""
    s = parse_settings(args.settings)[0]
    nb, n_new = args.beams, min(s.new_tokens, args.beam_new_tokens)
    ids = make_prompts(text_ids, vocab, s.prompt_len, 1, args.seed)
    rows = []
    for name in ["full", *policies]:
        pol = _policy(name, None if name == "full" else 0.5)
        res: dict[str, Any] = {"policy": name, "budget": None if name == "full" else 0.5}
        seqs = {}
        for once in (True, False):
            pre, dec = [], []
            for _ in range(args.rounds):
                o = generate(model, ids, None, pol, max_new_tokens=n_new, num_beams=nb, prompt_once=once,
                             seed=args.seed)
                pre.append(o.prefill_s)
                dec.append(o.decode_s)
                seqs[once] = o.sequences
            key = "prompt_once" if once else "per_beam_prompt"
            res[key] = {"prefill_s": spread(pre), "decode_s": spread(dec)}
        res["same_sequences"] = bool(torch.equal(seqs[True], seqs[False]))
        res["prefill_speedup"] = (res["per_beam_prompt"]["prefill_s"]["median"]
                                  / res["prompt_once"]["prefill_s"]["median"])
        log(f"[long] beams {nb} {name}: prefill {res['prompt_once']['prefill_s']['median']:.2f} s once vs "
            f"{res['per_beam_prompt']['prefill_s']['median']:.2f} s per beam; same sequences "
            f"{res['same_sequences']}")
        rows.append(res)
    full = rows[0]
    for r in rows:
        for key in ("prompt_once", "per_beam_prompt"):
            r[key]["prefill_vs_full"] = r[key]["prefill_s"]["median"] / full[key]["prefill_s"]["median"]
            r[key]["decode_vs_full"] = r[key]["decode_s"]["median"] / full[key]["decode_s"]["median"]
    return {"num_beams": nb, "prompt_len": s.prompt_len, "new_tokens": n_new, "rows": rows}


def _f(v: Any, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def format_table(report: dict[str, Any]) -> str:
    """The long-generation table: one line per (setting, policy@budget), gains beside the bytes model's."""
    jr = report.get("journal") or {}
    lines = [("" if report.get("complete", True) else "PARTIAL: settings still running; ")
             + (f"resumed from {jr['path']} ({jr['resumed_measurements']} measurements from earlier sessions)"
                if jr.get("resumed_measurements") else "one session"),
             f"KV memory budget {report['kv_memory_budget_bytes'] / 2**20:.2f} MiB "
             f"({report['kv_memory_budget_source']}); read bandwidth {report['bandwidth']['read_gbs']:.1f} "
             f"GB/s",
             "tok/s: median [q1, q3] of rounds; gain = batch x seq (decode tok/s vs full at its own largest "
             "batch); model = the bytes model's gain, share = gain / model; bound = max(bytes model, "
             "measured compute floor); floor% = floor ms / measured ms; e2e = end-to-end gain, e2e-m = "
             "its model (measured prefill + bytes-model decode); agree = token agreement with full; "
             "kvMB = measured peak K/V tensors at that batch (what the budget caps); rssMB = peak RSS "
             "increase of the run over the heap-trimmed RSS before it; * = batch capped by --max-batch "
             "(more might fit)",
             f"{'setting':<10} {'config':<16} {'B':>3} {'e2e tok/s':>22} {'dec tok/s':>8} {'batch':>6} "
             f"{'seq':>6} "
             f"{'gain':>6} {'model':>6} {'share':>6} {'bound':>6} {'share':>6} {'floor%':>6} {'e2e':>6} "
             f"{'e2e-m':>6} {'agree':>6} {'kvMB':>6} {'rssMB':>7}"]
    for r in report["rows"]:
        e = r["e2e_tok_s"]
        cfg = r["policy"] + ("@" + budget_label(r["budget"]) if r["budget"] is not None else "")
        cfg += "*" if r.get("batch_capped") else ""
        ag = r.get("agreement", {}).get("match")
        fs = r.get("floor_share")
        kv = r.get("peak_kv_bytes")
        lines.append(
            f"{r['setting']:<10} {cfg:<16} {r['batch']:>3} {e['median']:>8.1f} [{e['q1']:.1f}, "
            f"{e['q3']:.1f}]".ljust(44)
            + f" {r['decode_tok_s']['median']:>8.1f} {_f(r.get('batch_gain')):>6} {_f(r.get('seq_gain')):>6} "
            f"{_f(r.get('decode_gain')):>6} {_f(r.get('bytes_model_gain')):>6} "
            f"{_f(r.get('share_of_bytes_model')):>6} "
            f"{_f(r.get('bound_gain')):>6} {_f(r.get('share_of_bound')):>6} "
            f"{'-' if fs is None else format(100 * fs, '.0f'):>6} {_f(r.get('e2e_gain')):>6} "
            f"{_f(r.get('e2e_model_gain')):>6} "
            f"{'-' if ag is None else format(ag, '.2f'):>6} "
            f"{'-' if kv is None else format(kv / 2**20, '.0f'):>6} "
            f"{r['peak_rss_delta_mb']:>7.0f}")
    if report.get("beams"):
        bm = report["beams"]
        lines.append(f"\nbeam search, {bm['num_beams']} beams, batch 1, "
                     f"{bm['prompt_len']}+{bm['new_tokens']}: "
                     "prefill / decode seconds (median), prompt once per sample vs once per beam")
        for r in bm["rows"]:
            o, p = r["prompt_once"], r["per_beam_prompt"]
            lines.append(f"  {r['policy']:<10} once {o['prefill_s']['median']:.3f} / "
                         f"{o['decode_s']['median']:.3f}"
                         f" (x{o['prefill_vs_full']:.2f} / x{o['decode_vs_full']:.2f} of full)   per beam "
                         f"{p['prefill_s']['median']:.3f} / {p['decode_s']['median']:.3f}   prefill saved "
                         f"x{r['prefill_speedup']:.2f}   same sequences {r['same_sequences']}")
    return "\n".join(lines)


def write_outputs(out: Path, report: dict[str, Any], text: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "long.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "long.txt").write_text(text + "\n")
    (out / "command.txt").write_text(report["command"] + "\n")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="keyformer-bench --long", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny random model, short settings (seconds)")
    p.add_argument("--out", default=None, help=f"output folder (default {DEFAULT_OUT}; results/ only when "
                                               f"given)")
    p.add_argument("--model", default="smollm2", choices=BENCH_MODELS)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--prompt", default="cnn_dailymail", choices=("cnn_dailymail", "random"))
    p.add_argument("--data-dir", default=None, help="folder of cnn_dailymail.jsonl (default "
                                                    "$KEYFORMER_DATA_DIR)")
    p.add_argument("--settings", default=None, help=f"PROMPT+NEW list (default {DEFAULTS['settings']})")
    p.add_argument("--budgets", default=None, help=f"token counts or fractions (default "
                                                   f"{DEFAULTS['budgets']})")
    p.add_argument("--policies", default=None, help=f"besides full (default {DEFAULTS['policies']})")
    p.add_argument("--memory-mb", type=float, default=None, help="KV budget in MiB (default: full at "
                                                                 "--full-batch)")
    p.add_argument("--full-batch", type=int, default=None, help="full's batch at the longest setting "
                                                                "(default 4)")
    p.add_argument("--memory-ref", default=None,
                   help="PROMPT+NEW whose full cache at --full-batch sets the budget (default: the longest "
                        "setting)")
    p.add_argument("--max-batch", type=int, default=None, help="largest batch tried (default 64)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 3)")
    p.add_argument("--beams", type=int, default=None, help="beam section's num_beams; 0 skips it (default 4)")
    p.add_argument("--beam-new-tokens", type=int, default=64, help="tokens generated in the beam section")
    p.add_argument("--bandwidth-mb", type=int, default=1024)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """CLI arguments with the defaults (``--quick`` swaps in :data:`QUICK` for the options not given)."""
    argv = list(argv)
    args = parser().parse_args(argv)
    for key, val in {**DEFAULTS, **(QUICK if args.quick else {})}.items():
        flag = f"--{key.replace('_', '-')}"
        if not any(a == flag or a.startswith(flag + "=") for a in argv):  # options given on the line win
            setattr(args, key, val)
    args.out = args.out or DEFAULT_OUT
    args.data_dir = args.data_dir or os.environ.get("KEYFORMER_DATA_DIR")
    for key in ("full_batch", "max_batch", "rounds"):
        if getattr(args, key) < 1:
            raise SystemExit(f"--{key.replace('_', '-')}={getattr(args, key)} must be >= 1")
    return args


def bench_main() -> None:
    """The ``keyformer-bench`` entry point: ``--long`` runs this module's benchmark (argparse options),
    ``--floors`` the probe of what stops the CPU targets (:mod:`keyformer.lab.bench.floors`), anything else
    the CPU benchmark of :mod:`keyformer.lab.bench.cpu` (Hydra overrides); ``--against REV`` the A/B of
    :mod:`keyformer.lab.bench.ab` (this checkout against commit REV, interleaved fresh processes)."""
    if any(a == "--against" or a.startswith("--against=") for a in sys.argv[1:]):
        from .ab import main as ab_main

        ab_main(sys.argv[1:])
        return
    if "--long" in sys.argv[1:]:
        main([a for a in sys.argv[1:] if a != "--long"])
        return
    if "--floors" in sys.argv[1:]:
        from .floors import main as floors_main

        floors_main([a for a in sys.argv[1:] if a != "--floors"])
        return
    from .cpu import main as cpu_main

    cpu_main()


def main(argv: Sequence[str] | None = None) -> None:
    """``keyformer-bench --long [options]``."""
    run(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
