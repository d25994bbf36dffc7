"""The prompt pass of an attention-reading policy allocates no logits or probabilities per block.

Its blocks' logits and probabilities live in one workspace on the cache (``keyformer.core.attention``,
``prompt_blocks``), dropped after the prompt forward's last layer. Counted with the profiler's memory events,
which do not depend on the machine's speed or load: the bytes that the block operations (the logits'
batched matmul and the softmax) allocate over a whole prompt forward stay far below one layer's
``[B, Hq, N, N]`` probability matrix (what remains is each block's ``P V`` and column sums, ``O(N D)``),
whatever the number of blocks.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from keyformer import make_cache, make_policy, tiny_model
from keyformer.core import attention

pytestmark = pytest.mark.usefixtures("one_thread")

BLOCK_OPS = ("aten::bmm", "aten::_softmax", "aten::softmax", "aten::baddbmm")


def _block_op_bytes(model, ids, mask, policy: str) -> tuple[int, object]:
    cache = make_cache(model, make_policy(policy, budget=0.5), mask, max_new_tokens=2, seed=0)
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
    allocated = sum(max(0, e.cpu_memory_usage) for e in prof.events() if e.name in BLOCK_OPS)
    return allocated, cache


@pytest.mark.parametrize("policy", ["h2o", "keyformer"])
@pytest.mark.parametrize("rows", [8, 48])
def test_prompt_blocks_allocate_no_matrix(policy, rows, monkeypatch):
    monkeypatch.setattr(attention, "SCORE_ROWS", rows)
    model = tiny_model("llama")
    B, N = 2, 192
    ids = torch.randint(3, 200, (B, N), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :13] = 0
    allocated, cache = _block_op_bytes(model, ids, mask, policy)
    one_layer_matrix = B * model.config.num_attention_heads * N * N * 4
    assert allocated < one_layer_matrix / 4, (allocated, one_layer_matrix)  # P V and the GEMVs: O(N D)
    assert cache.scratch is None  # the workspace goes with the prompt forward


def test_a_per_block_allocation_is_counted(monkeypatch):
    """The count sees an allocating softmax: the probabilities as a new tensor per block (the old way)."""
    monkeypatch.setattr(attention.torch.ops.aten._softmax, "out", lambda x, d, h, out: torch.softmax(x, d))
    monkeypatch.setattr(attention, "SCORE_ROWS", 8)
    model = tiny_model("llama")
    ids = torch.randint(3, 200, (2, 192), generator=torch.Generator().manual_seed(0))
    allocated, _ = _block_op_bytes(model, ids, torch.ones_like(ids), "h2o")
    assert allocated > 2 * model.config.num_attention_heads * 192 * 192 * 4 / 4
