"""Experiment 7's report sections: the field ranked per task, devices, KV bytes and Pareto fronts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from keyformer.lab import analysis
from keyformer.lab import findings as fnd
from keyformer.lab.report import findings_of, fmt_ci

#: experiment 7's tasks and the standard metric of each (per-sample columns of ``samples.csv``)
EXP7_METRIC = {"cnndm": "rouge2", "needle": "accuracy", "leval_sqa": "token_f1",
               "multi_news": "rougeL_longbench"}


def field(res: Path, name: str = "exp7_field", tasks: tuple[str, ...] | None = None) -> None:
    """Experiment 7 per task (all, or ``tasks``), complete points only: every policy's mean (rank) per
    budget, its pooled paired difference from Keyformer, and the quantized points against full."""
    for task, metric in EXP7_METRIC.items():
        if (tasks is not None and task not in tasks) or not (res / name / task / "points.csv").exists():
            continue
        points, samples = analysis.load_experiment(res / name, task, complete_only=True)
        r = analysis.field_ranking(points, samples, metric, n_boot=5000)
        found = findings_of(res, name)
        if r.empty:
            continue
        per, pooled = r[r["budget"] != "pooled"], r[r["budget"] == "pooled"].set_index("policy")
        budgets = sorted(per["budget"].unique())
        full = points[(points["policy"] == "full") & points.get("kv_quant",
                                                                pd.Series(np.nan, points.index)).isna()]
        print(f"\n### {name}/{task}: {metric}, mean (rank among the policies at that budget) and n\n")
        if not full.empty:
            x = samples.loc[samples["point"] == full["point"].iloc[0], metric].astype(float)
            m, lo, hi = analysis.mean_ci(x.to_numpy(), n_boot=5000)
            print(f"Full cache: {m:.2f} [{lo:.2f}, {hi:.2f}] (n = {len(x)}).\n")
        print("| policy | " + " | ".join(f"{b:g}" for b in budgets) + " | n | pooled - Keyformer [findings] "
                                                                      "| budgets |")
        print("|---|" + "---|" * len(budgets) + "---|---|---|")
        for pol in sorted(per["policy"].unique(), key=lambda p: (p != "keyformer", p)):
            cells, ns = [], set()
            for b in budgets:
                c = per[(per["policy"] == pol) & (per["budget"] == b)]
                cells.append(f"{c['mean'].iloc[0]:.2f} ({int(c['rank'].iloc[0])})" if len(c) else "-")
                ns |= {int(v) for v in c["n"]}
            n = "-".join(str(v) for v in sorted({min(ns), max(ns)}))
            d = pooled.loc[pol] if pol in pooled.index else None
            f = found.get(f"exp7.{task}.{pol}")
            diff = (fnd.fmt_ci(f, 2) if f is not None and f["ci_lo"] is not None  # the finding: one draw
                    else f"{fmt_ci(d['diff_vs_ref'], d['d_lo'], d['d_hi'])} (boot)" if d is not None else "-")
            print(f"| {pol} | " + " | ".join(cells) + f" | {n} | {diff} | "
                                                      f"{d['budgets_used'] if d is not None else '-'} |")
        quant = points[points.get("kv_quant", pd.Series(np.nan, points.index)).notna()]
        if len(quant) and not full.empty:
            print("\n| quantized point | " + metric + " | KV held / full | - full [95 % CI] "
                                                      "|\n|---|---|---|---|")
            for _, q in quant.sort_values("point").iterrows():
                d = analysis.compare_points(samples, q["point"], full["point"].iloc[0], metric, n_boot=5000)
                print(f"| {q['point']} | {q[metric]:.2f} | {q['kv_ratio']:.3f} | "
                      f"{fmt_ci(d.mean, d.lo, d.hi)} |")


def _field_task(task: str) -> Callable[[Path], None]:
    return lambda res: field(res, tasks=(task,))


def exp7_devices(res: Path, name: str = "exp7_field") -> None:
    """Experiment 7's long tasks mix H200 and CPU points: for each task, the points per device and batch size,
    the configs that ran on both (the only way the committed rows can show device agreement), and the
    comparisons against Keyformer at one budget whose two points ran on different devices."""
    print(f"\n### {name}: devices and batch sizes per task (long tasks: what the committed rows can show)\n")
    print("| task | H200 (cuda) points, batch | CPU points, batch | same config on both | "
          "cross-device pairs vs Keyformer at one budget | points on another device than full |\n"
          "|---|---|---|---|---|---|")
    minority = {}
    for task in EXP7_METRIC:
        f = res / name / task / "points.csv"
        if not f.exists():
            continue
        p = pd.read_csv(f)
        if "device" not in p:
            continue
        quant = p["kv_quant"] if "kv_quant" in p else pd.Series(np.nan, p.index)
        setting = [f"{b:g}@{q}" for b, q in zip(p["budget"], quant.map(_quant_name), strict=True)]
        configs = list(zip(p["policy"], setting, strict=True))
        both = sum(1 for c in set(configs) if len({d for c2, d in zip(configs, p["device"], strict=True)
                                                   if c2 == c}) > 1)
        kf = {st: d for (pol, st), d in zip(configs, p["device"], strict=True) if pol == "keyformer"}
        cross = sum(1 for (pol, st), d in zip(configs, p["device"], strict=True)
                    if pol != "keyformer" and st in kf and kf[st] != d)
        ref = p.loc[(p["policy"] == "full") & quant.isna(), "device"]
        vs_full = int((p["device"] != ref.iloc[0]).sum()) if len(ref) else "-"
        cells = []
        for d in ("cuda", "cpu"):
            g = p[p["device"] == d]
            cells.append(f"{len(g)}, batch {'/'.join(str(int(b)) for b in sorted(g['batch_size'].unique()))}"
                         if len(g) else "0")
        print(f"| {task} | {cells[0]} | {cells[1]} | {both} | {cross} | {vs_full} |")
        if (p["device"] == "cuda").any() and (p["device"] == "cpu").any():
            small = min(("cuda", "cpu"), key=lambda d: int((p["device"] == d).sum()))
            minority[task] = (small, sorted(p.loc[p["device"] == small, "point"]))
    for task, (d, pts) in minority.items():
        print(f"\n{task}: to put every point on one device, rerun the {len(pts)} {d} points on the other: "
              + "; ".join(f"`{x}`" for x in pts))


FULL_STATE_BYTES = 8 + 4  # per (layer, KV head, slot): its position (int64) and its score (fp32), cache.py


def quant_bytes(res: Path, name: str = "exp7_field/cnndm", head_dim: int = 64) -> None:
    """KV bytes of experiment 7's CNN/DM points at 0.3 and full, against a full fp32 cache and a full 16-bit
    cache, with and without the per-slot state (position int64 + score fp32 per layer, KV head and slot, which
    the evicting cache holds for every point). ``head_dim`` is SmolLM2-135M's (576 hidden / 9 heads); the fp32
    bytes per token (layers x KV heads x 2 x head_dim x 4) are read off the data and checked to be a
    multiple."""
    f = res / name / "points.csv"
    if not f.exists():
        return
    points, samples = analysis.load_experiment(res, name)
    tok = samples["prompt_tokens"] + samples["generated_tokens"] - 1  # positions the cache wrote
    per_tok = (samples["kv_bytes_full"] / tok).round().mode().iloc[0]  # fp32 K+V bytes of one token
    heads_layers = per_tok / (2 * head_dim * 4)
    if heads_layers != int(heads_layers):
        raise ValueError(f"{name}: {per_tok} fp32 bytes per token is not layers x heads x 2 x {head_dim} x 4")
    q = points.get("kv_quant", pd.Series(np.nan, points.index))
    sel = points[q.notna() | (np.isclose(points["budget"], 0.3) & points["policy"].isin(["h2o", "keyformer"]))
                 | (points["policy"] == "full")].copy()
    sel["q"] = q[sel.index].map(_quant_name)
    full32 = float(samples["kv_bytes_full"].mean())  # mean per sample, as kv_bytes
    full16 = full32 / 2
    print(f"\n### {name}: KV bytes vs a full fp32 and a full 16-bit cache (per-slot state counted)\n")
    print(f"Per-slot state: {FULL_STATE_BYTES} bytes (position int64 + score fp32) per layer, KV head and "
          f"slot, "
          f"against {2 * head_dim * 4} bytes of fp32 K+V ({int(heads_layers)} layer-heads per token); a "
          f"plain "
          "full cache holds no such state.\n")
    print("| point | metric | bytes / full fp32 | bytes / full 16-bit | with state / full fp32 | "
          "with state / full 16-bit |\n|---|---|---|---|---|---|")
    for _, r in sel.sort_values(["q", "policy", "budget"]).iterrows():
        kv = float(r["kv_bytes"])
        kv16, state = _as_16bit(kv, r["q"]), kv / _slot_bytes(r["q"], head_dim) * FULL_STATE_BYTES
        print(f"| {r['point']} | {r['rouge2']:.2f} | {kv / full32:.3f} | {kv16 / full16:.3f} | "
              f"{(kv + state) / full32:.3f} | {(kv16 + state) / full16:.3f} |")


def _slot_bytes(q: str, head_dim: int) -> int:
    """K+V bytes of one (layer, KV head, slot): fp32 ``2 d 4``; int8/int4 codes ``2 d bits / 8`` plus an fp16
    scale and zero per 32 values (keyformer/core/quant.py)."""
    if q == "fp32":
        return 2 * head_dim * 4
    bits = {"int8": 8, "int4": 4}[q]  # kv_quant is recorded as its bits: see _quant_name
    return 2 * head_dim * bits // 8 + 2 * (head_dim // 32) * 2 * 2


def _quant_name(bits: object) -> str:
    """``fp32`` for an unquantized point (``kv_quant`` empty), else ``int8``/``int4`` (points.csv records
    bits)."""
    if bits is None or (isinstance(bits, float) and np.isnan(bits)):
        return "fp32"
    s = str(bits)
    return s if s.startswith("int") else f"int{int(float(s))}"


def _as_16bit(kv: float, q: str) -> float:
    """The same K/V held in a 16-bit model: unquantized tensors halve; codes and fp16 scales do not change."""
    return kv / 2 if q == "fp32" else kv


def pareto_bytes(res: Path, name: str = "exp7_field", head_dim: int = 64) -> None:
    """Experiment 7's accuracy-vs-bytes Pareto fronts (complete points) with the bytes counted two ways: K/V
    in fp32 (as measured) and in 16 bits, each with the per-slot state; which points are on each front."""
    print(f"\n### {name}: Pareto fronts with K/V in fp32 vs in 16 bits (per-slot state counted)\n")
    print("| task | metric | front, fp32 K/V | front, 16-bit K/V |\n|---|---|---|---|")
    for task, metric in EXP7_METRIC.items():
        if not (res / name / task / "points.csv").exists():
            continue
        p, _ = analysis.load_experiment(res / name, task, complete_only=True)
        q = (p["kv_quant"] if "kv_quant" in p else pd.Series(np.nan, p.index)).map(_quant_name)
        state = [kv / _slot_bytes(x, head_dim) * FULL_STATE_BYTES for kv,
                 x in zip(p["kv_bytes"], q, strict=True)]
        b32 = p["kv_bytes"].to_numpy(float) + np.array(state)
        b16 = np.array([_as_16bit(kv, x) for kv, x in zip(p["kv_bytes"], q, strict=True)]) + np.array(state)
        label = (p["policy"] + "@" + p["budget"].map(lambda b: f"{b:g}")
                 + q.map(lambda x: "" if x == "fp32" else f"+{x}"))
        fronts = []
        for b in (b32, b16):
            on = analysis.pareto_front(b, p[metric].to_numpy(float))
            order = np.argsort(b[on])
            fronts.append(", ".join(label[on].to_numpy()[order]))
        print(f"| {task} | {metric} | {fronts[0]} | {fronts[1]} |")


# name -> section; a page quotes a section between <!-- keyformer-report:NAME --> markers
SECTIONS: dict[str, Callable[[Path], None]] = {
    'exp7_field/cnndm': _field_task('cnndm'),
    'exp7_field/needle': _field_task('needle'),
    'exp7_field/leval_sqa': _field_task('leval_sqa'),
    'exp7_field/multi_news': _field_task('multi_news'),
    'exp7_devices': exp7_devices,
    'quant_bytes': quant_bytes,
    'pareto_bytes': pareto_bytes,
}


# -- findings (keyformer.lab.pages) ------------------------------------------------------------------------
TITLE = "7: the field"
QUESTION = ("Where does Keyformer rank among the eviction policies of the field (and K/V quantization) on "
            "CNN/DM, a needle test, L-Eval QA and multi_news?")
#: pre-registered: every policy of the field present when the families were fixed, each against Keyformer
POLICIES = ("adakv_keyformer", "adakv_snapkv", "h2o", "pyramidkv", "snapkv", "tova", "window")
DEFINITION = {
    "metric": dict(EXP7_METRIC),
    "comparison": ("policy - keyformer per task, complete unquantized points; each record's difference is "
                   "averaged over the budgets both policies ran (analysis.field_ranking's pooled row)"),
    "families": {f"exp7.{t}": list(POLICIES) for t in EXP7_METRIC},
    "design": ("paired sign-flip test over a task's records, one stratum (a record's difference is already "
               "its mean over budgets); Holm within each task's family of seven policies at alpha 0.05; "
               "quantized points are in no family"),
    "alpha": fnd.ALPHA,
    "margin": 0.5,  # metric points (ROUGE-2, F1, accuracy x 100), declared after the data
    # the families were first written as Holm lists with the findings engine (2026-12-06), after the rows
    "roles": {"exp7.*": "exploratory"},
}


def _pooled_vs(points: pd.DataFrame, samples: pd.DataFrame, pol: str, ref: str,
               metric: str) -> tuple[pd.Series, bool, list[float]]:
    """Per record, ``pol - ref`` averaged over the budgets both ran (as :func:`analysis.pooled_difference`),
    whether both gave the same prediction on every paired record at every such budget, and those budgets."""
    ev = points[points["policy"] != "full"]
    if "kv_quant" in ev:
        ev = ev[ev["kv_quant"].isna()]
    parts, same, used = [], True, []
    for b in sorted(ev["budget"].unique()):
        at = ev[np.isclose(ev["budget"], b)]
        by = dict(zip(at["policy"], at["point"], strict=False))
        if pol not in by or ref not in by:
            continue
        j = analysis.paired_frame(samples, by[pol], by[ref], metric)
        parts.append(j.assign(d=j["a"].astype(float) - j["b"].astype(float))[["id", "d"]])
        if "prediction" in samples:
            t = analysis.paired_frame(samples, by[pol], by[ref], "prediction").fillna("")
            same = same and bool(len(t)) and bool((t["a"] == t["b"]).all())
        else:
            same = False
        used.append(float(b))
    if not parts:
        return pd.Series(dtype=float), False, []
    return pd.concat(parts).groupby("id")["d"].mean(), same, used


def _ranks(points: pd.DataFrame, samples: pd.DataFrame, metric: str) -> dict[str, dict[str, int]]:
    """Per policy, its rank by mean ``metric`` among the unquantized eviction policies at each budget (1 =
    best; as analysis.field_ranking ranks)."""
    ev = points[points["policy"] != "full"]
    if "kv_quant" in ev:
        ev = ev[ev["kv_quant"].isna()]
    means = samples.groupby("point")[metric].mean()
    ev = ev.assign(mean=ev["point"].map(means)).dropna(subset=["mean"])
    ev = ev.assign(rank=ev.groupby("budget")["mean"].rank(ascending=False, method="min").astype(int))
    return {pol: {f"{b:g}": int(r) for b, r in zip(g["budget"], g["rank"], strict=True)}
            for pol, g in ev.groupby("policy")}


def comparisons(res: Path, name: str = "exp7_field") -> list[fnd.Comparison]:
    """Per task, each pre-registered policy's pooled paired difference from Keyformer (complete points)."""
    out = []
    for task, metric in EXP7_METRIC.items():
        if not (res / name / task / "points.csv").exists():
            continue
        points, samples = analysis.load_experiment(res / name, task, complete_only=True)
        ranks = _ranks(points, samples, metric)
        for pol in DEFINITION["families"][f"exp7.{task}"]:
            d, same, used = _pooled_vs(points, samples, pol, "keyformer", metric)
            if d.empty:
                continue
            out.append(fnd.Comparison(
                id=f"exp7.{task}.{pol}", quantity=f"{metric}, policy - keyformer, pooled over budgets",
                a=pol, b="keyformer", strata=[d.to_numpy()], family=f"exp7.{task}", identical=same,
                meta={"task": task, "metric": metric, "budgets": used, "rank_a": ranks.get(pol, {}),
                      "rank_b": ranks.get("keyformer", {})}))
    return out


