"""Report sections: markdown tables from curated results (paired bootstrap CIs), for pages and READMEs.

    keyformer-report                    # every section whose results exist under ./results
    keyformer-report --results DIR      # another curated results folder (or one keyformer-collect folder)
    keyformer-report --list             # the section names
    keyformer-report --section SECTION --section provenance   # --list names them
    keyformer-report --pages            # write each study's findings.json and page, and results/README.md
    keyformer-report --check-pages      # exit 1 naming each page or findings.json that differs from the data
    keyformer-report --update-readme    # rewrite the marked tables of the READMEs and docs/
    keyformer-report --check-readme     # exit 1 naming each marked table that differs from the data

The library's sections are generic (the demo, provenance, the benchmarks); each registered study
(:mod:`keyformer.lab.studies`) adds its own in its ``findings.py``. A README or doc quotes a section between
``<!-- keyformer-report:NAME -->`` and ``<!-- /keyformer-report:NAME -->``; a results page is rendered whole
from its study's ``page.md`` (:mod:`keyformer.lab.pages`). Superseded runs live in ``results/archive/``.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from keyformer.lab import studies


def fmt_ci(m: float, lo: float, hi: float) -> str:
    return f"{m:+.2f} [{lo:+.2f}, {hi:+.2f}]"


def demo(res: Path, name: str = "demo") -> None:
    """The default run (``python run.py``: SmolLM2, the ``sample`` retrieval task) under each policy, from
    ``results/demo/`` (collected from ``python run.py -m policy=full,keyformer,h2o,window``); nothing if
    absent."""
    f = res / name / "points.csv"
    if not f.exists():
        return
    p = pd.read_csv(f)
    order = {"full": 0, "keyformer": 1, "h2o": 2, "window": 3}
    p = p.sort_values("policy", key=lambda c: c.map(lambda x: order.get(x, 9)))
    unknown = ["?"] * len(p)
    where = ", ".join(sorted({f"{d} {t}" for d, t in zip(p.get("device", unknown), p.get("dtype", unknown),
                                                           strict=True)}))
    commits = sorted({str(c)[:7] for c in p.get("git_commit", pd.Series(dtype=object)).dropna()})
    print(f"\n### {name}: the default run per policy ({int(p['n_done'].max())} samples; {where}"
          + (f"; git {', '.join(commits)}" if commits else "") + ")\n")
    print("| command | accuracy % | ROUGE-2 | ROUGE-L |\n|---|---|---|---|")
    for _, r in p.iterrows():
        cmd = "python run.py" + ("" if r["policy"] == "keyformer" else f" policy={r['policy']}")
        what = f" (Keyformer, budget {r['budget']:g})" if r["policy"] == "keyformer" else ""
        print(f"| `{cmd}`{what} | {r['accuracy']:.1f} | {r['rouge2']:.1f} | {r['rougeL']:.1f} |")


def methods(res: Path) -> None:
    """The registry in two lines for the README: every method and every wrapper by name, each with its
    family (``docs/methods.md`` has the full table)."""
    from keyformer.core.policies import POLICIES, WRAPPERS

    def names(reg: dict) -> str:
        return ", ".join(f"`{n}` ({reg[n].family or 'baseline'})" for n in sorted(reg))

    print(f"- {len(POLICIES)} methods: {names(POLICIES)}.")
    print(f"- {len(WRAPPERS)} wrappers (`policy.wrap=[...]`, over any method that accepts them): "
          f"{names(WRAPPERS)}.")


def brief(res: Path) -> None:
    """The headline lines the top-level README quotes: each study's one-line answer, rendered from its
    committed ``findings.json``, with a link to its page."""
    lines = [f"* [Experiment {s.TITLE}](results/{studies.results_folder(s)}/README.md): {a}"
             for s, a in studies.answers(res) if a]
    if lines:
        print("\n".join(lines))


def bench_targets(res: Path, name: str = "bench") -> None:
    """The performance targets and whether the committed benchmark met each (its ``table.txt`` verdict)."""
    f = res / name / "table.txt"
    if not f.exists():
        return
    text = f.read_text(encoding="utf-8")
    head = text.splitlines()[0] if text else ""
    print(f"\n### {name}: targets, as judged by the committed run (`{name}/table.txt`)\n\n{head}\n")
    print("| # | target | verdict | value |\n|---|---|---|---|")
    for m in re.finditer(r"^Target (\d+): (.*): (MET|NOT MET) \(value ([^)]*)\)$", text, re.M):
        print(f"| {m[1]} | {m[2]} | {m[3].lower()} | {m[4]} |")


def long_verdict(row: dict) -> str:
    """Issue 23's CPU target for one long-benchmark row: >= 90 % of the bytes model's equal-memory gain, or,
    where the measured compute floor bounds the policy's step (floor ms > bytes-model ms), >= 90 % of the
    bound max(bytes model, floor)."""
    share, bound = row.get("share_of_bytes_model"), row.get("share_of_bound")
    if share is None:
        return "-"
    if share >= 0.9:
        return "met (bytes model)"
    if row.get("compute_bound") and bound is not None and bound >= 0.9:
        return "met (compute floor)"
    return "not met"


def _f2(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f} %"


def long_row_sessions(folder: Path, default_commit: str) -> dict[str, str]:
    """Config label (``full``, ``h2o@256``) -> ``"MM-DD HH:MM commit"``: when its first timed round finished
    (UTC) and the commit of the session that measured it, read from the run's ``journal.jsonl`` (each session
    journals its commit before its measurements; older journals have none: ``default_commit``). Empty without
    a journal."""
    f, out, commit = folder / "journal.jsonl", {}, default_commit
    if not f.exists():
        return out
    for line in f.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a last line cut short by a kill
            continue
        key = rec.get("key", "")
        if key.startswith("session/"):
            commit = str(rec["value"]["git_commit"])
        elif key.startswith("run/"):
            t = datetime.strptime(rec["time"], "%Y-%m-%dT%H:%M:%S%z").astimezone(timezone.utc)
            out.setdefault(key.split("/")[2], f"{t:%m-%d %H:%M} {commit[:7]}")
    return out


def bench_long(res: Path, name: str = "bench/long") -> None:
    """The long-generation benchmark at a fixed KV memory budget (``keyformer-bench --long``), one row per
    setting and configuration from each ``<setting>/long.json``, with issue 23's CPU verdict per row and,
    where the setting's journal is there, when and at which commit each row was measured (a resumed run mixes
    sessions)."""
    files = sorted((res / name).glob("*/long.json"))
    runs = [json.loads(f.read_text(encoding="utf-8")) for f in files]
    if not runs:
        return
    for f, r in zip(files, runs, strict=True):
        r["_measured"] = long_row_sessions(f.parent, str(r["environment"]["git_commit"]))
    runs.sort(key=lambda r: (r["settings"][0]["prompt_len"], r["settings"][0]["new_tokens"]))
    def git(r: dict) -> str:  # the commits of every session of a resumed run (sorted)
        env = r["environment"]
        return "+".join(str(c)[:7] for c in env.get("sessions_commits") or [env["git_commit"]])

    envs = {(git(r), r["environment"]["cpu"], r["environment"]["threads"]) for r in runs}
    prov = "; ".join(f"git {c}, {cpu}, {t} threads" for c, cpu, t in sorted(envs))
    mixed = len({c for c, _, _ in envs}) > 1  # settings run at different commits: each row names its own
    budgets = sorted({round(r["kv_memory_budget_bytes"] / 2**20, 2) for r in runs})
    print(f"\n### {name}: long generations at a fixed KV memory budget ({prov}; fp32; "
          f"K/V budget {', '.join(f'{b:.0f}' for b in budgets)} MiB)\n")
    print("| setting | config | batch | decode tok/s | gain | bytes model | share | compute-floor bound | "
          "share of bound | e2e gain | agree | K/V MiB | rounds | CPU target | measured (UTC, git) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        for row in r["rows"]:
            cfg = row["policy"] + (f"@{row['budget']:g}" if row["budget"] is not None else "")
            ag = (row.get("agreement") or {}).get("match")
            kv = row.get("peak_kv_bytes")
            measured = r["_measured"].get(cfg)
            at = f" (git {git(r)})" if mixed and not measured else ""
            print(f"| {row['setting']}{'' if r.get('complete', True) else ' (partial)'}{at} | {cfg} | "
                  f"{row['batch']}{'*' if row.get('batch_capped') else ''} | "
                  f"{row['decode_tok_s']['median']:.1f} | {_f2(row.get('decode_gain'))}x | "
                  f"{_f2(row.get('bytes_model_gain'))}x | {_pct(row.get('share_of_bytes_model'))} | "
                  f"{_f2(row.get('bound_gain'))}x | {_pct(row.get('share_of_bound'))} | "
                  f"{_f2(row.get('e2e_gain'))}x | {_f2(ag)} | {'-' if kv is None else f'{kv / 2**20:.0f}'} | "
                  f"{row['decode_tok_s']['n']} | {long_verdict(row) if row['policy'] != 'full' else '-'} | "
                  f"{measured or '-'} |")
    bw = ", ".join(f"{r['settings'][0]['prompt_len']}+{r['settings'][0]['new_tokens']}: "
                   f"{r['bandwidth']['read_gbs']:.1f}" for r in runs)
    print("\nbatch: the largest that fits the K/V budget, measured (`*`: capped by `--max-batch`); gain: "
          "decode tok/s vs full at its own largest batch; share: gain / the bytes model's; compute-floor "
          "bound: the gain if each step took max(bytes model, a measured step over an 8-token cache); agree: "
          "token agreement with full; CPU target (issue 23): share >= 90 %, or share of bound >= 90 % where "
          "the floor bounds the step; measured: when the row's first timed round finished and the commit of "
          "the session that ran it (from the setting's journal; rows measured in different sessions were "
          f"timed hours or days apart). Read bandwidth (GB/s) per setting: {bw}.")
    for r in runs:
        bm = r.get("beams")
        if bm:
            parts = ", ".join(f"{b['policy']} {b['prefill_speedup']:.2f}x"
                              f"{'' if b['same_sequences'] else ' (sequences differ)'}" for b in bm["rows"])
            print(f"\nBeam search ({bm['num_beams']} beams, batch 1, {bm['prompt_len']}+{bm['new_tokens']}): "
                  f"prefill with the prompt run once per sample vs once per beam: {parts} faster.")


def _span(xs: list[float]) -> str:
    return f"{min(xs):.1f}x" if max(xs) - min(xs) < 0.05 else f"{min(xs):.1f}-{max(xs):.1f}x"


def speed(res: Path, name: str = "bench") -> None:
    """The speed story in two lines, from the bench data: decode tokens/s against full at equal K/V memory on
    CPU (``bench/long``), and batch-1 decode on GPU, eager and captured (the latest ``bench/gpu`` run)."""
    files = sorted((res / name / "long").glob("*/long.json"))
    runs = [json.loads(f.read_text(encoding="utf-8")) for f in files]
    rows = [row for r in runs for row in r["rows"] if row["policy"] != "full" and row.get("decode_gain")]
    if rows:
        gain = {p: [r["decode_gain"] for r in rows if r["policy"] == p]
                for p in ("keyformer", "h2o", "window")}
        full_b = sorted({row["batch"] for r in runs for row in r["rows"] if row["policy"] == "full"})
        other_b = sorted({r["batch"] for r in rows})
        env = runs[0]["environment"]
        mib = sorted({round(r["kv_memory_budget_bytes"] / 2**20) for r in runs})
        settings = ", ".join(f"{r['settings'][0]['prompt_len']}+{r['settings'][0]['new_tokens']}"
                             for r in runs)
        print(f"- **CPU, equal K/V memory** ({', '.join(map(str, mib))} MiB, {env['cpu']}, "
              f"{env['threads']} threads, fp32; {settings} tokens; `bench/long`): Keyformer decodes "
              f"{_span(gain['keyformer'])} full's tokens/s (H2O {_span(gain['h2o'])}, window "
              f"{_span(gain['window'])}): the memory a budget frees holds a larger batch (full: batch "
              f"{full_b[0]}-{full_b[-1]}; evicting: {other_b[0]}-{other_b[-1]}).")
    gpu = sorted(d for d in (res / name / "gpu").glob("20*") if (d / "latency" / "gpu_bench.json").is_file())
    if gpu:
        lat = json.loads((gpu[-1] / "latency" / "gpu_bench.json").read_text(encoding="utf-8"))
        m = lat["meta"]
        parts = []
        for g in (c for c in lat["cells"] if c.get("kind") == "graphs" and "keyformer" in c["runs"]):
            full, kf = g["runs"]["full"], g["runs"]["keyformer"]
            full_cap = full["captured"]["captured_steps"] > 0
            eager = full["eager"]["ms_per_step"] / kf["eager"]["ms_per_step"]
            cap = ((full["captured"] if full_cap else full["eager"])["ms_per_step"]
                   / kf["captured"]["ms_per_step"])
            parts.append(f"{g['model']} {eager:.2f}x eager, {cap:.2f}x captured")
        git = re.search(r" git (\w+)", (gpu[-1] / "log.txt").read_text(encoding="utf-8"))
        baseline = ("against a captured full cache" if (gpu[-1] / "static").is_dir()
                    else "against an eager full cache: no captured full baseline has run, so the captured "
                         "gain is the capture's and eviction's together")
        print(f"- **GPU, batch 1** ({m['device_name']}, {m['dtype'].replace('torch.', '')}, {gpu[-1].name}, "
              f"git {git[1] if git else '?'}; Keyformer@{m['budget']:g} at 4k, decode speed over full's; "
              f"`bench/gpu`): {'; '.join(parts)} ({baseline}).")


def bench_floors(res: Path, name: str = "bench/floors") -> None:
    """What stops each unmet CPU target, as ``keyformer-bench --floors`` measured it (``floors.json``)."""
    f = res / name / "floors.json"
    if not f.exists():
        return
    from keyformer.lab.bench.floors import rounds_label

    r = json.loads(f.read_text(encoding="utf-8"))
    env, pf = r["environment"], r["prefill"]["floors"]
    print(f"\n### What stops each unmet target, measured (`{name}/floors.txt`: git "
          f"{str(env['git_commit'])[:7]}, {env['cpu']}, {env['threads']} threads, "
          f"{rounds_label(r['args'])}, medians)\n")
    print("| target | measured | the floor under it |\n|---|---|---|")
    c = pf["components_x_full"]
    print(f"| 2: prefill at {r['prefill']['prompt_len']} tokens vs full | H2O {pf['h2o']['x_full']:.2f}x, "
          f"Keyformer {pf['keyformer']['x_full']:.2f}x | over full's prefill: materialised probabilities + "
          f"column sums {c['scores']:+.2f}, Gumbel temperature softmax {c['gumbel']:+.2f}, hash noise "
          f"{c['noise']:+.2f}; Keyformer without noise {pf['keyformer']['x_full_without_noise']:.2f}x |")
    for d in r["decode"]:
        fl = d["floors"]
        o, kf, sh = fl["overhead"], fl["overhead"]["keyformer"], fl["share_of_bytes"]
        print(f"| 1: decode {fl['point']} vs window | H2O {o['h2o']['x_window']:.3f}x, Keyformer "
              f"{kf['x_window']:.3f}x | over window's {fl['window_ms']:.1f} ms: scores "
              f"{kf['scores_ms']:+.1f} ms, Gumbel softmax {kf['gumbel_ms']:+.1f} ms, noise "
              f"{kf['noise_ms']:+.1f} ms |")
        print(f"| 3: decode {fl['point']}, share of the bytes model | Keyformer "
              f"{100 * sh['keyformer']:.0f} %, H2O {100 * sh['h2o']:.0f} %, window "
              f"{100 * sh['window']:.0f} % | compute floor {fl['floor_ms']:.1f} ms = "
              f"{100 * fl['floor_share_of_full']:.0f} % of full's "
              f"{fl['full_ms']:.1f} ms step: an evicted step can reach {fl['bound_speedup']:.3f}x vs the "
              f"bytes model's {fl['bytes_speedup']:.3f}x, at most {100 * fl['max_share_of_bytes']:.0f} % |")
    e = r.get("e2e")
    if e:
        pp = e["policy_parts"]
        print(f"| 5: end to end at equal KV memory ({e['setting']}, {e['policy']}) | {e['e2e_gain']:.3f}x "
              f"(decode alone {e['decode_gain']:.3f}x) | its prompt is {100 * pp['prefill_share']:.0f} % of "
              f"its time, at {e['policy_prefill_x_full_per_sample']:.2f}x full's per-sample prefill; at "
              f"full's rate the gain would be {e['e2e_gain_if_prefill_at_full_rate']:.3f}x (from "
              f"`{str(e['commit'])[:7]}`'s run) |")


PROVENANCE = ("device", "dtype", "batch_size", "git_commit", "code_version", "provenance")


def provenance(res: Path) -> None:
    """Per results folder: how many points ran where (device, dtype, batch size) and how that is known
    (``run``: the run's own metrics.json; ``backfilled``: a committed note or log, see
    ``experiments/backfill_provenance.py``), and how many record their code (``git_commit``,
    ``code_version``)."""
    rows = []
    for path in sorted(res.glob("**/points.csv")):
        p = pd.read_csv(path)
        if not set(PROVENANCE) <= set(p.columns):
            rows.append(f"| {path.parent.relative_to(res)} | {len(p)} | no provenance columns | | | |")
            continue
        how = p["provenance"].fillna("").str.split(":").str[0].replace("", "unknown")
        for (dev, dt, bs), g in p.groupby([p["device"].fillna("?"), p["dtype"].fillna("?"),
                                           p["batch_size"].fillna(-1).astype(int)], sort=True):
            kinds = ", ".join(f"{k} {n}" for k, n in how[g.index].value_counts().sort_index().items())
            rows.append(f"| {path.parent.relative_to(res)} | {len(g)} | {dev} {dt}, batch "
                        f"{bs if bs > 0 else '?'} | "
                        f"{kinds} | {int(g['git_commit'].notna().sum())} | "
                        f"{int(g['code_version'].notna().sum())} |")
    print("\n### provenance: where each folder's points ran and how that is known\n")
    print("| folder | points | device, dtype, batch | provenance | with git_commit | with code_version |\n"
          "|---|---|---|---|---|---|")
    print("\n".join(rows))


_FRESH: dict[str, dict] = {}  # results folder -> the findings document a page is being rendered with


def findings_of(res: Path, folder: str) -> dict[str, dict]:
    """``{id: finding}`` of a study's findings, for a table that prints a comparison the findings hold (one
    draw per number): the document a page is being rendered with (:func:`rendering`), else the committed
    ``res/<folder>/findings.json``; empty without either."""
    from keyformer.lab import findings as fnd

    doc = _FRESH.get(folder)
    path = res / folder / "findings.json"
    if doc is None and path.is_file():
        doc = fnd.load(path)
    return {f["id"]: f for f in doc["findings"]} if doc else {}


class rendering:  # noqa: N801 - a context manager, read as a phrase
    """``with rendering(folder, doc):`` the tables rendered inside read ``doc`` as ``folder``'s findings."""

    def __init__(self, folder: str, doc: dict | None) -> None:
        self.folder, self.doc = folder, doc

    def __enter__(self) -> None:
        if self.doc is not None:
            _FRESH[self.folder] = self.doc

    def __exit__(self, *exc: object) -> None:
        _FRESH.pop(self.folder, None)


