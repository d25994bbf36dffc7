"""Gather run folders (results contract of run.py) into curated, committed files under results/.

    keyformer-collect multirun/my_sweep results/my_sweep
    keyformer-collect my_sweep results/my_sweep --wandb ENTITY/keyformer     # from W&B
    keyformer-collect my_sweep results/my_sweep --wandb multirun/my_sweep   # W&B offline runs, no network
    keyformer-collect multirun/fewshot results/fewshot                          # lm-eval runs (task=lm_eval)
    keyformer-collect multirun/my_rerun results/my_sweep --replace             # re-run points replace theirs
    keyformer-collect multirun/ruler results/my_ruler/aware --replace --complete-only  # finished runs only
    keyformer-collect multirun/ruler results/my_ruler/aware --replace --complete-only --policies tova

The W&B source reads the runs of one group (``logger=wandb``'s group: the sweep's name, docs/wandb.md) with
their config, summary metrics and per-sample table, from the server or from the offline runs below a local
folder, and writes the same files, so the notebooks read either.

Every sub-folder of the sweep folder that holds ``config.yaml`` + ``predictions.jsonl`` is one point
(finished or not). Writes:

* ``<out>/points.csv``: one row per point: its folder name (``point``), the config that defines it
  (policy and its knobs, budget, recent, dataset, model, n_samples, prompt/generation limits, seed) and
  its aggregate metrics. ``n_done`` counts finished samples, ``complete`` is true once all are done; the
  ROUGE means of an unfinished point are over its finished samples. Provenance (:data:`PROVENANCE_COLS`):
  ``code_version`` (hash of the core code), ``git_commit``, ``device``, ``dtype`` (as resolved) and
  ``batch_size`` from the run's ``metrics.json``/``config.yaml``, and ``provenance = run``; a value the run
  did not record stays empty. (Rows written before these columns existed were backfilled from committed
  records: ``provenance = backfilled:<sources>``, ``committed_in`` = the commit that added the row; see
  ``results/README.md``.)
* ``<out>/samples.csv``: one row per (point, sample id): per-sample ROUGE, token counts, KV bytes and the
  generated text (no reference text: the data stays out of the repo). This is what the paired bootstrap
  in :mod:`keyformer.lab.analysis` needs.

A folder of ``task=lm_eval`` runs (the few-shot experiment; every ``metrics.json`` below it, at any depth,
with ``task: lm_eval``) gives instead ``<out>/fewshot.csv`` (one row per run and lm-eval task: acc,
acc_norm, their stderr, n) and ``<out>/fewshot.json`` (each run's config and full metrics).

``--replace`` merges instead of overwriting: the collected points replace the same-named points of ``<out>``
(rows of ``points.csv`` and ``samples.csv``), new ones are added, the others stay; every replaced or added
point is logged as one line on stdout and one row of ``<out>/replaced.csv`` with its old and new provenance
(a point whose rows are exactly those already in ``<out>`` is not: nothing changed), for re-runs of some
points of an experiment whose other run folders are no longer on disk.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import io
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

ROUGE = ["rouge1", "rouge2", "rougeL", "rougeLsum"]
SAMPLE_COLS = ["id", "prompt_tokens", "truncated_tokens", "generated_tokens", *ROUGE, "kv_bytes",
               "kv_bytes_full", "prefill_ms", "decode_ms", "batch_size", "prediction"]
# task metrics of some datasets (long-context QA, LongBench, the needle and sample retrieval tasks) and the
# needle's coordinates: collected per sample and averaged per point when the runs have them
TASK_COLS = ["token_f1", "exact_match", "rougeL_longbench", "accuracy", "string_match_all",
             "string_match_part"]
NEEDLE_COLS = ["needle_length", "needle_depth"]
# share_prompt=true runs: whether a record's prompt forward was another budget's (points: how many records)
REUSE_COLS = ["prompt_reused"]
# what a point was produced by: read from its metrics.json (config.yaml's ``resolved`` block as a fallback)
PROVENANCE_COLS = ["code_version", "git_commit", "device", "dtype", "batch_size", "provenance",
                   "committed_in"]
METRIC_COLS = ["prefill_ms", "decode_ms_per_token", "tokens_per_s", "kv_bytes", "kv_bytes_full", "kv_ratio",
               "wall_s"]


def _read_jsonl(path: Path) -> list[dict]:
    """The rows of a run's predictions.jsonl, one per ``id`` (the last written wins, as in the run's own
    metrics.json); torn or damaged lines are skipped; each skipped line or repeated id is reported in one line
    on stderr."""
    rows: dict[str, dict] = {}
    bad = repeated = 0
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad += 1  # torn last line of a killed run, or a damaged line
                continue
            if not isinstance(row, dict) or "id" not in row:
                bad += 1
                continue
            key = str(row["id"])
            repeated += key in rows
            rows.pop(key, None)
            rows[key] = row
    if bad or repeated:
        print(f"warning: {path}: {bad} unreadable line(s) skipped, {repeated} repeated id(s) counted once",
              file=sys.stderr)
    return list(rows.values())


def point_config(cfg: dict, metrics: dict | None = None) -> dict:
    """The settings that define a point, flattened. The policy's name and knobs come from the policy that ran,
    as metrics.json records it (``policy_spec``: its name and every parameter; ``recent``: null when the
    policy has no recent window), else (runs before ``policy_spec``) from config.yaml's policy node."""
    spec = dict((metrics or {}).get("policy_spec") or {})
    if spec:
        name = spec.pop("name")
        hidden = {"prefill_only": False, "sliding": "auto"}  # shown only when not these defaults, as before
        pol = {k: v for k, v in spec.items() if k not in hidden or v != hidden[k]}
        pol.update(name=name, recent=(metrics or {}).get("recent"))
    else:
        pol = _legacy_policy(cfg)
    gen = cfg.get("generation") or {}
    row = {
        "policy": pol.pop("name", None),
        "budget": pol.pop("budget", cfg.get("budget")),
        "recent": pol.pop("recent", None),
        "dataset": (cfg.get("dataset") or {}).get("name"),
        "model": (cfg.get("model") or {}).get("name"),
        "n_samples": cfg.get("n_samples"),
        "max_prompt_tokens": cfg.get("max_prompt_tokens"),
        "max_new_tokens": gen.get("max_new_tokens"),
        "num_beams": gen.get("num_beams"),
        "beam_scores": gen.get("beam_scores"),
        "batch_size": cfg.get("batch_size"),
        "seed": cfg.get("seed"),
        "chat_template": (cfg.get("model") or {}).get("chat_template"),
        "variant": cfg.get("variant"),
        "kv_quant": ((cfg.get("kv_quant") or {}).get("bits")),
    }
    if "query_agnostic" in (cfg.get("dataset") or {}):  # RULER's setting (dataset.query_agnostic)
        row["query_agnostic"] = bool(cfg["dataset"]["query_agnostic"])
    for k, v in pol.items():
        row[f"policy.{k}"] = v
    return row


