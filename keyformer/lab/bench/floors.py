"""What stops the CPU benchmark's unmet targets (``keyformer-bench --floors``): each floor measured.

``keyformer-bench`` (:mod:`keyformer.lab.bench.cpu`) judges five speed targets; on this CPU targets 1-5 are
not met. This probe measures, on the same model and prompts, the parts each target's ratio is made of, by
switching one thing off at a time (interleaved rounds, medians with IQR):

* **Prefill** (targets 2, 4, 5) at ``--prefill-len`` tokens, batch 1: ``full`` (flash SDPA), ``h2o`` (the
  attention probabilities materialised and column-summed: what every score-reading policy pays),
  ``keyformer-nonoise`` (Keyformer's rule with ``noise=False``: adds the temperature softmax of the scores)
  and ``keyformer`` (adds the hash noise, ``n^2/2`` values per layer and query head, fused with the score
  in one native loop on CPU), beside ``keyformer-field`` (the same with the noise field materialised first,
  as before that fusion and wherever the native loop is not used). Each difference is one component's cost;
  the target's limit is compared with the components that no rule-preserving change could remove.
* **Decode** (targets 1, 3, 4) at each ``--decode`` point ``LxB``: ms per step of ``full``, ``window``,
  ``h2o``, ``keyformer-nonoise``, ``keyformer`` (budget ``--budget``) and the **compute floor**: full over an
  8-token cache at the same batch (the weight GEMMs and per-layer fixed costs; almost no K/V). ``kv`` =
  full - floor is the K/V-dependent part of full's step; ``ideal`` = floor + budget x kv is a step whose
  K/V-dependent part shrank with the cache and nothing else changed; ``bound`` = full / ideal is the speedup
  that step would give, beside the bytes model's prediction (weights + K/V bytes at the measured read
  bandwidth, as in ``keyformer-bench``). ``bound / bytes`` is the largest share of the bytes model any
  policy can reach while the floor stands (target 3 asks for 90 %). Scoring overhead (target 1) is each
  policy's step minus window's, split the same way as the prefill. An aten profile of each configuration's
  steps (``--profile-steps``) is the evidence of where the time goes.
* **End to end at equal memory** (target 5) is decomposed from the committed benchmark's own run
  (``--bench``, default ``results/bench/bench.json``): prefill and decode seconds of full and Keyformer, and
  the gain if Keyformer's prompt cost full's per-sample time (the flash floor), or H2O-like scoring only.

Outputs (``--out``, default ``outputs/bench_floors``): ``floors.json``, ``floors.txt``, ``command.txt``.
Run on a quiet machine: ``keyformer-bench --floors --out results/bench/floors`` (~15 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from keyformer.core import noise
from keyformer.core.generate import make_cache
from keyformer.core.policies import make_policy

from .cpu import (
    Snapshot,
    decode,
    environment,
    kv_bytes_per_token,
    load_bench_model,
    make_prompts,
    measure_bandwidth,
    profile_ops,
    prompt_tokens,
    spread,
    weight_bytes,
)

DEFAULT_OUT = "outputs/bench_floors"
PREFILL = ("full", "h2o", "keyformer-nonoise", "keyformer-field", "keyformer")
DECODE = ("full", "window", "h2o", "keyformer-nonoise", "keyformer", "floor")
QUICK = ["--model", "tiny", "--prompt", "random", "--prefill-len", "48", "--decode", "48x1", "--steps", "3",
         "--rounds", "1", "--decode-rounds", "1", "--profile-steps", "1", "--bandwidth-mb", "8",
         "--bench", ""]


def policy_of(label: str, budget: float):
    """The policy of a probe label (``floor`` and ``full``: the full cache)."""
    if label in ("full", "floor"):
        return make_policy("full")
    if label == "keyformer-nonoise":
        return make_policy("keyformer", budget=budget, noise=False)
    return make_policy(label.removesuffix("-field"), budget=budget)


def prefill(model: Any, ids: torch.Tensor, label: str, budget: float, n_new: int) -> tuple[Snapshot, float]:
    """Prompt forward of ``ids`` into a fresh cache of ``label``'s policy; (snapshot, seconds)."""
    mask = torch.ones_like(ids)
    cache = make_cache(model, policy_of(label, budget), mask, max_new_tokens=n_new, seed=0)
    with noise.fused_score(label != "keyformer-field"):  # keyformer-field: the noise field materialised
        t0 = time.perf_counter()
        out = model(input_ids=ids, attention_mask=mask, cache=cache, logits_to_keep=1)
        sec = time.perf_counter() - t0
    return Snapshot(cache, out.logits[:, -1].argmax(-1, keepdim=True)), sec


