"""Speed A/B against another commit (``keyformer-bench --against REV``): is a difference resolved?

Method (also written into the outputs):

* **Two trees.** ``A`` is ``REV``, checked out with ``git worktree add --detach`` under ``--tmp`` (removed
  afterwards unless ``--keep``); ``B`` is this checkout (its commit and whether it had uncommitted changes
  are recorded), or ``--candidate REV2`` checked out the same way (then edits to this checkout during the
  run cannot leak into it). Both are timed by the same harness, :mod:`keyformer.lab.bench.ab_worker`, copied
  out of this checkout and run with ``PYTHONPATH`` set to the tree under test.
* **Interleaved, fresh processes.** Every round runs one process per side, in the order AB, BA, AB, ...
  (alternated, so a drift in machine load over a round does not favour one side). Each process loads the
  model, warms up, and times every configuration once (:mod:`.ab_worker`).
* **Statistics per metric** (each configuration's ``prefill_s``, ``decode_ms`` and the within-process ratios
  ``prefill_vs_full``, ``decode_vs_window``): the median and min-max of each side over rounds, and the paired
  per-round log ratio ``d = log(B / A)`` (the two processes of a round ran back to back). ``B/A`` is
  ``exp(median d)``; its confidence interval is the distribution-free sign-test interval for the median of
  ``d`` (order statistics; exact coverage for any continuous distribution, no normality assumed).
  **Resolved** means that interval excludes ``B/A = 1``; with too few rounds for the requested confidence
  (6 for 95%), nothing is resolved.
* **Family-wise.** One run tests many metrics, so a per-metric verdict at 95 % resolves something by chance
  alone in most runs. The ``family-wise`` column holds simultaneous intervals: each metric's sign-test
  interval at confidence ``1 - (1 - confidence) / m`` (Bonferroni), ``m`` the number of metrics in the run
  whose per-round ratios are not all exactly 1 (a ratio of a configuration to itself is not a test).
  A family-wise verdict is one that holds for the run as a whole: the chance that any of the ``m`` is
  resolved when nothing differs is at most ``1 - confidence``. It needs more rounds (10 for up to 19
  metrics at 95 %).
* **Load.** The 1-minute load average before and after every process is recorded; a busy machine widens the
  intervals, it does not bias them towards either side.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_OUT = "outputs/bench_ab"
DEFAULT_POLICIES = "window,h2o,keyformer,snapkv,rkv"
# metrics where a larger value is slower (all of them: times and time ratios)
METRICS = ("prefill_s", "decode_ms", "prefill_vs_full", "decode_vs_window")


# ---------------------------------------------------------------------------------------------------------
# Statistics


def binom_cdf(k: int, n: int) -> float:
    """P(X <= k) for X ~ Binomial(n, 1/2)."""
    if k < 0:
        return 0.0
    return sum(math.comb(n, i) for i in range(min(k, n) + 1)) / 2.0 ** n


def sign_ci_rank(n: int, confidence: float) -> tuple[int, float] | None:
    """(r, coverage): the interval ``[x_(r), x_(n+1-r)]`` (1-based order statistics) of the median with the
    narrowest width whose coverage ``1 - 2 P(X <= r - 1)``, X ~ Bin(n, 1/2), is at least ``confidence``;
    None when even ``r = 1`` does not reach it (too few samples)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1)")
    best = None
    for r in range(1, n // 2 + 1):
        cov = 1.0 - 2.0 * binom_cdf(r - 1, n)
        if cov >= confidence:
            best = (r, cov)
        else:
            break
    return best


@dataclass
class Comparison:
    """One metric compared between sides A (base) and B (candidate), paired by round."""

    n: int
    a_median: float
    a_min: float
    a_max: float
    b_median: float
    b_min: float
    b_max: float
    ratio: float  # exp(median of log(B/A)): B relative to A
    ci_low: float  # bounds of the ratio's interval (nan when too few rounds)
    ci_high: float
    coverage: float  # the interval's exact coverage (nan when too few rounds)
    verdict: str  # "B slower" | "B faster" | "unresolved" | "too few rounds"


def _interval(d: Sequence[float], confidence: float) -> tuple[float, float, float, str]:
    """(low, high, coverage, verdict) of the ratio from the sorted log ratios ``d``."""
    n = len(d)
    rank = sign_ci_rank(n, confidence)
    if rank is None:
        return float("nan"), float("nan"), float("nan"), "too few rounds"
    r, cov = rank
    lo, hi = math.exp(d[r - 1]), math.exp(d[n - r])
    return lo, hi, cov, "B slower" if lo > 1.0 else "B faster" if hi < 1.0 else "unresolved"


def log_ratios(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """The sorted per-round ``log(B / A)`` (same rounds, positive values)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"need the same positive number of rounds on both sides, got {len(a)} and {len(b)}")
    if min(a) <= 0 or min(b) <= 0:
        raise ValueError("values must be > 0 (times or time ratios)")
    return sorted(math.log(y / x) for x, y in zip(a, b, strict=True))


def compare(a: Sequence[float], b: Sequence[float], confidence: float = 0.95,
            d: Sequence[float] | None = None) -> Comparison:
    """Paired comparison of ``b`` against ``a`` (same rounds, positive values; larger = slower); ``d``:
    their :func:`log_ratios`, when the caller has them."""
    d = log_ratios(a, b) if d is None else d
    n = len(d)
    lo, hi, cov, verdict = _interval(d, confidence)
    return Comparison(n, statistics.median(a), min(a), max(a), statistics.median(b), min(b), max(b),
                      math.exp(statistics.median(d)), lo, hi, cov, verdict)


# ---------------------------------------------------------------------------------------------------------
# Trees and processes


def git(*args: str, cwd: str | Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def repo_root() -> Path:
    return Path(git("rev-parse", "--show-toplevel", cwd=Path(__file__).parent))


def checkout(rev: str, root: Path, tmp: Path) -> tuple[Path, str]:
    """A detached worktree of ``rev`` under ``tmp`` (reused when already there); (path, full sha)."""
    try:
        sha = git("rev-parse", "--verify", f"{rev}^{{commit}}", cwd=root)
    except subprocess.CalledProcessError:
        raise SystemExit(f"--against {rev!r} is not a commit of {root}") from None
    path = tmp / f"keyformer-{sha[:12]}"
    if not (path / "keyformer").is_dir():
        tmp.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--detach", str(path), sha, cwd=root)
    problem = checkout_problem(path, sha, root)
    if problem:
        raise SystemExit(f"error: {path} is reused for {rev!r} but {problem}; nothing was run. Remove it "
                         f"(git worktree remove --force {path}) or choose another --tmp")
    return path, sha


def checkout_problem(path: Path, sha: str, root: Path) -> str | None:
    """Why the worktree ``path`` is not a clean checkout of commit ``sha`` of this repository, owned by this
    user (what a reused ``--tmp`` folder must be before its code is run), or None."""
    if os.stat(path).st_uid != os.getuid():
        return f"it belongs to uid {os.stat(path).st_uid}, not this user"
    try:
        head = git("rev-parse", "HEAD", cwd=path)
        common = Path(git("rev-parse", "--git-common-dir", cwd=path))
        ours = Path(git("rev-parse", "--git-common-dir", cwd=root))
        dirty = git("status", "--porcelain", "--untracked-files=no", cwd=path)
    except (subprocess.CalledProcessError, OSError):
        return "it is not a git checkout"
    if (path / common).resolve() != (root / ours).resolve():
        return "it is a checkout of another repository"
    if head != sha:
        return f"its HEAD is {head[:12]}"
    if dirty:
        return f"it has local changes ({len(dirty.splitlines())} file(s))"
    return None


def remove_checkout(path: Path, root: Path) -> None:
    git("worktree", "remove", "--force", str(path), cwd=root)


def run_worker(worker: Path, tree: Path, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    spec = {**spec, "tree": str(tree)}
    p = subprocess.run([sys.executable, str(worker), json.dumps(spec)], cwd=tree, env=env,
                       capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"worker in {tree} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def side_order(rnd: int) -> tuple[str, str]:
    """AB in even rounds, BA in odd ones."""
    return ("A", "B") if rnd % 2 == 0 else ("B", "A")


def summarize(runs: dict[str, list[dict[str, Any]]], confidence: float) -> list[dict[str, Any]]:
    """One row per (configuration, metric) present in every run of both sides."""
    rows = []
    first = runs["A"][0]["metrics"]
    for conf in first:
        for metric in METRICS:
            try:
                a = [r["metrics"][conf][metric] for r in runs["A"]]
                b = [r["metrics"][conf][metric] for r in runs["B"]]
            except KeyError:
                continue
            if conf == "full" and metric == "prefill_vs_full":
                continue  # 1 by construction
            d = log_ratios(a, b)
            rows.append({"config": conf, "metric": metric, **compare(a, b, confidence, d).__dict__, "_d": d})
    tested = {id(r) for r in rows if any(x != 0.0 for x in r["_d"])}
    family = 1.0 - (1.0 - confidence) / max(len(tested), 1)
    for r in rows:
        d = r.pop("_d")
        if id(r) in tested:
            lo, hi, cov, verdict = _interval(d, family)
        else:
            lo, hi, cov, verdict = float("nan"), float("nan"), float("nan"), "not a test"
        r.update(family_size=len(tested), family_confidence=family, family_ci_low=lo, family_ci_high=hi,
                 family_coverage=cov, family_verdict=verdict)
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    head = (f"{'config':<10} {'metric':<17} {'n':>2} {'A median':>9} {'A min-max':>17} {'B median':>9} "
            f"{'B min-max':>17} {'B/A':>6} {'interval':>15}  {'verdict':<14} {'family-wise':>15}  "
            "family verdict")
    lines = [head]
    for r in rows:
        ci = "-" if math.isnan(r["ci_low"]) else f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
        fw = r.get("family_ci_low", float("nan"))
        fci = "-" if math.isnan(fw) else f"[{fw:.3f}, {r['family_ci_high']:.3f}]"
        lines.append(f"{r['config']:<10} {r['metric']:<17} {r['n']:>2} {r['a_median']:>9.4g} "
                     f"{r['a_min']:>8.4g}-{r['a_max']:<8.4g} {r['b_median']:>9.4g} "
                     f"{r['b_min']:>8.4g}-{r['b_max']:<8.4g} {r['ratio']:>6.3f} {ci:>15}  {r['verdict']:<14} "
                     f"{fci:>15}  {r.get('family_verdict', '-')}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# CLI


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="keyformer-bench --against REV", description=__doc__.split("\n\n")[0])
    p.add_argument("--against", required=True, help="the base commit A (any git revision)")
    p.add_argument("--candidate", default=None, help="the candidate commit B (default: this checkout as it "
                                                     "is)")
    p.add_argument("--rounds", type=int, default=6, help="rounds (one process per side each; default 6)")
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--prompt-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--budget", type=float, default=0.5)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--rows", type=int, default=None, help="decode batch: the prompt forward's batch copied "
                   "row-wise to this many rows (a multiple of --batch; default --batch)")
    p.add_argument("--decode-rounds", type=int, default=1, help="timed decodes per configuration and process "
                   "(their median is reported; default 1)")
    p.add_argument("--policies", default=DEFAULT_POLICIES, help=f"besides full (default {DEFAULT_POLICIES})")
    p.add_argument("--model", default="smollm2", choices=("smollm2", "gemma3_270m", "tiny", "tiny_gemma3"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--prompt", default="cnn_dailymail", choices=("cnn_dailymail", "random"))
    p.add_argument("--data-dir", default=None, help="folder of cnn_dailymail.jsonl (default "
                                                    "$KEYFORMER_DATA_DIR)")
    p.add_argument("--warmup-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per process")
    p.add_argument("--tmp", default="/tmp/keyformer-ab", help="where the base commit is checked out")
    p.add_argument("--keep", action="store_true", help="keep the base commit's worktree")
    p.add_argument("--rotate-order", action="store_true", help="rotate the policies' order by one place "
                   "per round (the same order on both sides of a round), so no policy always runs first "
                   "after full")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier A/B's files in --out")
    return p


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    args = parser().parse_args(argv)
    for key in ("rounds", "prompt_len", "batch", "new_tokens", "warmup_len"):
        if getattr(args, key) < 1:
            raise SystemExit(f"--{key.replace('_', '-')}={getattr(args, key)} must be >= 1")
    if not 0.0 < args.budget <= 1.0:
        raise SystemExit(f"--budget={args.budget} must be a fraction in (0, 1]")
    if args.rows is not None and (args.rows < args.batch or args.rows % args.batch):
        raise SystemExit(f"--rows={args.rows} must be a multiple of --batch={args.batch}")
    if args.decode_rounds < 1:
        raise SystemExit(f"--decode-rounds={args.decode_rounds} must be >= 1")
    if not 0.0 < args.confidence < 1.0:
        raise SystemExit(f"--confidence={args.confidence} must be in (0, 1)")
    done = [f for f in ("ab.json", "ab.txt") if (Path(args.out) / f).exists()]
    if done and not args.overwrite:
        raise SystemExit(f"--out={args.out} holds an earlier A/B ({', '.join(done)}); valid: another --out "
                         "folder, or --overwrite to replace it")
    args.data_dir = args.data_dir or os.environ.get("KEYFORMER_DATA_DIR")
    return args


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    root = repo_root()
    a_tree, a_sha = checkout(args.against, root, Path(args.tmp))
    if args.candidate:
        b_tree, b_sha = checkout(args.candidate, root, Path(args.tmp))
        dirty = False
    else:
        b_tree, b_sha = root, git("rev-parse", "HEAD", cwd=root)
        dirty = bool(git("status", "--porcelain", "--untracked-files=no", cwd=root))
    worker = Path(args.tmp) / f"ab_worker_{os.getpid()}.py"
    shutil.copyfile(Path(__file__).with_name("ab_worker.py"), worker)
    spec = {"model": args.model, "dtype": args.dtype, "prompt": args.prompt, "data_dir": args.data_dir,
            "prompt_len": args.prompt_len, "batch": args.batch, "budget": args.budget,
            "new_tokens": args.new_tokens, "policies": [p for p in args.policies.split(",") if p],
            "warmup_len": args.warmup_len, "threads": args.threads, "seed": args.seed,
            "rows": args.rows, "decode_rounds": args.decode_rounds, "rotate": args.rotate_order}
    trees = {"A": a_tree, "B": b_tree}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run still removes its worktrees
    runs: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
    t0 = time.time()
    log(f"[ab] A = {a_sha[:12]} ({a_tree}); B = {b_sha[:12]}{' + uncommitted changes' if dirty else ''} "
        f"({b_tree}); {args.rounds} rounds")
    try:
        for rnd in range(args.rounds):
            for side in side_order(rnd):
                before = os.getloadavg()[0]
                r = run_worker(worker, trees[side], {**spec, "round": rnd}, args.timeout)
                r["load_before"], r["load_after"], r["round"] = before, os.getloadavg()[0], rnd
                runs[side].append(r)
                log(f"[ab] round {rnd + 1} {side}: {r['seconds']:.0f} s, load {before:.2f}->"
                    f"{r['load_after']:.2f}; " + ", ".join(
                        f"{c} {m['prefill_s']:.2f}s/{m['decode_ms']:.1f}ms" for c, m in r["metrics"].items()))
    finally:
        worker.unlink(missing_ok=True)
        if not args.keep:
            for tree in {a_tree, b_tree} - {root}:
                remove_checkout(tree, root)
    rows = summarize(runs, args.confidence)
    loads = [x for side in runs.values() for r in side for x in (r["load_before"], r["load_after"])]
    report = {"method": __doc__, "command": "keyformer-bench " + " ".join(sys.argv[1:]),
              "A": a_sha, "B": b_sha, "B_uncommitted_changes": dirty, "spec": spec,
              "confidence": args.confidence, "rows": rows, "runs": runs,
              "load_1min": {"min": min(loads), "max": max(loads)}, "elapsed_s": time.time() - t0,
              "cpu": _cpu(), "nproc": os.cpu_count()}
    text = "\n".join([
        f"A/B: A = {a_sha[:12]}, B = {b_sha[:12]}{' + uncommitted changes' if dirty else ''}; "
        f"{args.model} {args.dtype}, L={args.prompt_len} B={args.batch} budget={args.budget} "
        f"new_tokens={args.new_tokens}"
        f"{f' decode rows={args.rows}' if args.rows and args.rows != args.batch else ''}"
        f"{f' decode_rounds={args.decode_rounds}' if args.decode_rounds > 1 else ''}"
        f"{f' threads={args.threads}' if args.threads else ''}"
        f"{'; policy order rotated per round' if args.rotate_order else ''}; {args.rounds} rounds "
        "(AB/BA alternating, "
        "fresh processes); "
        f"{_cpu()}, {os.cpu_count()} cores; 1-min load {min(loads):.2f}-{max(loads):.2f}",
        f"B/A = exp(median per-round log ratio); interval: sign-test {args.confidence:.0%} (exact coverage "
        "given); resolved when it excludes 1"
        + (f"; family-wise: simultaneous over the {rows[0]['family_size']} tested metrics (Bonferroni, "
           f"{rows[0]['family_confidence']:.4f} each)" if rows else ""),
        "", format_rows(rows), "", f"elapsed {report['elapsed_s']:.0f} s"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ab.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "ab.txt").write_text(text + "\n")
    log("\n" + text)
    return report


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown cpu"


def main(argv: Sequence[str] | None = None) -> None:
    """``keyformer-bench --against REV [options]``."""
    run(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
