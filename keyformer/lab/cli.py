"""``keyformer-report``: report sections, results pages, README tables and the leaderboard (see
:mod:`keyformer.lab.report` for the usage)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from keyformer.lab import pages, report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=report.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=Path("results"), help="curated results folder")
    ap.add_argument("--section", action="append", metavar="NAME", help="print only this section (repeatable)")
    ap.add_argument("--list", action="store_true", help="list the section names")
    ap.add_argument("--update-readme", nargs="*", type=Path, metavar="FILE",
                    help="rewrite the marked tables of these files (default: the READMEs and docs/*.md)")
    ap.add_argument("--check-readme", nargs="*", type=Path, metavar="FILE",
                    help="exit 1 if a marked table of these files differs from the data")
    ap.add_argument("--pages", action="store_true",
                    help="write each study's findings.json and page, and the results index, from the data")
    ap.add_argument("--check-pages", action="store_true",
                    help="exit 1 naming each generated page or findings.json that differs from the data")
    ap.add_argument("--study", metavar="NAME", help="with --pages/--check-pages: only this study")
    ap.add_argument("--seed", type=int, default=0,
                    help="root of the findings tests' random streams (--pages, --leaderboard, --sweep; "
                         "default 0, what the committed files use; another seed reproduces every verdict)")
    ap.add_argument("--leaderboard", metavar="BENCHMARK",
                    help="rank a collected sweep (--with FOLDER) in the committed field of BENCHMARK (ruler)")
    ap.add_argument("--with", dest="with_", type=Path, metavar="FOLDER",
                    help="with --leaderboard: a keyformer-collect folder (points.csv, samples.csv)")
    ap.add_argument("--setting", choices=("aware", "agnostic"),
                    help="with --leaderboard: question-aware or query-agnostic (default: what the sweep ran)")
    ap.add_argument("--sweep", type=Path, metavar="SWEEP",
                    help="render your own sweep (a hydra.sweep.dir or a keyformer-collect folder) as a page: "
                         "figure, table, findings.json, README.md into --out")
    ap.add_argument("--out", type=Path, metavar="DIR", help="with --sweep: where the page goes")
    ap.add_argument("--reference", default="keyformer", metavar="POLICY",
                    help="with --sweep: the policy every other one is compared with at its budget "
                         "(besides full)")
    ap.add_argument("--wandb-group", metavar="GROUP",
                    help="with --sweep: also log its findings as a W&B Table into this group (docs/wandb.md)")
    ap.add_argument("--studies", metavar="MODULE",
                    help="the registry of studies (a module with STUDIES; default $KEYFORMER_STUDIES, else "
                         "experiments.registry)")
    args = ap.parse_args(argv)
    res = args.results
    if args.studies:
        os.environ["KEYFORMER_STUDIES"] = args.studies
    if args.sweep is not None:
        from keyformer.lab.sweep import SweepError, build

        if args.out is None:
            print("error: --sweep needs --out DIR (where its page goes)", file=sys.stderr)
            return 2
        try:
            for path in build(args.sweep, args.out, args.reference or None, args.seed):
                print(f"wrote {path}")
        except SweepError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if args.wandb_group:
            import json

            from keyformer.run.wandb_log import log_findings_table

            doc = json.loads((args.out / "findings.json").read_text(encoding="utf-8"))
            if doc["findings"]:
                log_findings_table(args.wandb_group, doc, directory=os.environ.get("WANDB_DIR"))
                print(f"logged {len(doc['findings'])} findings to W&B group {args.wandb_group!r}")
        return 0
    if args.leaderboard is not None:
        from keyformer.lab.leaderboard import LeaderboardError, leaderboard

        if args.with_ is None:
            print("error: --leaderboard needs --with FOLDER (a keyformer-collect folder of your sweep)",
                  file=sys.stderr)
            return 2
        try:
            print(leaderboard(args.leaderboard, args.with_, res, args.setting, args.seed))
        except LeaderboardError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    if args.pages or args.check_pages:
        known = [pages.study_name(s) for s in pages.pages()]
        if args.study and args.study not in known:
            print(f"error: --study {args.study!r}: no such study with a page; valid: {', '.join(known)}",
                  file=sys.stderr)
            return 2
        files = pages.build(res, only=args.study, seed=args.seed)
        if args.check_pages:
            bad = pages.drift(files)
            for b in bad:
                print(f"differs from the data: {b} (keyformer-report --pages rewrites it)", file=sys.stderr)
            return 1 if bad else 0
        for path in pages.write(files):
            print(f"wrote {path}")
        return 0
    if args.list:
        print("\n".join(report.sections()))
        return 0
    if args.update_readme is not None:
        cache: dict[str, str] = {}
        for path in args.update_readme or report.readme_files():
            old = path.read_text(encoding="utf-8")
            new = report.update_text(old, res, cache)
            if new != old:
                path.write_text(new, encoding="utf-8")
            state = "updated" if new != old else "unchanged"
            print(f"{path}: {len(report.marked(new))} marked tables, {state}")
        return 0
    if args.check_readme is not None:
        bad = report.drift(tuple(args.check_readme or report.readme_files()), res)
        for b in bad:
            print(f"differs from keyformer-report: {b}", file=sys.stderr)
        return 1 if bad else 0
    if not res.is_dir():
        print(f"error: --results {res}: no such folder (a curated results/ tree, or a folder written by "
              "keyformer-collect)", file=sys.stderr)
        return 2
    if (res / "points.csv").is_file() and not args.section:  # one collected sweep (keyformer-collect --out)
        try:
            text = report.render_collected(res)
        except Exception as e:  # noqa: BLE001 - any unreadable table: one line
            why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            print(f"error: --results {res}: cannot read its points.csv/samples.csv: {why}", file=sys.stderr)
            return 2
        print(text)
        return 0
    if not args.section and not any(res.glob("**/*.csv")):
        print(f"error: --results {res}: nothing to report (no points.csv of keyformer-collect, and none of "
              f"the "
              "curated experiment tables)", file=sys.stderr)
        return 2
    for name in args.section or report.sections():
        try:
            text = report.render(name, res)
        except KeyError as e:
            print(f"error: {e.args[0]}", file=sys.stderr)
            return 2
        if text:
            print("\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
