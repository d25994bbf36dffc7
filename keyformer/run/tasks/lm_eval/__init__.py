"""lm-eval-harness under any cache policy: the ``keyformer`` LM adapter, offline task YAMLs, the job.

Importing this package registers the lm-eval model ``"keyformer"`` and the attention implementation
``keyformer_per_row``; it needs the optional dependency ``lm-eval`` (``pip install -e .[lmeval]``).
"""

from .adapter import SEMANTICS, KeyformerLM
from .task import LOCAL_TASKS, TASKS_DIR, run_lm_eval

__all__ = ["KeyformerLM", "SEMANTICS", "LOCAL_TASKS", "TASKS_DIR", "run_lm_eval"]