def _legacy_policy(cfg: dict) -> dict:
    """The policy node of config.yaml, for runs whose metrics.json predates ``policy_spec``: what those runs'
    points.csv rows always showed (a ``full`` run's budget 1.0 and no recent; a knob the node leaves out, as
    SnapKV's ``recent``, blank)."""
    pol = dict(cfg.get("policy") or {})
    if "_target_" in pol:  # results contract v2: the policy node is a Hydra _target_
        from keyformer.core.policies import split_node

        name, pol = split_node(pol)
        pol["name"] = name
    pol.setdefault("budget", cfg.get("budget"))
    if pol.get("name") == "full":
        pol["budget"], pol["recent"] = 1.0, None
    return pol


def provenance(cfg: dict, metrics: dict) -> dict:
    """``code_version, git_commit, device, dtype, batch_size, provenance`` of one run, from its metrics and
    config (``resolved``: what ``device``/``dtype`` ran as); what neither records is None, never a guess."""
    ident = cfg.get("resolved") or {}
    return {
        "code_version": metrics.get("code_version") or (ident.get("versions") or {}).get("keyformer"),
        "git_commit": metrics.get("git_commit"),
        "device": metrics.get("device") or ident.get("device"),
        "dtype": metrics.get("dtype") or ident.get("dtype"),
        "batch_size": cfg.get("batch_size"),
        "provenance": "run",
        "committed_in": None,
    }