def _p_cell(p: float, n_boot: int) -> str:
    """A bootstrap p as the table prints it: 3 decimals, or ``< 2/n_boot`` where no replicate crossed 0
    (a bootstrap p of 0 means "below its resolution", not 0)."""
    if np.isnan(p):
        return ""
    return f"< {2 / n_boot:g}" if p < 2 / n_boot else f"{p:.3f}"


def _ci_cell(r: pd.Series, key: str) -> str:
    v = r.get(key)
    if v is None or (isinstance(v, float) and np.isnan(v)):
        return ""
    return fmt_ci(float(v), float(r[f"{key}_lo"]), float(r[f"{key}_hi"]))


# name -> section; a README quotes a section between <!-- keyformer-report:NAME --> and its closing marker.
# The library's own sections; each registered study adds its own (:func:`sections`).
LIBRARY_SECTIONS: dict[str, Callable[[Path], None]] = {
    "demo": demo,
    "brief": brief,
    "methods": methods,
    "provenance": provenance,
    "bench_targets": bench_targets,
    "bench_floors": bench_floors,
    "bench_long": bench_long,
    "speed": speed,
}
def sections(registry: str | None = None) -> dict[str, Callable[[Path], None]]:
    """Every section name -> its printer: the library's, then each registered study's."""
    out = dict(LIBRARY_SECTIONS)
    for study in studies.studies(registry):
        for name, fn in study.SECTIONS.items():
            if name in out:
                raise ValueError(f"section {name!r} of {study.__name__} is defined twice")
            out[name] = fn
    return out