def prefill_ops(model: Any, ids: torch.Tensor, label: str, budget: float, top: int) -> dict[str, Any]:
    """Where one prompt forward's time goes: its top aten ops by self CPU time (torch.profiler), with their
    calls, and each op's excess over full's forward (the prefill cost a policy adds, by operation)."""
    from torch.profiler import ProfilerActivity, profile

    mask = torch.ones_like(ids)
    cache = make_cache(model, policy_of(label, budget), mask, max_new_tokens=2, seed=0)
    with noise.fused_score(label != "keyformer-field"), profile(activities=[ProfilerActivity.CPU]) as prof:
        model(input_ids=ids, attention_mask=mask, cache=cache, logits_to_keep=1)
    ev = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    total = sum(e.self_cpu_time_total for e in ev)
    ev.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return {"aten_self_ms": total / 1000,
            "ops": {e.key: {"ms": e.self_cpu_time_total / 1000, "calls": e.count} for e in ev},
            "top": [e.key for e in ev[:top]]}


def decode_ms(model: Any, snap: Snapshot, steps: int) -> float:
    """Mean ms per greedy step over ``steps`` steps from a copy of ``snap`` (keyformer-bench's loop)."""
    return 1000 * decode(model, snap, steps) / steps


def interleaved(labels: Sequence[str], rounds: int, one: Callable[[str], float]) -> dict[str, dict[str, Any]]:
    """``rounds`` rounds of ``one(label)`` for every label in order; per label its samples, their spread and
    the spread of its per-round ratio to the round's ``full``."""
    samples: dict[str, list[float]] = {k: [] for k in labels}
    ratios: dict[str, list[float]] = {k: [] for k in labels}
    for _ in range(rounds):
        now = {k: one(k) for k in labels}
        for k in labels:
            samples[k].append(now[k])
            ratios[k].append(now[k] / now["full"])
    return {k: {"samples": samples[k], "stats": spread(samples[k]), "x_full": spread(ratios[k])}
            for k in labels}


def _med(d: dict[str, dict[str, Any]], k: str) -> float:
    return float(d[k]["stats"]["median"])


def prefill_floors(pf: dict[str, dict[str, Any]], limits: dict[str, float]) -> dict[str, Any]:
    """Target 2's components, each as a share of full's prefill, and which limit they exceed."""
    full = _med(pf, "full")
    comp = {"scores": _med(pf, "h2o") - full, "gumbel": _med(pf, "keyformer-nonoise") - _med(pf, "h2o"),
            "noise": _med(pf, "keyformer") - _med(pf, "keyformer-nonoise")}
    x = {k: float(pf[k]["x_full"]["median"]) for k in pf}
    # what the fused score saves: the field written and read (runs before that fusion lack the label)
    field = (_med(pf, "keyformer-field") - _med(pf, "keyformer")) / full if "keyformer-field" in pf else None
    return {"full_s": full, "components_s": comp, "components_x_full": {k: v / full for k, v in comp.items()},
            "x_full": x, "noise_field_x_full": field,
            "h2o": {"limit": limits["h2o"], "x_full": x["h2o"], "met": x["h2o"] <= limits["h2o"]},
            "keyformer": {"limit": limits["keyformer"], "x_full": x["keyformer"],
                          "x_full_without_noise": x["keyformer-nonoise"],
                          "met": x["keyformer"] <= limits["keyformer"],
                          "met_without_noise": x["keyformer-nonoise"] <= limits["keyformer"]}}


