"""Side-by-side with NVIDIA kvpress: the same SmolLM2 weights and real CNN/DailyMail prompts.

kvpress (``StreamingLLMPress``, ``ObservedAttentionPress``; compression at prefill only, so its cache
grows again while decoding) against our ``window``/``streaming`` and ``h2o`` policies (evicting at every
step) at the same compression (kvpress ``compression_ratio = 1 - budget``). Per method: prefill time (to the
first logits), decode ms/token, peak RSS increase, K/V bytes held at the end, and agreement of the greedy
tokens with the same side's full cache.

Sides (each writes JSON; ``all`` runs every side and merges):

* ``prompts``: tokenize prompts (chat template) from ``cnn_dailymail.jsonl`` -> ``prompts.json``.
* ``kvpress``: run with ``.venv-kvpress/bin/python -m experiments.crosscheck_kvpress.kvpress_compare``
  from the
  checkout's root (kvpress pins transformers < 5.3, so keyformer is not installed there; ``-m`` finds the
  package in the current folder). Imports only the standard library and :mod:`keyformer.lab.bench.memory` at
  module level, then torch, transformers and kvpress; the model is read from the converted safetensors folder
  (``--model-dir``).
* ``ours``: run with the main venv (imports ``keyformer``).
* ``merge``: one table from the JSON files.

    bash scripts/setup_kvpress_venv.sh                        # once
    KEYFORMER_DATA_DIR=../shared/data python -m experiments.crosscheck_kvpress.kvpress_compare
    # = --side all, writes results/bench/kvpress/
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from keyformer.lab.bench.memory import start_peak, status_mb

DEFAULT_OUT = Path("results") / "bench" / "kvpress"
KVPRESS_PYTHON = Path(".venv-kvpress") / "bin" / "python"  # below the checkout's root
INSTRUCTION = "Summarize the following news article in three sentences.\n\n"


# ---------------------------------------------------------------------------------------------------------
# shared helpers (stdlib + torch only)


def default_model_dir() -> str:
    """SmolLM2's converted folder, as the loader resolves it (``$KEYFORMER_CACHE_DIR/smollm2``)."""
    from keyformer.run.loading import cache_dir

    return str(cache_dir())


def make_step_clock(base: type) -> Any:
    """A LogitsProcessor recording the time of every forward's logits (the first closes the prefill)."""

    class StepClock(base):  # type: ignore[misc, valid-type]
        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(self, input_ids, scores):  # type: ignore[no-untyped-def]
            self.times.append(time.perf_counter())
            return scores

    return StepClock()