def point_rows(name: str, cfg: dict, preds: list[dict], metrics: dict) -> tuple[dict, pd.DataFrame]:
    """One point's ``points.csv`` row and ``samples.csv`` rows, from its config, predictions and metrics."""
    n_samples = cfg.get("n_samples")
    row = {"point": name, **point_config(cfg, metrics), "n_done": len(preds),
           "complete": bool(metrics.get("complete"))
           and len(preds) >= (n_samples if isinstance(n_samples, int) else 0)}
    df = pd.DataFrame(preds)
    if "answer_found" in df and "accuracy" not in df:  # retrieval: per sample 100 or 0, as metrics.accuracy
        df["accuracy"] = 100.0 * df["answer_found"].astype(float)
    for k in ROUGE:
        row[k] = float(df[k].mean())
    for k in TASK_COLS:
        if k in df:
            row[k] = float(df[k].astype(float).mean())
    if "prompt_reused" in df:
        row["n_prompt_reused"] = int(df["prompt_reused"].astype(bool).sum())
    if "truncated_tokens" in df:
        row["n_truncated"] = int((df["truncated_tokens"] > 0).sum())
    for k in METRIC_COLS:
        row[k] = metrics.get(k)
    if row["kv_ratio"] is None and "kv_bytes" in df and df["kv_bytes_full"].sum():
        row["kv_ratio"] = float(df["kv_bytes"].sum() / df["kv_bytes_full"].sum())
    row["mean_prompt_tokens"] = float(df["prompt_tokens"].mean())
    row["mean_generated_tokens"] = float(df["generated_tokens"].mean())
    row.update(provenance(cfg, metrics))
    s = df[[c for c in [*SAMPLE_COLS[:-1], *TASK_COLS, *NEEDLE_COLS, *REUSE_COLS,
                                            SAMPLE_COLS[-1]] if c in df]].copy()
    s.insert(0, "point", name)
    return row, s