def decode_floors(dc: dict[str, dict[str, Any]], budget: float, w_bytes: int, per_token: int, L: int, B: int,
                  n_new: int, read_gbs: float, overhead_limit: float, share_target: float) -> dict[str, Any]:
    """Targets 1 and 3 at one decode point: the compute floor, the ideal evicted step, the bound it puts on
    the speedup, and each scoring policy's overhead over window split into its parts."""
    full, floor, window = _med(dc, "full"), _med(dc, "floor"), _med(dc, "window")
    kv = full - floor
    ideal = floor + budget * kv
    kept = int(L * budget)
    # the bytes model as keyformer-bench prices it: weights + K/V attended per step (full grows over n_new)
    full_bytes = w_bytes + B * per_token * (L + 1 + (n_new - 1) / 2)
    pol_bytes = w_bytes + B * per_token * (kept + 1)
    bytes_pred = full_bytes / pol_bytes
    bound = full / ideal
    out: dict[str, Any] = {
        "point": f"L{L}xB{B}", "budget": budget, "full_ms": full, "floor_ms": floor, "window_ms": window,
        "kv_ms": kv, "floor_share_of_full": floor / full, "ideal_ms": ideal, "bound_speedup": bound,
        "bytes_speedup": bytes_pred, "max_share_of_bytes": bound / bytes_pred,
        "target3_reachable": bound / bytes_pred >= share_target,
        "bytes_model_ms": {"full": 1000 * full_bytes / (read_gbs * 1e9),
                           "policy": 1000 * pol_bytes / (read_gbs * 1e9)},
        "window_vs_ideal": window / ideal, "speedup": {}, "share_of_bytes": {}, "overhead": {}}
    for k in ("window", "h2o", "keyformer-nonoise", "keyformer"):
        out["speedup"][k] = 1.0 / float(dc[k]["x_full"]["median"])
        out["share_of_bytes"][k] = out["speedup"][k] / bytes_pred
    h2o, kf0, kf = _med(dc, "h2o"), _med(dc, "keyformer-nonoise"), _med(dc, "keyformer")
    out["overhead"] = {
        "h2o": {"x_window": h2o / window, "scores_ms": h2o - window},
        "keyformer": {"x_window": kf / window, "scores_ms": h2o - window, "gumbel_ms": kf0 - h2o,
                      "noise_ms": kf - kf0, "x_window_without_noise": kf0 / window},
        "limit": overhead_limit}
    return out