def load_prompts(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def timed_generate(fn: Any, clock: Any) -> dict[str, Any]:
    """Run ``fn()`` (a generate call using ``clock``) and return prefill/decode times and peak RSS."""
    before = start_peak()
    t0 = time.perf_counter()
    out = fn()
    t1 = time.perf_counter()
    times = clock.times
    n_dec = max(0, len(times) - 1)
    return {"out": out, "prefill_s": times[0] - t0, "decode_ms": 1000 * (t1 - times[0]) / max(1, n_dec),
            "n_decode_steps": n_dec, "peak_rss_delta_mb": status_mb("VmHWM") - before}


# ---------------------------------------------------------------------------------------------------------
# prompts


def side_prompts(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model_dir)
    prompts = []
    with open(args.data) as f:
        for line in f:
            rec = json.loads(line)
            msgs = [{"role": "user", "content": INSTRUCTION + rec["article"]}]
            text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            if args.min_tokens <= len(ids) <= args.max_tokens:
                prompts.append({"id": rec["id"], "input_ids": ids})
            if len(prompts) == args.n_prompts:
                break
    Path(args.out).write_text(json.dumps({"new_tokens": args.new_tokens, "budgets": args.budgets,
                                          "prompts": prompts}) + "\n")
    print(f"[prompts] {len(prompts)} prompts, lengths {[len(p['input_ids']) for p in prompts]}", flush=True)


# ---------------------------------------------------------------------------------------------------------
# kvpress side (torch, transformers, kvpress only)


def side_kvpress(args: argparse.Namespace) -> None:
    from importlib.metadata import version

    import torch
    import transformers
    from kvpress import ObservedAttentionPress, StreamingLLMPress
    from transformers import AutoModelForCausalLM, DynamicCache, LogitsProcessor, LogitsProcessorList

    transformers.utils.logging.disable_progress_bar()
    spec = load_prompts(Path(args.prompts))
    n_new = int(spec["new_tokens"])
    models = {impl: AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32,
                                                         attn_implementation=impl).eval()
              for impl in ("sdpa", "eager")}
    methods: list[tuple[str, str, Any, float | None]] = [("kvpress full (sdpa)", "sdpa", None, None),
                                                         ("kvpress full (eager)", "eager", None, None)]
    for b in spec["budgets"]:
        methods.append((f"StreamingLLMPress@{b:g}", "sdpa", StreamingLLMPress(compression_ratio=1 - b), b))
        methods.append((f"ObservedAttentionPress@{b:g}", "eager",
                        ObservedAttentionPress(compression_ratio=1 - b), b))

    def run(impl: str, press: Any, ids: list[int], n: int) -> dict[str, Any]:
        model = models[impl]
        x = torch.tensor([ids])
        cache = DynamicCache()
        clock = make_step_clock(LogitsProcessor)

        def gen() -> Any:
            kw = dict(input_ids=x, attention_mask=torch.ones_like(x), past_key_values=cache, max_new_tokens=n,
                      min_new_tokens=n, do_sample=False, logits_processor=LogitsProcessorList([clock]),
                      pad_token_id=model.generation_config.eos_token_id)
            with torch.inference_mode():
                if press is None:
                    return model.generate(**kw)
                with press(model):
                    return model.generate(**kw)

        r = timed_generate(gen, clock)
        r["tokens"] = r.pop("out")[0, len(ids):].tolist()
        r["kv_bytes_end"] = (sum(t.numel() * t.element_size() for layer in cache.layers
                                 for t in (layer.keys, layer.values)))
        r["kv_tokens_end"] = int(cache.layers[0].keys.shape[-2])
        return r

    for _, impl, press, _ in methods:  # warm-up
        run(impl, press, spec["prompts"][0]["input_ids"][:256], 4)
    results = {name: [] for name, *_ in methods}
    for p in spec["prompts"]:
        for name, impl, press, _ in methods:
            results[name].append(run(impl, press, p["input_ids"], n_new))
        print(f"[kvpress] prompt {p['id']} done", flush=True)
    meta = {"kvpress": version("kvpress"), "transformers": transformers.__version__,
            "torch": torch.__version__,
            "threads": torch.get_num_threads()}
    out = {"side": "kvpress", "meta": meta, "methods": [
        {"name": name, "impl": impl, "budget": b, "runs": results[name]} for name, impl, _, b in methods]}
    Path(args.out).write_text(json.dumps(out) + "\n")


# ---------------------------------------------------------------------------------------------------------
# our side