def _frames(pairs: list[tuple[dict, pd.DataFrame]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    if not pairs:
        return pd.DataFrame(), pd.DataFrame()
    return pd.DataFrame([r for r, _ in pairs]), pd.concat([s for _, s in pairs], ignore_index=True)


def collect(sweep: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Points and samples of a local sweep folder (the results contract of ``run.py``)."""
    pairs = []
    for d in sorted(p for p in sweep.iterdir() if p.is_dir()):
        cfg_path = d / "config.yaml"
        if not cfg_path.is_file():
            continue
        cfg = yaml.safe_load(cfg_path.read_text(encoding="utf-8"))
        preds = _read_jsonl(d / "predictions.jsonl")
        if not preds:
            continue
        metrics = json.loads((d / "metrics.json").read_text()) if (d / "metrics.json").is_file() else {}
        pairs.append(point_rows(d.name, cfg, preds, metrics))
    return _frames(pairs)


def _wandb_samples(run, key: str = "samples") -> list[dict]:
    """The per-sample table a run logged (``logger.log_samples``), downloaded from its files."""
    ref = run.summary.get(key)
    if not isinstance(ref, dict) or "path" not in ref:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        with run.file(ref["path"]).download(root=tmp, replace=True) as f:
            t = json.load(f)
    return [dict(zip(t["columns"], r, strict=True)) for r in t["data"]]


def collect_wandb(path: str, group: str, api=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Points and samples of the W&B runs of one ``group`` (a sweep: see
    :func:`keyformer.run.wandb_log.group_name`) in ``path``: ``entity/project`` on the W&B server, or a
    local folder holding offline runs (``WANDB_MODE=offline``; read by
    :mod:`keyformer.run.wandb_offline`, no network). A point logged by several runs (a resumed job) is
    read from the newest. A run without its sample table is skipped (paired statistics need it)."""
    if api is None and Path(path).is_dir():
        from keyformer.run.wandb_offline import OfflineApi

        api = OfflineApi(path)
    elif api is None:
        import wandb

        api = wandb.Api()
    newest = {}
    runs = api.runs(path, filters={"group": group})
    for run in sorted(runs, key=lambda r: str(getattr(r, "created_at", ""))):
        newest[run.name] = run
    pairs = []
    for run in newest.values():
        preds = _wandb_samples(run)
        if not preds:
            print(f"warning: W&B run {run.name!r} has no sample table; skipped", file=sys.stderr)
            continue
        summary = {k: v for k, v in dict(run.summary).items() if not isinstance(v, dict)}
        pairs.append(point_rows(run.name, dict(run.config), preds, summary))
    return _frames(sorted(pairs, key=lambda p: p[0]["point"]))


LM_EVAL_COLUMNS = ("model", "task", "policy", "budget", "recent", "loglikelihood", "num_fewshot", "limit",
                   "n_samples", "acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "dtype", "batch_size",
                   "seed", "wall_s", "git_commit", "device", "code_version", "provenance", "run")


def lm_eval_metrics(root: Path) -> list[Path]:
    """``metrics.json`` files of the complete lm-eval runs at any depth below ``root``."""
    out = []
    for m_path in sorted(root.glob("**/metrics.json")):
        m = json.loads(m_path.read_text())
        if m.get("complete") and m.get("task") == "lm_eval":
            out.append(m_path)
    return out


def _lm_eval_provenance(cfg: dict, m: dict) -> dict:
    """``device``, ``code_version`` and ``provenance = run`` of an lm-eval run (what it recorded, else
    None)."""
    ident = cfg.get("resolved") or {}
    device = m.get("device") or ident.get("device")
    if device is None and cfg.get("device") not in (None, "auto"):
        device = str(cfg["device"]).split(":")[0]  # an explicit device is what ran
    return {"device": device, "provenance": "run",
            "code_version": m.get("code_version") or (ident.get("versions") or {}).get("keyformer")}


def collect_lm_eval(root: Path, out: Path) -> list[dict[str, Any]]:
    """Curated rows of every complete lm-eval run under ``root``; writes fewshot.csv and fewshot.json."""
    from keyformer.run.results import atomic_write_text

    rows, points = [], []
    for m_path in lm_eval_metrics(root):
        m = json.loads(m_path.read_text())
        cfg = yaml.safe_load((m_path.parent / "config.yaml").read_text(encoding="utf-8"))
        run = str(m_path.parent.relative_to(root))
        points.append({"run": run, "config": {k: cfg.get(k) for k in (
            "model", "policy", "task", "budget", "recent", "seed", "device", "dtype")}, "metrics": m})
        for task, r in m["tasks"].items():
            rows.append({**{k: m.get(k) for k in LM_EVAL_COLUMNS}, **{k: r.get(k) for k in LM_EVAL_COLUMNS
                                                                      if k in r},
                         "task": task, "dtype": cfg["dtype"], "run": run,
                         **_lm_eval_provenance(cfg, m)})
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=LM_EVAL_COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "fewshot.csv", buf.getvalue())
    atomic_write_text(out / "fewshot.json", json.dumps(points, indent=1, sort_keys=True, default=str) + "\n")
    return rows


REPLACED_COLS = ["when", "point", "action", "source", *(f"{w}_{c}" for w in ("old", "new") for c in (
    "code_version", "git_commit", "device", "dtype", "batch_size", "provenance", "committed_in", "n_done"))]


def _prov(row: pd.Series | None, col: str) -> object:
    if row is None or col not in row.index or pd.isna(row[col]):
        return ""
    return row[col]


TEXT_COLUMNS = {"id": str, "point": str, "prediction": str}  # read as text: answers may all look like numbers


def _csv_text(df: pd.DataFrame) -> str:
    """``df`` as its CSV text after a write/read round trip (types as a curated file holds them), with its
    all-empty columns dropped and the others sorted: a curated file holds the union of every point's
    columns in its own order, so only the values a point has are compared."""
    df = pd.read_csv(io.StringIO(df.to_csv(index=False)), dtype=TEXT_COLUMNS).dropna(axis=1, how="all")
    for c in df.columns:  # 5 and 5.0 are one value (a column with empty cells elsewhere reads as float)
        v = df[c].dropna()
        if pd.api.types.is_float_dtype(df[c]) and (v % 1 == 0).all() and (v.abs() < 2**53).all():
            df[c] = df[c].astype("Int64")
    return df[sorted(df.columns)].to_csv(index=False)


def _unchanged(name: str, p_old: pd.DataFrame, s_old: pd.DataFrame, points: pd.DataFrame,
               samples: pd.DataFrame) -> bool:
    """Whether the collected point ``name`` holds exactly the rows ``out`` has (points and samples)."""
    return all(_csv_text(a[a["point"] == name].reset_index(drop=True))
               == _csv_text(b[b["point"] == name].reset_index(drop=True))
               for a, b in ((p_old, points), (s_old, samples)))


LOCK_NAME = ".collect.lock"  # in the destination folder: concurrent collects into it take turns
LOCK_WAIT_S = 900.0  # how long a collect waits for another one writing the same destination


@contextlib.contextmanager
def destination(out: Path) -> Iterator[None]:
    """Hold the curated folder ``out`` (made if absent) for a read-merge-write: collects into one folder
    (a job array's epilogues) take turns instead of losing each other's points."""
    from filelock import FileLock, Timeout

    out.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(out / LOCK_NAME), timeout=LOCK_WAIT_S):
            yield
    except Timeout:
        raise CollectBusy(f"error: {out} is being written by another keyformer-collect for over "
                          f"{LOCK_WAIT_S:.0f} s (lock {out / LOCK_NAME}); nothing was written") from None


class CollectBusy(RuntimeError):
    """Another collect held the destination for longer than :data:`LOCK_WAIT_S`."""


def write_csv(df: pd.DataFrame, path: Path) -> None:
    """``df`` to ``path`` atomically (temporary file + rename): a reader never sees half a file."""
    from keyformer.run.results import atomic_write_text

    atomic_write_text(path, df.to_csv(index=False))


def replace_points(points: pd.DataFrame, samples: pd.DataFrame, out: Path, source: str) -> list[dict]:
    """:func:`merge_points` into ``out`` while holding it (:func:`destination`)."""
    with destination(out):
        return merge_points(points, samples, out, source)


def merge_points(points: pd.DataFrame, samples: pd.DataFrame, out: Path, source: str) -> list[dict]:
    """Merge ``points``/``samples`` into the curated folder ``out``: same-named points are replaced (in place,
    keeping the order of ``out``), new ones appended, the others kept. Appends one row per replaced or added
    point to ``out/replaced.csv`` (old and new provenance) and returns those rows; a point collected with
    exactly the rows ``out`` holds is left out of the log (nothing changed)."""
    p_old = pd.read_csv(out / "points.csv") if (out / "points.csv").is_file() else pd.DataFrame({"point": []})
    s_old = (pd.read_csv(out / "samples.csv", dtype=TEXT_COLUMNS)
             if (out / "samples.csv").is_file()
             else pd.DataFrame({"point": [], "id": []}))
    names = list(points["point"])
    old_by_name = {r["point"]: r for _, r in p_old.iterrows()}
    order = list(p_old["point"]) + [n for n in names if n not in old_by_name]
    rank = {n: i for i, n in enumerate(order)}
    merged = pd.concat([p_old[~p_old["point"].isin(names)], points], ignore_index=True)
    merged_s = pd.concat([s_old[~s_old["point"].isin(names)], samples.astype({"id": str})], ignore_index=True)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    log = []
    for _, new in points.iterrows():
        old = old_by_name.get(new["point"])
        if old is not None and _unchanged(new["point"], p_old, s_old, points, samples):
            continue  # the same rows again (a re-collection of the same run folders): nothing to log
        entry = {"when": when, "point": new["point"], "action": "added" if old is None else "replaced",
                 "source": source}
        for c in ("code_version", "git_commit", "device", "dtype", "batch_size", "provenance", "committed_in",
                  "n_done"):
            entry[f"old_{c}"], entry[f"new_{c}"] = _prov(old, c), _prov(new, c)
        log.append(entry)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(merged_s.sort_values("point", key=lambda c: c.map(rank), kind="stable"), out / "samples.csv")
    write_csv(merged.sort_values("point", key=lambda c: c.map(rank)), out / "points.csv")
    path = out / "replaced.csv"
    first = not path.is_file()
    if first and not log:
        return log
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=REPLACED_COLS, lineterminator="\n")
    if first:
        w.writeheader()
    w.writerows(log)
    from keyformer.run.results import atomic_write_text

    atomic_write_text(path, ("" if first else path.read_text(encoding="utf-8")) + buf.getvalue())
    return log


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", help="sweep folder (hydra.sweep.dir of the experiment), or with --wandb the W&B "
                    "group (the sweep's name: name=, else the experiment, else the sweep folder's name; "
                    "docs/wandb.md)")
    ap.add_argument("out", type=Path, help="curated results folder, e.g. results/my_sweep")
    ap.add_argument("--wandb", metavar="ENTITY/PROJECT|DIR", help="read the runs of group SWEEP from W&B "
                    "instead of a local folder: ENTITY/PROJECT on the server, or a folder holding offline "
                    "runs (WANDB_MODE=offline, e.g. the sweep folder)")
    ap.add_argument("--replace", action="store_true", help="merge into OUT: the collected points replace its "
                    "same-named points, the others stay; logged to stdout and OUT/replaced.csv")
    ap.add_argument("--complete-only", action="store_true", help="collect only the points whose runs have "
                    "finished (complete = true); the unfinished ones are named and left out")
    ap.add_argument("--policies", metavar="P[,P...]", help="collect only the points of these policies (a "
                    "sweep that runs policy by policy: one policy's points land while the next one's run)")
    args = ap.parse_args(argv)
    if args.wandb:
        points, samples = collect_wandb(args.wandb, args.sweep)
        where = f"W&B {args.wandb}, group {args.sweep}"
    else:
        sweep = Path(args.sweep)
        if not sweep.is_dir():
            print(f"error: sweep folder {sweep} does not exist", file=sys.stderr)
            return 2
        if lm_eval_metrics(sweep):
            with destination(args.out):
                rows = collect_lm_eval(sweep, args.out)
            print(f"{len(rows)} rows (run x lm-eval task) -> {args.out / 'fewshot.csv'}")
            return 0
        points, samples = collect(sweep)
        where = str(sweep)
    if args.policies and not points.empty:
        wanted = [x.strip() for x in args.policies.split(",") if x.strip()]
        have = sorted(set(points["policy"]))
        unknown = [x for x in wanted if x not in have]
        if unknown:
            print(f"error: --policies {', '.join(unknown)}: no such policy among the points in {where}; they "
                  f"hold {', '.join(have)}", file=sys.stderr)
            return 2
        points = points[points["policy"].isin(wanted)].reset_index(drop=True)
        samples = samples[samples["point"].isin(points["point"])].reset_index(drop=True)
    if args.complete_only and not points.empty:
        partial = sorted(points.loc[~points["complete"].astype(bool), "point"])
        if partial:
            print(f"left out {len(partial)} unfinished point(s) (--complete-only): {', '.join(partial[:5])}"
                  f"{', ...' if len(partial) > 5 else ''}")
            points = points[~points["point"].isin(partial)].reset_index(drop=True)
            samples = samples[~samples["point"].isin(partial)].reset_index(drop=True)
    if points.empty:
        print(f"error: no {'finished ' if args.complete_only else ''}runs with predictions in {where}",
              file=sys.stderr)
        return 1
    try:
        return _write(args, points, samples, where)
    except CollectBusy as e:
        print(e, file=sys.stderr)
        return 2


