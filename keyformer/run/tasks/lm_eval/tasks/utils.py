"""Offline data for the local task YAMLs: ``$KEYFORMER_DATA_DIR/<file>.jsonl`` (see
../../shared/data/README.md).

Prompt functions come from lm-eval's own task modules, so prompts and targets are the built-in ones.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

DATA_ENV = "KEYFORMER_DATA_DIR"


def data_dir() -> Path:
    d = os.environ.get(DATA_ENV)
    if not d:
        raise FileNotFoundError(f"set {DATA_ENV} to the folder holding the lm-eval JSONL files (piqa.jsonl, "
                                f"...)")
    return Path(d).expanduser()


def load_jsonl(eval_split: str, eval_file: str, fewshot_split: str | None = None,
               fewshot_file: str | None = None, **_: Any) -> Any:
    """A ``DatasetDict`` with ``eval_split`` (and the few-shot pool ``fewshot_split``) from local JSONL files.

    Called by lm-eval as ``custom_dataset(**metadata, **dataset_kwargs)``.
    """
    import datasets

    files = {eval_split: str(data_dir() / eval_file)}
    if fewshot_split and fewshot_file:
        files[fewshot_split] = str(data_dir() / fewshot_file)
    for f in files.values():
        if not Path(f).is_file():
            raise FileNotFoundError(f"{f} not found (is {DATA_ENV} right?)")
    return datasets.load_dataset("json", data_files=files)


def hellaswag_process_docs(dataset: Any) -> Any:
    """lm-eval's hellaswag ``process_docs`` for the offline schema (``ctx`` = ctx_a + " " + ctx_b, already
    preprocessed; the ctx_b part is not capitalised since the split point is unknown)."""
    from lm_eval.tasks.hellaswag.utils import preprocess

    def _doc(doc: dict) -> dict:
        return {"query": preprocess(doc["activity_label"] + ": " + doc["ctx"]),
                "choices": [preprocess(e) for e in doc["endings"]], "gold": int(doc["label"])}

    return dataset.map(_doc)


# lm-eval's own prompt functions (re-exported so the YAMLs here can reference them with ``!function``).
from lm_eval.tasks.super_glue.copa.utils import (  # noqa: E402
    doc_to_choice as copa_doc_to_choice,
)
from lm_eval.tasks.super_glue.copa.utils import (  # noqa: E402
    doc_to_target as copa_doc_to_target,
)
from lm_eval.tasks.super_glue.copa.utils import (  # noqa: E402
    doc_to_text as copa_doc_to_text,
)
from lm_eval.tasks.winogrande.preprocess_winogrande import (  # noqa: E402
    doc_to_choice as winogrande_doc_to_choice,
)
from lm_eval.tasks.winogrande.preprocess_winogrande import (  # noqa: E402
    doc_to_target as winogrande_doc_to_target,
)
from lm_eval.tasks.winogrande.preprocess_winogrande import (  # noqa: E402
    doc_to_text as winogrande_doc_to_text,
)

__all__ = ["load_jsonl", "hellaswag_process_docs", "copa_doc_to_choice", "copa_doc_to_target",
           "copa_doc_to_text", "winogrande_doc_to_choice", "winogrande_doc_to_target",
           "winogrande_doc_to_text"]
