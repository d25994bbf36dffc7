"""The prompt scores computed in blocks of query rows equal the materialised attention matrix's.

``keyformer.core.attention.prompt_blocks`` is the one kernel path of every attention-reading policy's prompt
scores: the causal, masked row softmax one block of query rows at a time (no ``[Hq, N, N]`` matrix held).
Two checks, at chunk sizes that do and do not divide the prompt, with left padding:

* ``attention_column_scores`` (the public helper) against a float64 reference written here from the whole
  ``[B, Hq, N, N]`` matrix: H2O's column sums, an observation window's (SnapKV), the last row's (TOVA), a
  sliding window's band, ALiBi slopes, soft-capped logits, and Keyformer's noised softmax (noise drawn inside
  each block from the counter-based hash, the reference's from the whole field);
* the engine, for every registered policy that reads attention: a tiny Llama's prompt forward at several
  ``SCORE_ROWS`` keeps the same sets, with the same scores (to float32 rounding), as one block holding the
  whole matrix.
"""

from __future__ import annotations

import pytest
import torch

from keyformer import make_cache, make_policy, tiny_model
from keyformer.core import attention
from keyformer.core.noise import prompt_noise
from keyformer.core.policies import POLICIES

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]

B, HQ, HKV, N, D = 3, 6, 2, 37, 8
PADS = (0, 5, 11)  # left pads per sample
CHUNKS = (1, 5, 16, 37, 64)  # 5 and 16 do not divide N = 37


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, HQ, N, D, generator=g) * 1.5
    k = torch.randn(B, HKV, N, D, generator=g) * 1.5
    kpos = torch.stack([torch.arange(N) - p for p in PADS])  # [B, N], pads < 0
    return q, k, kpos


def _reference_probs(q, k, kpos, scaling, window=None, slopes=None, softcap=None) -> torch.Tensor:
    """[B, HQ, N, N] float64: the row softmax of the masked causal logits, written from the definition."""
    G = HQ // HKV
    x = torch.einsum("bhid,bhjd->bhij", q.double(), k.double().repeat_interleave(G, dim=1)) * scaling
    if softcap is not None:
        x = torch.tanh(x / softcap) * softcap
    if slopes is not None:
        x = x + slopes.double().view(1, HQ, 1, 1) * kpos.double().view(B, 1, 1, N)
    i = torch.arange(N).view(N, 1)
    j = torch.arange(N).view(1, N)
    allowed = (j <= i).view(1, 1, N, N) & (kpos >= 0).view(B, 1, 1, N)
    if window is not None:
        allowed = allowed & (j > i - window).view(1, 1, N, N)
    allowed = allowed | (i == j).view(1, 1, N, N)  # a pad row sees only itself
    return torch.softmax(x.masked_fill(~allowed, float("-inf")), dim=-1)


