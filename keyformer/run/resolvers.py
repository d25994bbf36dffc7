"""OmegaConf resolvers the project's configs use (registered when :mod:`keyformer.run` is imported).

* ``${checkout_root:}``: the checkout's root folder (where ``conf/`` and ``experiments/`` are), so that
  ``conf/config.yaml``'s ``hydra.searchpath`` finds each study's own configs from any working folder.
* ``${ruler_new_tokens:<task>}``: RULER's tokens to generate for a ruler task (niah 128, vt 30, cwe 120,
  fwe 50); an unknown task gives 128 and is then refused by the dataset check
  (``invalid dataset.ruler_task=...``), so the error stays one line.
* ``${ruler_prompt_limit:<length>}``: ``length + RULER_WRAPPER_ROOM``, a ``max_prompt_tokens`` that holds a
  RULER sample of ``length`` tokens (text + answer) plus any chat template's wrapper. A prompt that still does
  not fit is refused, never cut (:func:`keyformer.run.tasks.generate.check_uncut`).
"""

from __future__ import annotations

from typing import Any

RULER_WRAPPER_ROOM = 256  # tokens a chat template may add around a RULER text (SmolLM2's: ~30)


def ruler_new_tokens(task: Any) -> int:
    """RULER's tokens to generate for ``task``; 128 (NIAH's) for a name that is not a task."""
    from keyformer.run.data.ruler import TOKENS_TO_GENERATE, tokens_to_generate

    try:
        return tokens_to_generate(str(task))
    except ValueError:
        return TOKENS_TO_GENERATE["niah"]


def ruler_prompt_limit(length: Any) -> int:
    """``max_prompt_tokens`` for RULER samples of ``length`` tokens."""
    return int(length) + RULER_WRAPPER_ROOM


def checkout_root() -> str:
    """The checkout's root folder (``keyformer.run.paths.ROOT``)."""
    from keyformer.run.paths import ROOT

    return str(ROOT)


RESOLVERS = {"checkout_root": checkout_root, "ruler_new_tokens": ruler_new_tokens,
             "ruler_prompt_limit": ruler_prompt_limit}


def register() -> None:
    """Register :data:`RESOLVERS` with OmegaConf (idempotent)."""
    from omegaconf import OmegaConf

    for name, fn in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
