"""Experiment runner: ``python run.py [group=option ...] [key=value ...]`` (Hydra 1.3; see README.md).

Examples::

    python run.py                                             # SmolLM2 + sample data + keyformer, offline
    python run.py model=mpt policy=keyformer budget=0.5 device=cuda
    python run.py -m policy=window,h2o,keyformer budget=0.2,0.5,0.8

Every job goes through :mod:`keyformer.run.scaffold` (validation, resume, results, W&B, summary). A rejected
command prints one ``error:`` line and exits with status 2: unknown group options, unknown keys (with a
did-you-mean), a launcher whose plugin is not installed, here, before Hydra composes; bad values in the job
(or, for a sweep, in any of its points before the first job starts: ``keyformer.run.scaffold.Preflight``).
Ctrl-C and SIGTERM print one line with the command that resumes the partial folder (also appended to
the folder's ``run.log``).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from keyformer.run.scaffold import hydra_main

    return hydra_main(cfg)


def _precheck(argv: list[str]) -> str | None:
    """The one-line errors of a command line, before Hydra starts (which would print several lines)."""
    from keyformer.run.scaffold import check_overrides
    from keyformer.run.validate import check_cli

    return check_overrides(argv) or check_cli(argv)


if __name__ == "__main__":
    message = _precheck(sys.argv[1:])
    if message:
        print(message, file=sys.stderr, flush=True)
        sys.exit(2)
    from keyformer.run.validate import install_sigterm

    install_sigterm()  # SIGTERM (SLURM's time limit) ends the job as Ctrl-C does: rows kept, one line
    try:
        main()
    except KeyboardInterrupt as e:
        from keyformer.run.validate import report_interrupt

        sys.exit(report_interrupt(e))