def _reference_sums(s: torch.Tensor, kpos: torch.Tensor, rows_from: int) -> torch.Tensor:
    """[B, HKV, N]: per-entry scores [B, HQ, N, N] summed over the real rows >= rows_from and each group."""
    rows = (kpos >= 0).double().clone()
    rows[:, :rows_from] = 0.0
    col = torch.einsum("bhij,bi->bhj", s, rows)
    return col.view(B, HKV, HQ // HKV, N).sum(2)


@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("case", ["h2o", "snapkv_window", "tova_last_row", "sliding", "alibi", "softcap"])
def test_column_scores_equal_the_materialised_reference(chunk, case):
    q, k, kpos = _inputs()
    scaling = D ** -0.5
    kw = {"window": 9} if case == "sliding" else {}
    if case == "alibi":
        kw["slopes"] = torch.tensor([2.0 ** -(h + 1) for h in range(HQ)])
    if case == "softcap":
        kw["softcap"] = 2.0
    rows_from = {"snapkv_window": N - 8, "tova_last_row": N - 1}.get(case, 0)
    got = attention.attention_column_scores(q, k, scaling, kpos=kpos, rows_from=rows_from, chunk_rows=chunk,
                                            **kw)
    want = _reference_sums(_reference_probs(q, k, kpos, scaling, **kw), kpos, rows_from)
    assert got.shape == (B, HKV, N)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    assert torch.all(got[:, :, : PADS[-1]][2] == 0)  # nothing ever attends to a pad


@pytest.mark.parametrize("chunk", CHUNKS)
def test_keyformer_noise_drawn_inside_each_block(chunk):
    """Keyformer's prompt score ``softmax(x + g)``, ``g = -log E`` with E the hash noise of (row, key)
    positions: each block draws its rows' noise; the reference takes the whole [HQ, N, N] field."""
    q, k, _ = _inputs(1)
    q, k = q[:1], k[:1]
    kpos = torch.arange(N).view(1, N)
    seed, layer = 7, 3
    scaling = D ** -0.5

    def score(p, a, r1):  # normalise(p / E) over the row: the policy's tau = 1 rule
        e = prompt_noise(seed, layer, a, r1, HQ, p.device).view(1, HKV, HQ // HKV, r1 - a, r1)
        s = p / e
        return s / s.sum(-1, keepdim=True)

    got = attention.attention_column_scores(q, k, scaling, kpos=kpos, score=score, chunk_rows=chunk)
    G = HQ // HKV
    x = torch.einsum("hid,hjd->hij", q[0].double(), k[0].double().repeat_interleave(G, dim=0)) * scaling
    g = -torch.log(prompt_noise(seed, layer, 0, N, HQ, q.device).double())
    causal = torch.ones(N, N, dtype=torch.bool).tril()
    s = torch.softmax((x + g).masked_fill(~causal, float("-inf")), dim=-1)
    want = s.sum(1).view(HKV, G, N).sum(1)
    torch.testing.assert_close(got[0].double(), want, rtol=1e-5, atol=1e-6)


def test_chunk_setting_is_validated():
    with pytest.raises(ValueError, match="chunk_rows=0 .*int >= 1"):
        attention.score_rows(1, 1, 8, chunk_rows=0)
    with pytest.raises(ValueError, match="chunk_rows='x'"):
        attention.score_rows(1, 1, 8, chunk_rows="x")
    assert attention.score_rows(1, 1, 8, chunk_rows=3) == 3


ATTENTION_READERS = sorted(name for name, cls in POLICIES.items() if "attention" in cls.reads)


def _prompt_state(model, ids, mask, name: str, rows: int, monkeypatch) -> tuple[list, list]:
    """Per layer, the positions held and their scores after the prompt forward and its cut."""
    monkeypatch.setattr(attention, "SCORE_ROWS", rows)
    cache = make_cache(model, make_policy(name, budget=0.5), mask, max_new_tokens=4, seed=3)
    with torch.inference_mode():
        model(input_ids=ids, attention_mask=mask, cache=cache, use_cache=True)
    if cache.defer_prompt_cut:
        cache.cut_prompt()
    pos = [lay.pos[:, :, : lay.length].clone() for lay in cache.layers]
    score = [lay.score[:, :, : lay.length].clone() for lay in cache.layers]
    return pos, score


@pytest.mark.parametrize("name", ATTENTION_READERS)
def test_engine_prompt_scores_do_not_depend_on_the_chunk(name, monkeypatch):
    model = tiny_model("llama")  # 4 query heads over 2 KV heads
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 200, (3, 45), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :7] = 0
    mask[2, :20] = 0
    whole_pos, whole_score = _prompt_state(model, ids, mask, name, 4096, monkeypatch)  # one block: the matrix
    for rows in (1, 7, 16):  # 7 and 16 do not divide 45
        pos, score = _prompt_state(model, ids, mask, name, rows, monkeypatch)
        for layer, (p, w) in enumerate(zip(pos, whole_pos, strict=True)):
            assert torch.equal(p, w), f"{name}: chunk {rows} keeps other tokens at layer {layer}"
        for s, w in zip(score, whole_score, strict=True):
            torch.testing.assert_close(s, w, rtol=1e-5, atol=1e-6)
