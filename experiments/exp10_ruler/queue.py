"""Write experiment 10's queue files (its README.md): RULER 4k, 11 tasks, 5 samples per task.

    python experiments/exp10_ruler/queue.py  # tiers 1-2 here (committed); 1b, 2b, 3, 4 in multirun/.../queues
    STEP=5 bash scripts/run_points.sh multirun/exp10_ruler/queues/left.txt  # or: what is not committed yet
    STEP=5 bash scripts/run_points.sh experiments/exp10_ruler/queues/exp10_core.txt \\
        multirun/exp10_ruler/queues/exp10_current.txt \\
        experiments/exp10_ruler/queues/exp10_core_agnostic.txt \\
        multirun/exp10_ruler/queues/exp10_budgets.txt \\
        multirun/exp10_ruler/queues/exp10_field.txt

The Gemma 3 270M tiers (`gemma_core.txt`, `gemma_core_agnostic.txt`: tiers 1-2; `gemma_current.txt`,
`gemma_current_agnostic.txt`: tiers 1b-2b, the 2025 methods; `gemma_budgets.txt`, `gemma_field.txt`: tiers 3-4
as on SmolLM2 less the Ada-KVs; all with +experiment=exp10_ruler_gemma, folders
multirun/exp10_ruler_gemma/...) go to multirun/exp10_ruler_gemma/queues.

``left.txt`` (one per model) lists every tier's points in tier order, less those already complete in
``results/exp10_ruler{,_gemma}/<setting>/points.csv``: how a session on a fresh machine continues.

Tiers 1b, 2b, 3, 4 and 5 (44 + 44 + 264 + 704 + 286 points) are not committed as queue files:
tests/test_configs.py composes every line of experiments/queues/*.txt, which would take half an hour on
the 2-core machine. Points are listed policy-major (every task of a policy, then the next policy), so a
policy's RULER average is complete as early as possible; in tiers 3-4 a point's budgets follow each other with
``share_prompt=true``: one prompt forward per record serves all of them (outputs as without it).
"""

from __future__ import annotations

import sys
from pathlib import Path

TASKS = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
         "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe"]
TOKENS = {"vt": 30, "cwe": 120, "fwe": 50}  # RULER's tokens to generate; NIAH 128
CORE = ["full", "keyformer", "h2o", "snapkv", "window"]
CURRENT = ["expected_attention", "keydiff", "kvzip", "rkv"]  # the field's 2025 methods (issue 21)
# tier 4 runs the 2025 methods first: where Keyformer ranks among the current methods at every ratio
FIELD = [*CURRENT, "tova", "pyramidkv", "adakv_snapkv", "adakv_keyformer", "streaming"]
# issue 68's methods at ratio 0.5, both settings: the floor and the cheap scorers first, then the compositions
# (CriticalKV over SnapKV and Keyformer, Ada-KV over H2O and key norm, CaM's merge-on-evict over H2O); a
# test checks that every registered policy is in some tier at ratio 0.5
METHODS = ["random", "knorm", "snapkv+criticalkv", "keyformer+criticalkv", "h2o+adakv", "knorm+adakv",
           "lagkv", "curdkv", "leverage", "finch", "simlayerkv", "compactor", "capkv", "h2o+cam"]
RECORDS = 5
OTHER = (0.75, 0.25, 0.125)  # budgets of ratios 0.25, 0.75, 0.875 (tiers 3-4; ratio 0.5 is tiers 1-2)
HEADER = """# Experiment 10 (experiments/exp10_ruler/README.md), {what}.
# RULER 4k on SmolLM2-135M-Instruct, {records} samples per task; written by experiments/exp10_ruler/queue.py.
# Line: <folder> <records> <run.py overrides>; run with STEP={records} so a point finishes in one call.
"""


