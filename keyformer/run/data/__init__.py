"""Datasets (local JSONL, hub, the generated ``sample`` and ``needle``) and prompt construction."""

from keyformer.run.data.loaders import (
    DATA_DIR_ENV,
    GENERATED,
    DataError,
    check_options,
    check_source,
    load_records,
    local_path,
)
from keyformer.run.data.needle import generate_needle
from keyformer.run.data.prompts import ALPACA, SODA, TRUNCATIONS, encode_prompt, render
from keyformer.run.data.sample import generate_sample

__all__ = [
    "ALPACA",
    "DATA_DIR_ENV",
    "GENERATED",
    "SODA",
    "TRUNCATIONS",
    "DataError",
    "check_options",
    "check_source",
    "encode_prompt",
    "generate_needle",
    "generate_sample",
    "load_records",
    "local_path",
    "render",
]