def our_model(model_dir: str) -> Any:
    """The checkpoint in fp32, prepared for our cache (our side of every cross-check)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from keyformer.core.models import prepare_model

    transformers.utils.logging.disable_progress_bar()
    return prepare_model(AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="sdpa").eval())


def side_ours(args: argparse.Namespace) -> None:
    import torch
    import transformers

    from keyformer.core.generate import generate
    from keyformer.core.policies import make_policy

    spec = load_prompts(Path(args.prompts))
    n_new = int(spec["new_tokens"])
    model = our_model(args.model_dir)
    methods: list[tuple[str, Any, float | None]] = [("ours full", make_policy("full"), None)]
    for b in spec["budgets"]:
        for name in ("window", "streaming", "h2o", "keyformer"):
            methods.append((f"ours {name}@{b:g}", make_policy(name, budget=float(b)), b))

    def run(policy: Any, ids: list[int], n: int) -> dict[str, Any]:
        x = torch.tensor([ids])
        before = start_peak()
        o = generate(model, x, torch.ones_like(x), policy, max_new_tokens=n, min_new_tokens=n)
        return {"prefill_s": o.prefill_s, "decode_ms": 1000 * o.decode_s / max(1, o.n_decode_steps),
                "n_decode_steps": o.n_decode_steps, "peak_rss_delta_mb": status_mb("VmHWM") - before,
                "tokens": o.sequences[0].tolist(), "kv_bytes_end": int(o.kv_bytes[0]),
                "kv_tokens_end": int(o.kv_bytes[0] // max(1, o.cache.bytes_per_token()))}

    for _, policy, _ in methods:
        run(policy, spec["prompts"][0]["input_ids"][:256], 4)
    results = {name: [] for name, *_ in methods}
    for p in spec["prompts"]:
        for name, policy, _ in methods:
            results[name].append(run(policy, p["input_ids"], n_new))
        print(f"[ours] prompt {p['id']} done", flush=True)
    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "threads": torch.get_num_threads()}
    out = {"side": "ours", "meta": meta, "methods": [
        {"name": name, "impl": "keyformer (sdpa)", "budget": b, "runs": results[name]} for name, _,
                                                     b in methods]}
    Path(args.out).write_text(json.dumps(out) + "\n")


# ---------------------------------------------------------------------------------------------------------
# merge


def _agreement(tokens: list[int], ref: list[int]) -> tuple[float, float]:
    """(position-wise match rate, common-prefix fraction) of two equal-length token lists."""
    n = min(len(tokens), len(ref))
    if n == 0:
        return float("nan"), float("nan")
    same = [a == b for a, b in zip(tokens[:n], ref[:n], strict=True)]
    prefix = next((i for i, s in enumerate(same) if not s), n)
    return sum(same) / n, prefix / n


def side_merge(args: argparse.Namespace) -> None:
    out_dir = Path(args.out_dir)
    spec = load_prompts(out_dir / "prompts.json")
    sides = [json.loads((out_dir / f"{s}.json").read_text()) for s in ("ours", "kvpress")]
    lens = [len(p["input_ids"]) for p in spec["prompts"]]
    med = statistics.median
    rows = []
    refs = {"ours": next(m for m in sides[0]["methods"] if m["budget"] is None),
            "kvpress": next(m for m in sides[1]["methods"] if m["name"] == "kvpress full (sdpa)")}
    for side in sides:
        ref = refs[side["side"]]
        for m in side["methods"]:
            agree = [_agreement(r["tokens"], q["tokens"]) for r,
                     q in zip(m["runs"], ref["runs"], strict=True)]
            rows.append({
                "side": side["side"], "method": m["name"], "budget": m["budget"],
                "prefill_s": med(r["prefill_s"] for r in m["runs"]),
                         "decode_ms": med(r["decode_ms"] for r in m["runs"]),
                "peak_rss_delta_mb": med(r["peak_rss_delta_mb"] for r in m["runs"]),
                "kv_mib_end": med(r["kv_bytes_end"] for r in m["runs"]) / 2**20,
                "kv_tokens_end": med(r["kv_tokens_end"] for r in m["runs"]),
                "match_rate": statistics.fmean(a for a, _ in agree),
                         "prefix": statistics.fmean(p for _, p in agree),
            })
    cross = [_agreement(a["tokens"], b["tokens"]) for a,
             b in zip(refs["ours"]["runs"], refs["kvpress"]["runs"], strict=True)]
    head = (f"{'method':<32} {'prefill s':>9} {'decode ms/tok':>13} {'peakΔ MiB':>9} {'KV MiB end':>10} "
            f"{'KV tok end':>10} {'match':>6} {'prefix':>6}")
    lines = [
        f"kvpress side-by-side: SmolLM2-135M-Instruct fp32, {len(lens)} CNN/DailyMail prompts "
        f"({min(lens)}-{max(lens)} tokens, chat template), {spec['new_tokens']} greedy tokens, batch 1, "
        f"medians over prompts.",
        f"kvpress {sides[1]['meta'].get('kvpress')} with transformers {sides[1]['meta']['transformers']}; "
        f"ours with "
        f"transformers {sides[0]['meta']['transformers']}; torch {sides[0]['meta']['torch']}, "
        f"{sides[0]['meta']['threads']} threads.",
        "match = position-wise agreement with the same side's full cache; prefix = fraction before the first "
        "difference (means over prompts).",
        f"ours full vs kvpress full (sdpa): match {statistics.fmean(a for a, _ in cross):.3f} (same weights, "
        "different transformers versions).",
        "", head, "-" * len(head),
    ]
    for r in rows:
        lines.append(f"{r['method']:<32} {r['prefill_s']:9.2f} {r['decode_ms']:13.1f} "
                     f"{r['peak_rss_delta_mb']:9.1f} "
                     f"{r['kv_mib_end']:10.1f} {r['kv_tokens_end']:10.0f} {r['match_rate']:6.3f} "
                     f"{r['prefix']:6.3f}")
    text = "\n".join(lines)
    (out_dir / "table.txt").write_text(text + "\n")
    (out_dir / "merged.json").write_text(json.dumps({"rows": rows, "cross_full_match": cross}, indent=1)
                                         + "\n")
    print(text)


# ---------------------------------------------------------------------------------------------------------


def run_sides(args: argparse.Namespace, module: str, tool: str, merge, ext: str = "json",
              extra: Sequence[str] = ()) -> None:
    """A kvpress comparison's three sides, each in its own process from the checkout's root (prompts and ours
    in this environment, kvpress in its own venv), then ``merge(args)``; ``tool`` is recorded in
    command.txt."""
    root = Path(__file__).resolve().parents[2]  # the sides run from the checkout's root (see the docstring)
    out_dir = Path(args.out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    kv_py = root / KVPRESS_PYTHON
    if not kv_py.exists():
        sys.exit(f"{kv_py} missing: run `bash scripts/setup_kvpress_venv.sh` first")
    if not args.data:
        sys.exit("no CNN/DailyMail file: set KEYFORMER_DATA_DIR or pass --data")
    common = ["--model-dir", str(Path(args.model_dir).resolve()), *extra]
    me = ["-m", module]
    prompts = str(out_dir / "prompts.json")
    steps = [
        [sys.executable, *me, "--side", "prompts", *common, "--data", str(Path(args.data).resolve()),
         "--n-prompts", str(args.n_prompts), "--new-tokens", str(args.new_tokens), "--budgets",
         *[str(b) for b in args.budgets], "--min-tokens", str(args.min_tokens), "--max-tokens",
         str(args.max_tokens),
         "--out", prompts],
        [sys.executable, *me, "--side", "ours", *common, "--prompts", prompts, "--out",
         str(out_dir / f"ours.{ext}")],
        [str(kv_py), *me, "--side", "kvpress", *common, "--prompts", prompts, "--out",
         str(out_dir / f"kvpress.{ext}")],
    ]
    for cmd in steps:
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True, cwd=root)
    merge(args)
    (out_dir / "command.txt").write_text(" ".join([tool, *sys.argv[1:]]) + "\n")


def side_all(args: argparse.Namespace) -> None:
    run_sides(args, __spec__.name, f"python -m {__spec__.name}", side_merge)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", default="all", choices=["all", "prompts", "kvpress", "ours", "merge"])
    ap.add_argument("--model-dir", default=default_model_dir(), help="converted SmolLM2 safetensors folder")
    data_dir = os.environ.get("KEYFORMER_DATA_DIR")
    ap.add_argument("--data", default=str(Path(data_dir) / "cnn_dailymail.jsonl") if data_dir else None,
                    help="cnn_dailymail.jsonl (default: in $KEYFORMER_DATA_DIR)")
    ap.add_argument("--n-prompts", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.5])
    ap.add_argument("--min-tokens", type=int, default=600)
    ap.add_argument("--max-tokens", type=int, default=1200)
    ap.add_argument("--prompts", help="prompts.json (sides ours/kvpress)")
    ap.add_argument("--out", help="output JSON (sides prompts/ours/kvpress)")
    ap.add_argument("--out-dir", default=str(DEFAULT_OUT), help="folder of all/merge")
    args = ap.parse_args(argv)
    {"all": side_all, "prompts": side_prompts, "kvpress": side_kvpress, "ours": side_ours,
     "merge": side_merge}[args.side](args)


if __name__ == "__main__":
    main()
