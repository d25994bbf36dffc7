"""Where things are: the one place that knows the checkout's layout (``conf/``, the package), and
:func:`compose`, the resolved ``run.py`` config outside a Hydra app. Importing this loads nothing heavy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1]  # keyformer/
ROOT = PACKAGE.parent  # the checkout (editable install)
CONF_DIR = ROOT / "conf"  # run.py's Hydra configs


def config_dirs(conf_dir: Path = CONF_DIR) -> list[Path]:
    """``conf_dir`` and the folders its ``config.yaml`` adds to Hydra's search path (``hydra.searchpath``, the
    studies' own configs), in search order: where a config group's options are found."""
    import yaml

    raw = yaml.safe_load((conf_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    out = [conf_dir]
    for entry in (raw.get("hydra") or {}).get("searchpath") or []:
        if str(entry).startswith("file://"):
            out.append(Path(str(entry)[len("file://"):].replace("${checkout_root:}", str(ROOT))))
    return out


def compose(overrides: Sequence[str], config_name: str = "config") -> dict[str, Any]:
    """The resolved config of ``run.py`` (``conf/``) with Hydra ``overrides``, outside a Hydra app.

    ``output_dir`` (Hydra's run folder) is dropped: the tools write where their own config says.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name, overrides=list(overrides))
    with open_dict(cfg):
        if "output_dir" in cfg:
            del cfg["output_dir"]
    out = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(out, dict)
    return {str(k): v for k, v in out.items()}
