"""Optional Weights & Biases logging: one run per job, grouped by sweep. Failures are warnings only.

Mode: ``logger.mode`` if set, else ``WANDB_MODE`` if set, else ``online`` when an API key is configured
(``WANDB_API_KEY`` or a ``api.wandb.ai`` entry in ~/.netrc from ``wandb login``), else ``offline``
(sync later with ``wandb sync``). Local results are always written before anything is sent to W&B.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _configured() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    try:
        return "api.wandb.ai" in netrc.read_text()
    except OSError:
        return False


def wandb_mode(requested: str | None = None) -> str:
    if requested:
        return requested
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    return "online" if _configured() else "offline"


class WandbLogger:
    """Thin wrapper; every call swallows exceptions into warnings."""

    def __init__(self, cfg: Mapping[str, Any], config: Mapping[str, Any], output_dir: str | os.PathLike):
        self.run: Any = None
        lg = cfg.get("logger") or {}
        out = Path(output_dir).resolve()
        try:
            import wandb

            self.run = wandb.init(
                project=lg.get("project") or "keyformer",
                entity=lg.get("entity"),
                group=lg.get("group") or out.parent.name,
                name=out.name,
                tags=list(lg.get("tags") or []),
                config=dict(config),
                dir=str(out),
                mode=wandb_mode(lg.get("mode")),
                reinit="finish_previous",
            )
        except Exception as e:  # noqa: BLE001 - W&B must never cost results
            warnings.warn(f"W&B disabled for this job: {type(e).__name__}: {e}", stacklevel=2)

    def finish(self, metrics: Mapping[str, Any], rows: Sequence[Mapping[str, Any]],
               log_samples: bool = True) -> None:
        if self.run is None:
            return
        try:
            import wandb

            self.run.summary.update({k: v for k, v in metrics.items()
                                     if isinstance(v, int | float | str | bool)})
            if log_samples and rows:
                cols = list(rows[0].keys())
                self.run.log({"samples": wandb.Table(columns=cols,
                                                     data=[[r.get(c) for c in cols] for r in rows])})
            self.run.finish()
        except Exception as e:  # noqa: BLE001
            warnings.warn(f"W&B logging failed (local results are complete): {type(e).__name__}: {e}",
                          stacklevel=2)
        finally:
            self.run = None