def _ci(f: dict) -> str:
    return fnd.fmt_ci(f, 2)


def _by_task(doc: dict) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in doc["findings"]:
        out.setdefault(f["meta"]["task"], []).append(f)
    return out


def bullets(doc: dict) -> list[str]:
    """One line per task (each policy against Keyformer, grouped by verdict), Keyformer's ranks, the
    comparisons an unadjusted p would call but Holm does not, and the identical-output ones."""
    out = []
    tasks = _by_task(doc)
    for task, fs in tasks.items():
        groups = []
        below = sorted((f for f in fs if f["verdict"] == "behind"), key=lambda f: f["estimate"])
        if below:
            groups.append("below Keyformer after Holm: " + ", ".join(f"`{f['a']}`" for f in below))
        for v, words in (("ahead", "above Keyformer"), ("equivalent", "equivalent (within +-0.5)"),
                         ("inconclusive", "inconclusive"), ("n/a", "identical outputs")):
            g = sorted((f for f in fs if f["verdict"] == v), key=lambda f: f["estimate"])
            if g:
                groups.append(f"{words}: " + ", ".join(f"`{f['a']}` {_ci(f)}" for f in g))
        size = max((f["family_size"] or 0) for f in fs)
        out.append(f"**{task}** ({fs[0]['meta']['metric']}, policy - Keyformer pooled over budgets, n "
                   f"{fs[0]['n']}, Holm over {size}): " + "; ".join(groups) + ".")
    ranks = []
    for task, fs in tasks.items():
        r = fs[0]["meta"]["rank_b"]
        ranks.append(f"{task} " + "/".join(str(r[b]) for b in sorted(r, key=float)))
    budgets = sorted({b for fs in tasks.values() for b in fs[0]["meta"]["rank_b"]}, key=float)
    if ranks:
        n_pol = len(next(iter(doc["definition"]["families"].values()))) + 1
        out.append(f"Keyformer's rank by mean among the {n_pol} policies at budgets "
                   f"{'/'.join(budgets)}: " + "; ".join(ranks) + ".")
    lost = [f for f in doc["findings"] if f["p"] is not None and f["p"] < doc["definition"]["alpha"]
            and f["verdict"] in ("inconclusive", "equivalent")]
    if lost:
        out.append("Separable from Keyformer by an unadjusted p but not after Holm: " + "; ".join(
            f"{f['meta']['task']} `{f['a']}` (p {fnd.fmt_p(f, False)}, Holm {fnd.fmt_p(f)})" for f in lost)
            + ".")
    same = [f for f in doc["findings"] if f["verdict"] == "n/a"]
    out.append("Outputs identical to Keyformer's on every paired record and budget (left out of their "
               "family): " + (", ".join(f"{f['meta']['task']} `{f['a']}`" for f in same) or "none") + ".")
    return out[:8]


