"""Run the few-shot sweep of ``config.yaml`` point by point (resumable), then collect the curated results.

    nice -n 10 .venv/bin/python experiments/fewshot/sweep.py [--config experiments/fewshot/config.yaml]
    (start it N times for N parallel workers: each point is claimed with a lock file)
    .venv/bin/python experiments/fewshot/sweep.py --collect-only

Every point is one ``task=lm_eval`` job (as ``python run.py <overrides> <point>``) with its own
``output_dir`` under ``output_root``; complete folders are skipped. After each point, the complete ones
are collected into ``<results>/fewshot.csv`` (one row per point and task) and ``fewshot.json`` (each
point's config and metrics).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from keyformer.results import atomic_write_text  # noqa: E402

COLUMNS = ("model", "task", "policy", "budget", "recent", "loglikelihood", "num_fewshot", "limit", "n_samples",
           "acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "dtype", "batch_size", "seed", "wall_s", "git_commit",
           "run")


def point_config(overrides: list[str], point: list[str], output_root: Path) -> dict[str, Any]:
    """The resolved run config of one point, with ``output_dir`` named after the point."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    name = "_".join(p.split("=", 1)[1] for p in point if "=" in p)
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=[*overrides, *point, f"output_dir={output_root / name}"])
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def collect(output_root: Path, results: Path) -> list[dict[str, Any]]:
    """Curated rows of every complete run under ``output_root``; writes fewshot.csv and fewshot.json."""
    from omegaconf import OmegaConf

    rows, points = [], []
    for m_path in sorted(output_root.glob("**/metrics.json")):
        m = json.loads(m_path.read_text())
        if not m.get("complete") or m.get("task") != "lm_eval":
            continue
        cfg = OmegaConf.to_container(OmegaConf.load(m_path.parent / "config.yaml"))
        run = str(m_path.parent.relative_to(output_root))
        points.append({"run": run, "config": {k: cfg[k] for k in (
            "model", "policy", "task", "budget", "recent", "seed", "device", "dtype")}, "metrics": m})
        for task, r in m["tasks"].items():
            rows.append({**{k: m.get(k) for k in COLUMNS}, **{k: r.get(k) for k in COLUMNS if k in r},
                         "task": task, "dtype": cfg["dtype"], "run": run})
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(results / "fewshot.csv", buf.getvalue())  # workers may collect concurrently
    atomic_write_text(results / "fewshot.json", json.dumps(points, indent=1, sort_keys=True, default=str) + "\n")
    return rows


def claim(out: Path) -> bool:
    """Take ``out/.sweep.lock`` for this process; False when a live process holds it (parallel workers)."""
    out.mkdir(parents=True, exist_ok=True)
    lock = out / ".sweep.lock"
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            os.kill(int(lock.read_text() or 0), 0)
            return False
        except (ValueError, ProcessLookupError):
            lock.unlink(missing_ok=True)  # stale: its worker died
            return claim(out)
        except PermissionError:
            return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(Path(__file__).with_name("config.yaml")))
    ap.add_argument("--collect-only", action="store_true")
    args = ap.parse_args(argv)
    from omegaconf import OmegaConf

    exp = OmegaConf.to_container(OmegaConf.load(args.config))
    output_root, results = ROOT / exp["output_root"], ROOT / exp["results"]
    collect_root = ROOT / exp.get("collect_root", exp["output_root"])
    if not args.collect_only:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        import torch

        torch.set_num_threads(1)
        from keyformer.lmeval.job import run_lm_eval, validate_lm_eval
        from keyformer.results import ResultsDir

        for point in exp["points"]:
            cfg = point_config(list(exp["overrides"]), list(point), output_root)
            validate_lm_eval(cfg)
            out = Path(cfg["output_dir"])
            if ResultsDir(out).is_complete():
                continue
            if not claim(out):
                print(f"[fewshot] {' '.join(point)}: another worker is running it, next", flush=True)
                continue
            print(f"[fewshot] {' '.join(point)} -> {out}", flush=True)
            try:
                run_lm_eval(cfg)
            finally:
                (out / ".sweep.lock").unlink(missing_ok=True)
            collect(collect_root, results)
    rows = collect(collect_root, results)
    print(f"[fewshot] {len(rows)} rows in {results / 'fewshot.csv'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
