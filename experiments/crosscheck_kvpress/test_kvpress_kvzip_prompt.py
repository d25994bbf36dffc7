"""KVzip's cross-check instruction comes from the model's own tokenizer."""

from __future__ import annotations

import pytest

from keyformer import make_policy, tiny_model

N, NEW = 36, 10
pytestmark = pytest.mark.usefixtures("one_thread")
W_RKV, BUF = 4, 4


def test_kvzip_instruction_from_the_models_tokenizer():
    """``repeat_ids: auto`` = kvpress's instruction + the chat template's assistant header, in the tokenizer
    stored with the model; none where no tokenizer is stored (tiny random models)."""
    import os

    from keyformer.core.policies.kvzip import instruction_ids

    assert instruction_ids(tiny_model("llama").config.name_or_path) is None
    from experiments.crosscheck_kvpress.kvpress_compare import default_model_dir

    path = default_model_dir()  # the runner's converted SmolLM2
    if not os.path.isfile(os.path.join(path, "tokenizer.json")):
        pytest.skip("the converted SmolLM2 (with its tokenizer) is not here")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    text = tok.decode(instruction_ids(path))
    assert text == "\n\nRepeat the previous context exactly.<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(ValueError, match="repeat_ids"):
        make_policy("kvzip", repeat_ids="yes")