def answer(doc: dict) -> str:
    """Whether any policy beats Keyformer after Holm, per task, and where H2O stands."""
    tasks = _by_task(doc)
    ahead = [f"`{f['a']}` on {t}" for t, fs in tasks.items() for f in fs if f["verdict"] == "ahead"]
    clear = [t for t, fs in tasks.items() if not any(f["verdict"] == "ahead" for f in fs)]
    h2o = {t: f["verdict"] for t, fs in tasks.items() for f in fs if f["a"] == "h2o"}
    open_h2o = [t for t, v in h2o.items() if v in ("inconclusive", "equivalent")]
    return (f"No policy is above Keyformer after Holm on {len(clear)} of {len(tasks)} tasks"
            + (f"; above it: {', '.join(ahead)}" if ahead else "")
            + f"; H2O is not separated from it on {len(open_h2o)} of {len(h2o)}.")


def field_table(res: Path, doc: dict | None) -> str:
    """The findings as one table: per policy (rows) and task (columns), policy - Keyformer pooled over
    budgets with its CI and its verdict after Holm within the task."""
    if not doc or not doc["findings"]:
        return "(no findings yet)"
    tasks = _by_task(doc)
    cell = {(f["a"], t): f"{_ci(f)} {f['verdict']} (Holm p {fnd.fmt_p(f)})"
            for t, fs in tasks.items() for f in fs}
    pols = [p for p in POLICIES if any((p, t) in cell for t in tasks)]
    head = "| policy - Keyformer | " + " | ".join(
        f"{t} ({fs[0]['meta']['metric']}, n {fs[0]['n']})" for t, fs in tasks.items()) + " |"
    rows = [head, "|---|" + "---|" * len(tasks)]
    rows += [f"| {p} | " + " | ".join(cell.get((p, t), "-") for t in tasks) + " |" for p in pols]
    return "\n".join(rows)


PLACEHOLDERS = {"field_table": field_table}