def line(setting: str, task: str, policy: str, budget: float, exp: str = "exp10_ruler",
         share: bool = False) -> str:
    """One queue line; ``policy`` may be a composition ``scorer+wrapper[+wrapper...]`` (``policy.wrap``)."""
    folder = f"multirun/{exp}/{setting}/task={task},budget={budget},policy={policy}"
    agnostic = " dataset.query_agnostic=true" if setting == "agnostic" else ""
    base, *wrap = policy.split("+")
    wraps = f" policy.wrap=[{','.join(wrap)}]" if wrap else ""
    return (f"{folder} {RECORDS} +experiment={exp} dataset.ruler_task={task} "
            f"generation.max_new_tokens={TOKENS.get(task, 128)}{agnostic} policy={base}{wraps} "
            f"budget={budget}"
            + (" share_prompt=true" if share else ""))


def sweep(setting: str, policies: list[str], budgets: dict[str, tuple[float, ...]],
          exp: str = "exp10_ruler") -> list[str]:
    """Budget-minor: a (policy, task) point's budgets one after another, with ``share_prompt=true``, so the
    worker that runs the first runs each prompt forward once for all of them (keyformer/core/prompt_memo.py;
    keyformer-queue keeps a worker to its group while another runs another)."""
    return [line(setting, t, p, b, exp, share=True) for p in policies for t in TASKS for b in budgets[p]]


def points(setting: str, policies: list[str], budget: float, exp: str = "exp10_ruler") -> list[str]:
    return [line(setting, t, p, 1.0 if p == "full" else budget, exp) for p in policies for t in TASKS]


def gemma_tiers() -> dict[str, tuple[str, list[str]]]:
    """Tiers 1, 2, 1b and 2b on Gemma 3 270M (``+experiment=exp10_ruler_gemma``): where Keyformer ranks among
    the 2025 methods on a second model, at ratio 0.5, in both settings; then tiers 3 and 4 as on SmolLM2,
    less the Ada-KVs (Gemma 3 270M has one KV head: Ada-KV is its base policy there)."""
    g = "exp10_ruler_gemma"
    both = ("aware", "agnostic")
    field = [p for p in FIELD if not p.startswith("adakv_")]
    return {"gemma_core.txt": ("Gemma 3 270M tier 1: question-aware, ratio 0.5, the core policies",
                               points("aware", CORE, 0.5, g)),
            "gemma_core_agnostic.txt": ("Gemma 3 270M tier 2: the same points, query-agnostic",
                                        points("agnostic", CORE, 0.5, g)),
            "gemma_current.txt": ("Gemma 3 270M tier 1b: the 2025 methods at ratio 0.5, question-aware",
                                  points("aware", CURRENT, 0.5, g)),
            "gemma_current_agnostic.txt": ("Gemma 3 270M tier 2b: the 2025 methods at ratio 0.5, "
                                           "query-agnostic", points("agnostic", CURRENT, 0.5, g)),
            "gemma_budgets.txt": ("Gemma 3 270M tier 3: Keyformer / H2O / SnapKV / window at ratios 0.25, "
                                  "0.75, 0.875, both settings",
                                  [x for s in both
                                   for x in sweep(s, CORE[1:], dict.fromkeys(CORE, OTHER), g)]),
            "gemma_field.txt": ("Gemma 3 270M tier 4: every other registered policy but the Ada-KVs at the 4 "
                                "ratios, both settings, policy by policy",
                                [x for p in field for s in both
                                 for x in sweep(s, [p], {p: OTHER if p in CURRENT else (0.5, *OTHER)}, g)])}