README_FILES = (Path("README.md"), Path("results/README.md"), Path("results/bench/README.md"))


def readme_files() -> tuple[Path, ...]:
    """The files whose marked tables ``--update-readme``/``--check-readme`` handle: READMEs and docs/*.md."""
    return (*README_FILES, *sorted(Path("docs").glob("*.md")))


MARKED = re.compile(r"(<!-- keyformer-report:(?P<name>[^ >]+) -->\n)(?P<body>.*?)(<!-- "
                    r"/keyformer-report:(?P=name) -->)",
                    re.S)


def render(name: str, res: Path) -> str:
    """One section's output as a README quotes it (stripped of surrounding blank lines)."""
    known = sections()
    if name not in known:
        raise KeyError(f"keyformer-report: unknown section {name!r}; valid: {', '.join(known)}")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        known[name](res)
    return buf.getvalue().strip("\n")


def marked(text: str) -> list[tuple[str, str]]:
    """``(section, quoted text)`` of every marked region of a README."""
    return [(m["name"], m["body"].strip("\n")) for m in MARKED.finditer(text)]


def update_text(text: str, res: Path, cache: dict[str, str] | None = None) -> str:
    """``text`` with every marked region replaced by its section's current output."""
    cache = {} if cache is None else cache

    def sub(m: re.Match) -> str:
        if m["name"] not in cache:
            cache[m["name"]] = render(m["name"], res)
        return f"{m.group(1)}{cache[m['name']]}\n{m.group(4)}"

    return MARKED.sub(sub, text)


def drift(paths: tuple[Path, ...], res: Path) -> list[str]:
    """``path: section`` for each marked region whose text differs from its section's output."""
    cache: dict[str, str] = {}
    out = []
    for path in paths:
        for name, body in marked(path.read_text(encoding="utf-8")):
            if name not in cache:
                cache[name] = render(name, res)
            if body != cache[name]:
                out.append(f"{path}: {name}")
    return out


def render_collected(folder: Path) -> str:
    """One collected folder (``points.csv`` + ``samples.csv`` of keyformer-collect): its table and findings,
    as ``keyformer-report --sweep`` renders them (:mod:`keyformer.lab.sweep`)."""
    from keyformer.lab import sweep

    return sweep.text(folder).strip("\n")