def _write(args: argparse.Namespace, points: pd.DataFrame, samples: pd.DataFrame, where: str) -> int:
    """Write the collected points into ``args.out`` (merged with ``--replace``), holding the folder."""
    if args.replace:
        log = replace_points(points, samples, args.out, where)
        for e in log:
            print(f"{args.out}: {e['action']} {e['point']} (old: {e['old_provenance'] or '-'} "
                  f"{e['old_git_commit'] or '?'} {e['old_device'] or '?'}; new: {e['new_provenance']} "
                  f"{e['new_git_commit'] or '?'} {e['new_device'] or '?'}) <- {where}")
        unchanged = len(points) - len(log)
        print(f"log: {args.out / 'replaced.csv'}" if log else f"{args.out}: nothing changed", end="")
        print(f" ({unchanged} point(s) collected unchanged)" if unchanged else "")
        return 0
    with destination(args.out):
        return _rewrite(args, points, samples, where)


def _rewrite(args: argparse.Namespace, points: pd.DataFrame, samples: pd.DataFrame, where: str) -> int:
    old = args.out / "points.csv"
    dropped = sorted(set(pd.read_csv(old)["point"]) - set(points["point"])) if old.exists() else []
    if dropped:  # overwriting would silently lose committed points the sweep folder no longer holds
        print(f"error: {old} has {len(dropped)} point(s) that {where} does not: {', '.join(dropped[:5])}"
              f"{', ...' if len(dropped) > 5 else ''}; rewriting would drop them. Use --replace to merge "
              f"(the collected points replace theirs, the others stay), or remove {old} first",
              file=sys.stderr)
        return 2
    write_csv(samples.sort_values(["point", "id"]), args.out / "samples.csv")
    write_csv(points.sort_values(["policy", "budget", "point"]), args.out / "points.csv")
    done = int(points["complete"].sum())
    print(f"{len(points)} points ({done} complete), {len(samples)} samples -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