def tiers() -> dict[str, tuple[str, list[str]]]:
    """Experiment 10's tiers on SmolLM2, in the order they run (1, 1b, 2, 2b, 3, 4, 5)."""
    both = ("aware", "agnostic")
    return {
        "exp10_core.txt": ("tier 1: question-aware, ratio 0.5 (budget 0.5), full / Keyformer / H2O / SnapKV "
                           "/ window", points("aware", CORE, 0.5)),
        "exp10_current.txt": ("tier 1b: the 2025 methods (Expected Attention, KeyDiff, KVzip, R-KV) at ratio "
                              "0.5, question-aware: where Keyformer ranks among the current methods",
                              points("aware", CURRENT, 0.5)),
        "exp10_core_agnostic.txt": ("tier 2: the same points, query-agnostic (context compressed once)",
                                    points("agnostic", CORE, 0.5)),
        "exp10_current_agnostic.txt": ("tier 2b: the 2025 methods at ratio 0.5, query-agnostic (KVzip's own "
                                       "setting)", points("agnostic", CURRENT, 0.5)),
        "exp10_budgets.txt": ("tier 3: Keyformer / H2O / SnapKV / window at ratios 0.25, 0.75, 0.875, both "
                              "settings (a point's budgets together: share_prompt)",
                              [x for s in both for x in sweep(s, CORE[1:], dict.fromkeys(CORE, OTHER))]),
        "exp10_field.txt": ("tier 4: every other registered policy at the 4 ratios, both settings (a point's "
                            "budgets together: share_prompt; policy by policy, each question-aware then "
                            "query-agnostic, so each policy is read once in both settings)",
                            [x for p in FIELD for s in both  # ratio 0.5 of the 2025 methods: tiers 1b, 2b
                             for x in sweep(s, [p], {p: OTHER if p in CURRENT else (0.5, *OTHER)})]),
        "exp10_methods.txt": ("tier 5: the methods and compositions added to the registry since tier 4, at "
                              "ratio 0.5, both settings, method by method",
                              [x for p in METHODS for s in both for x in points(s, [p], 0.5)]),
    }


def complete_points(results: Path) -> set[str]:
    """``<setting>/<point>`` of every complete point under ``results`` (its ``<setting>/points.csv``)."""
    import csv

    out = set()
    for f in sorted(results.glob("*/points.csv")):
        with open(f, newline="") as fh:
            out |= {f"{f.parent.name}/{r['point']}" for r in csv.DictReader(fh)
                    if r.get("complete") == "True"}
    return out


def left(lines: list[str], results: Path) -> list[str]:
    """The queue lines whose point is not yet complete in ``results`` (a fresh machine has no multirun/
    folders: this is how a later session continues from the committed rows)."""
    have = complete_points(results)
    return [ln for ln in lines if "/".join(ln.split()[0].split("/")[-2:]) not in have]


def main(argv: list[str]) -> None:
    here = Path(__file__).resolve().parent
    late = Path(argv[0]) if argv else here.parent.parent / "multirun" / "exp10_ruler" / "queues"
    for name, (what, lines) in tiers().items():
        out = (here / "queues" if name in ("exp10_core.txt", "exp10_core_agnostic.txt") else late) / name
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(HEADER.format(what=what, records=RECORDS) + "\n".join(lines) + "\n")
        print(f"{out}: {len(lines)} points")
    gemma = late / "gemma" if argv else late.parent.parent / "exp10_ruler_gemma" / "queues"
    for name, (what, lines) in gemma_tiers().items():
        gemma.mkdir(parents=True, exist_ok=True)
        header = HEADER.replace("SmolLM2-135M-Instruct", "Gemma 3 270M")
        (gemma / name).write_text(header.format(what=what, records=RECORDS) + "\n".join(lines) + "\n")
        print(f"{gemma / name}: {len(lines)} points")
    results = here.parent.parent / "results"
    for folder, exp, ts in ((late, "exp10_ruler", tiers()), (gemma, "exp10_ruler_gemma", gemma_tiers())):
        todo = left([ln for _, lines in ts.values() for ln in lines], results / exp)
        what = f"every tier's points not yet complete in results/{exp}/, in tier order"
        header = HEADER if exp == "exp10_ruler" else HEADER.replace("SmolLM2-135M-Instruct", "Gemma 3 270M")
        (folder / "left.txt").write_text(header.format(what=what, records=RECORDS) + "\n".join(todo) + "\n")
        print(f"{folder / 'left.txt'}: {len(todo)} points left")


if __name__ == "__main__":
    main(sys.argv[1:])
