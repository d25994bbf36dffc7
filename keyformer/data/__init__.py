"""Datasets (local JSONL, hub, embedded ``sample``) and prompt construction."""

from keyformer.data.loaders import DATA_DIR_ENV, DataError, check_source, load_records, local_path
from keyformer.data.prompts import ALPACA, SODA, encode_prompt, render
from keyformer.data.sample import generate_sample

__all__ = [
    "ALPACA",
    "DATA_DIR_ENV",
    "SODA",
    "DataError",
    "check_source",
    "encode_prompt",
    "generate_sample",
    "load_records",
    "local_path",
    "render",
]