def e2e_floors(bench: dict[str, Any]) -> dict[str, Any] | None:
    """Target 5 decomposed from the committed ``keyformer-bench`` run: each side's prefill and decode seconds
    and the gain had the policy's prompt cost full's per-sample prefill time."""
    tp = bench.get("throughput")
    if not tp:
        return None
    n = int(tp["new_tokens"])
    f, p = tp["full"], tp["policy"]

    def parts(side: dict[str, Any]) -> dict[str, float]:
        b = int(side["batch"])
        decode = b * n / float(side["decode_tok_s"])
        return {"batch": b, "prefill_s": float(side["prefill_s"]), "decode_s": decode,
                "prefill_share": float(side["prefill_s"]) / (float(side["prefill_s"]) + decode)}

    fp, pp = parts(f), parts(p)
    full_tok_s = fp["batch"] * n / (fp["prefill_s"] + fp["decode_s"])
    flash_prefill = fp["prefill_s"] / fp["batch"] * pp["batch"]
    gain_flash = pp["batch"] * n / (flash_prefill + pp["decode_s"]) / full_tok_s
    return {"setting": f"{tp['prompt_len']}+{n}", "policy": p["label"], "full": fp, "policy_parts": pp,
            "e2e_gain": float(tp["e2e_gain"]), "decode_gain": float(tp["gain"]),
            "policy_prefill_x_full_per_sample": pp["prefill_s"] / flash_prefill,
            "e2e_gain_if_prefill_at_full_rate": gain_flash, "commit": bench["environment"].get("git_commit")}


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    t_start = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    env = environment()
    cfg = {"model_name": args.model, "dtype": "float32", "prompt": args.prompt, "data_dir": args.data_dir}
    model, tok = load_bench_model(cfg)
    vocab = model.config.vocab_size
    points = [tuple(int(v) for v in p.split("x")) for p in args.decode.split(",") if p]  # '': prefill only
    text_ids = prompt_tokens(cfg, tok, max([args.prefill_len] + [L * B for L, B in points]))
    bw = measure_bandwidth(args.bandwidth_mb)
    w_bytes, per_token = weight_bytes(model), kv_bytes_per_token(model, torch.float32)
    log(f"[floors] {env}\n[floors] bandwidth {bw}")
    report: dict[str, Any] = {"environment": env, "args": vars(args), "bandwidth": bw,
                              "weight_bytes": w_bytes, "kv_bytes_per_token": per_token}
    with torch.inference_mode():
        # compile the noise kernels (two shapes, so the compiled ones are shape-generic), touch the weights
        for warm in (make_prompts(text_ids, vocab, 64, 1, 0), make_prompts(text_ids, vocab, 96, 2, 0)):
            for label in DECODE:
                snap, _ = prefill(model, warm, label, args.budget, 4)
                decode_ms(model, snap, 2)

        ids = make_prompts(text_ids, vocab, args.prefill_len, 1, 0)
        pf_snaps: dict[str, Snapshot] = {}

        def one_prefill(label: str) -> float:
            snap, sec = prefill(model, ids, label, args.budget, args.steps)
            pf_snaps[label] = snap
            log(f"  prefill L{args.prefill_len} {label:<18} {sec:7.2f} s")
            return sec

        pf = interleaved(PREFILL, args.rounds, one_prefill)
        limits = {"h2o": args.h2o_limit, "keyformer": args.kf_limit}
        report["prefill"] = {"prompt_len": args.prefill_len, "runs": pf, "floors": prefill_floors(pf, limits)}
        if args.profile_prefill:
            report["prefill"]["profile"] = {k: prefill_ops(model, ids, k, args.budget, 12) for k in PREFILL}
        report["decode"], report["profile"] = [], {}
        for L, B in points:
            prompts = make_prompts(text_ids, vocab, L, B, 0)
            if L == args.prefill_len and B == 1 and pf_snaps:  # the prefill rounds' caches: same prompt
                snaps, pf_snaps = pf_snaps, {}
                snaps["window"] = prefill(model, prompts, "window", args.budget, args.steps)[0]
            else:
                snaps = {k: prefill(model, prompts, k, args.budget, args.steps)[0]
                         for k in DECODE if k != "floor"}
            snaps["floor"] = prefill(model, make_prompts(None, vocab, 8, B, 1), "floor", args.budget,
                                     args.steps)[0]

            dc = interleaved(DECODE, args.decode_rounds,
                             lambda k, s=snaps: decode_ms(model, s[k], args.steps))
            log(f"  decode L{L}xB{B}: " + ", ".join(f"{k} {_med(dc, k):.1f}" for k in DECODE) + " ms/step")
            fl = decode_floors(dc, args.budget, w_bytes, per_token, L, B, args.steps, bw["read_gbs"],
                               args.overhead_limit, args.share_target)
            report["decode"].append({"prompt_len": L, "batch": B, "runs": dc, "floors": fl})
            if args.profile_steps:
                report["profile"][f"L{L}xB{B}"] = {k: profile_ops(model, snaps[k], args.profile_steps, 10)
                                                   for k in DECODE}
            del snaps
    bench_path = Path(args.bench) if args.bench else None
    if bench_path is not None and bench_path.is_file():
        report["e2e"] = e2e_floors(json.loads(bench_path.read_text()))
        report["e2e_source"] = str(bench_path)
    env["loadavg_end"] = list(os.getloadavg())
    report["elapsed_s"] = time.perf_counter() - t_start
    text = format_report(report)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "floors.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "floors.txt").write_text(text + "\n")
    argv = sys.argv[1:] if "--floors" in sys.argv[1:] else ["--floors", *sys.argv[1:]]
    (out / "command.txt").write_text(" ".join(["keyformer-bench", *argv]) + "\n")
    log("\n" + text)
    return report


def _iqr(s: dict[str, float], fmt: str = ".1f") -> str:
    return f"{s['median']:{fmt}} [{s['q1']:{fmt}}, {s['q3']:{fmt}}]"


def rounds_label(args: dict[str, Any]) -> str:
    """"3 interleaved rounds", or "3 prefill and 7 decode interleaved rounds" where they differ (runs before
    ``--decode-rounds`` existed used ``--rounds`` for both)."""
    p, d = args["rounds"], args.get("decode_rounds", args["rounds"])
    return f"{p} interleaved rounds" if p == d else f"{p} prefill and {d} decode interleaved rounds"


