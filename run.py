"""Experiment runner: ``python run.py [group=option ...] [key=value ...]`` (Hydra 1.3; see README.md).

Examples::

    python run.py                                             # SmolLM2 + sample data + keyformer, offline
    python run.py model=mpt policy=keyformer budget=0.5 device=cuda
    python run.py -m policy=window,h2o,keyformer budget=0.2,0.5,0.8
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig, OmegaConf


@hydra.main(version_base=None, config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    from keyformer.data import DataError
    from keyformer.errors import ConfigError, validate
    from keyformer.results import ResumeError

    try:
        config = OmegaConf.to_container(cfg, resolve=True)
        if config.get("task", {}).get("name") == "lm_eval":
            from keyformer.lmeval.job import run_lm_eval, validate_lm_eval

            validate_lm_eval(config)
            run_lm_eval(config)
            return None
        validate(config)
        from keyformer.runner import run

        metrics = run(config)
    except (ConfigError, DataError, ResumeError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        sys.exit(2)
    return metrics.get("rougeL")


if __name__ == "__main__":
    main()
