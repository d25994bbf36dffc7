"""Results tools, each an installed entry point (``[project.scripts]`` in pyproject.toml).

* :mod:`keyformer.tools.collect` (``keyformer-collect``): run folders (or a W&B group) -> curated CSVs.
* :mod:`keyformer.tools.report` (``keyformer-report``): the markdown tables of ``results/README.md``.
* :mod:`keyformer.tools.attention` (``keyformer-attention-stats``): experiment 4 (attention concentration).

Importing this package loads nothing heavy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def compose(overrides: Sequence[str], config_name: str = "config") -> dict[str, Any]:
    """The resolved config of ``run.py`` (``conf/``) with Hydra ``overrides``, outside a Hydra app.

    ``output_dir`` (Hydra's run folder) is dropped: the tools write where their own config says.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    from keyformer.loading import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name, overrides=list(overrides))
    with open_dict(cfg):
        if "output_dir" in cfg:
            del cfg["output_dir"]
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    return {str(k): v for k, v in out.items()}