def format_report(r: dict[str, Any]) -> str:
    env, a = r["environment"], r["args"]
    lines = [f"Floors under keyformer-bench's targets ({env['cpu']}, {env['threads']} threads, torch "
             f"{env['torch']}, fp32, model {a['model']}, git {env['git_commit']}; load avg start "
             f"{[round(x, 2) for x in env['loadavg']]} end {[round(x, 2) for x in env['loadavg_end']]}; "
             f"{rounds_label(a)}, medians [IQR])",
             f"bandwidth read {r['bandwidth']['read_gbs']:.1f} GB/s; weights "
             f"{r['weight_bytes'] / 2**20:.0f} MiB",
             ""]
    p = r["prefill"]
    f = p["floors"]
    lines.append(f"Prefill, {p['prompt_len']} tokens, batch 1 (target 2: h2o <= {f['h2o']['limit']}x, "
                 f"keyformer <= {f['keyformer']['limit']}x full):")
    for k, v in p["runs"].items():
        lines.append(f"    {k:<18} {_iqr(v['stats'], '.2f')} s   x full {_iqr(v['x_full'], '.2f')}")
    c = f["components_x_full"]
    lines.append(f"    components (x full's prefill): scores (materialised P + column sums) "
                 f"{c['scores']:+.2f}, Gumbel temperature softmax {c['gumbel']:+.2f}, "
                 f"hash noise {c['noise']:+.2f}")
    if f.get("noise_field_x_full") is not None:
        lines.append(f"    the noise field (keyformer-field - keyformer), which the fused score never "
                     f"writes: {f['noise_field_x_full']:+.2f}")
    lines.append(f"    h2o {f['h2o']['x_full']:.2f}x: {'met' if f['h2o']['met'] else 'NOT MET'}; keyformer "
                 f"{f['keyformer']['x_full']:.2f}x: {'met' if f['keyformer']['met'] else 'NOT MET'} "
                 f"(without the noise {f['keyformer']['x_full_without_noise']:.2f}x: "
                 f"{'met' if f['keyformer']['met_without_noise'] else 'not met'})")
    prof = r["prefill"].get("profile")
    if prof:
        lines += ["", f"Prefill profile, {r['prefill']['prompt_len']} tokens, batch 1 (aten self ms of one "
                      f"prompt forward; per op: ms, calls, and its excess over full's):"]
        base = prof.get("full", {}).get("ops", {})
        for k, v in prof.items():
            def excess(op: str, v=v) -> float:
                return v["ops"][op]["ms"] - base.get(op, {}).get("ms", 0.0)

            tops = ", ".join(f"{op.removeprefix('aten::')} {v['ops'][op]['ms']:.0f} ({v['ops'][op]['calls']}"
                             f"{'' if k == 'full' else f', {excess(op):+.0f}'})" for op in v["top"][:8])
            lines.append(f"    {k:<18} {v['aten_self_ms']:.0f}: {tops}")
    for d in r["decode"]:
        fl = d["floors"]
        lines += ["", f"Decode {fl['point']}, budget {fl['budget']:g} (ms per step; targets 1 and 3):"]
        for k, v in d["runs"].items():
            lines.append(f"    {k:<18} {_iqr(v['stats'])} ms   x full {_iqr(v['x_full'], '.3f')}")
        lines.append(f"    compute floor {fl['floor_ms']:.1f} ms = "
                     f"{100 * fl['floor_share_of_full']:.0f} % of full's step; K/V-dependent part "
                     f"{fl['kv_ms']:.1f} ms; bytes model: full "
                     f"{fl['bytes_model_ms']['full']:.1f} ms, policy {fl['bytes_model_ms']['policy']:.1f} ms")
        reach = "target 3 reachable" if fl["target3_reachable"] else "target 3 out of reach"
        lines.append(f"    ideal evicted step {fl['ideal_ms']:.1f} ms -> bound {fl['bound_speedup']:.3f}x vs "
                     f"bytes model {fl['bytes_speedup']:.3f}x: at most "
                     f"{100 * fl['max_share_of_bytes']:.0f} % "
                     f"of the bytes model ({reach} while the floor stands); window reaches "
                     f"{100 / fl['window_vs_ideal']:.0f} % of ideal")
        lines.append("    speedup vs full (share of bytes model): " + ", ".join(
            f"{k} {fl['speedup'][k]:.3f} ({100 * fl['share_of_bytes'][k]:.0f} %)" for k in fl["speedup"]))
        o = fl["overhead"]
        lines.append(f"    over window (target 1 <= {o['limit']}x): h2o {o['h2o']['x_window']:.3f}x "
                     f"(scores {o['h2o']['scores_ms']:+.1f} ms); keyformer {o['keyformer']['x_window']:.3f}x "
                     f"(scores {o['keyformer']['scores_ms']:+.1f}, "
                     f"Gumbel {o['keyformer']['gumbel_ms']:+.1f}, "
                     f"noise {o['keyformer']['noise_ms']:+.1f} ms; without noise "
                     f"{o['keyformer']['x_window_without_noise']:.3f}x)")
    for point, prof in r.get("profile", {}).items():
        lines += ["", f"Decode-step profile {point} (aten self ms per step, top ops):"]
        for k, v in prof.items():
            tops = ", ".join(f"{e['op'].removeprefix('aten::')} {e['ms_per_step']:.1f}" for e in v["top"][:8])
            lines.append(f"    {k:<18} {v['aten_self_ms_per_step']:.1f}: {tops}")
    e = r.get("e2e")
    if e:
        fp, pp = e["full"], e["policy_parts"]
        lines += ["", f"End to end at equal KV memory (target 5), decomposed from {r['e2e_source']} (git "
                      f"{e['commit']}), {e['setting']}:",
                  f"    full batch {fp['batch']}: prefill {fp['prefill_s']:.1f} s + decode "
                  f"{fp['decode_s']:.1f} s "
                  f"(prefill {100 * fp['prefill_share']:.0f} %)",
                  f"    {e['policy']} batch {pp['batch']}: prefill {pp['prefill_s']:.1f} s + decode "
                  f"{pp['decode_s']:.1f} s (prefill {100 * pp['prefill_share']:.0f} %; "
                  f"{e['policy_prefill_x_full_per_sample']:.2f}x full's per-sample prefill)",
                  f"    gain {e['e2e_gain']:.3f}x end to end, {e['decode_gain']:.3f}x decode alone; "
                  f"{e['e2e_gain_if_prefill_at_full_rate']:.3f}x had its prompt cost full's per-sample time"]
    lines.append(f"\nelapsed {r['elapsed_s']:.0f} s")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="keyformer-bench --floors", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny random model, short shapes (seconds)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--model", default="smollm2", choices=("smollm2", "tiny"))
    p.add_argument("--prompt", default="cnn_dailymail", choices=("cnn_dailymail", "random"))
    p.add_argument("--data-dir", default=os.environ.get("KEYFORMER_DATA_DIR"))
    p.add_argument("--prefill-len", type=int, default=4096)
    p.add_argument("--decode", default="4096x1,2048x8", help="decode points LxB, comma-separated ('': none)")
    p.add_argument("--budget", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=32, help="decode steps timed per run")
    p.add_argument("--rounds", type=int, default=3, help="interleaved prefill rounds")
    p.add_argument("--decode-rounds", type=int, default=7,
                   help="interleaved decode rounds (cheaper than a prefill, and noisier: the parts "
                        "they split are a few ms)")
    p.add_argument("--profile-steps", type=int, default=4, help="profiled decode steps per config (0: none)")
    p.add_argument("--profile-prefill", type=int, default=1, choices=(0, 1),
                   help="1: one profiled prompt forward per prefill config, its ops against full's (0: none)")
    p.add_argument("--bandwidth-mb", type=int, default=1024)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--bench", default="results/bench/bench.json",
                   help="committed keyformer-bench run whose end-to-end section is decomposed ('' skips)")
    p.add_argument("--h2o-limit", type=float, default=1.25)
    p.add_argument("--kf-limit", type=float, default=1.5)
    p.add_argument("--overhead-limit", type=float, default=1.05)
    p.add_argument("--share-target", type=float, default=0.9)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    """``keyformer-bench --floors [options]``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--quick" in argv:
        argv = QUICK + [a for a in argv if a != "--quick"]
    args = parser().parse_args(argv)
    for key in ("rounds", "decode_rounds", "steps", "prefill_len"):
        if getattr(args, key) < 1:
            raise SystemExit(f"--{key.replace('_', '-')}={getattr(args, key)} must be >= 1")
    if not 0 < args.budget <= 1:
        raise SystemExit(f"--budget={args.budget} must be a fraction in (0, 1]")
    run(args)
