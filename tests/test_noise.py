"""Keyformer's counter-based noise: distribution, independence, coordinates, compiled == eager, per-sample
seeds."""

from __future__ import annotations

import pytest
import torch

from keyformer import generate, make_policy, tiny_model
from keyformer.core import noise as nz


def _field(seed: int = 1, layer: int = 0, n: int = 256, heads: int = 4) -> torch.Tensor:
    return nz.prompt_noise(seed, layer, 0, n, heads, "cpu")  # [heads, n, n]


def test_exp1_distribution_and_independence():
    e = _field()
    vals = e[:, torch.ones(256, 256, dtype=torch.bool).tril()].flatten()  # the causal triangle
    assert abs(vals.mean().item() - 1) < 0.01 and abs(vals.var().item() - 1) < 0.03
    for q, expected in ((0.5, 0.6931), (0.9, 2.3026), (0.99, 4.6052)):  # Exp(1) quantiles
        assert abs(vals.quantile(q).item() - expected) < 0.05 * expected
    g = -e.log()  # Gumbel: neighbours along every coordinate are uncorrelated
    pairs = [(g[:, 1:, :], g[:, :-1, :]), (g[:, :, 1:], g[:, :, :-1]), (g[1:], g[:-1]),
             (g, -_field(layer=1).log()), (g, -_field(seed=2).log())]
    for a, b in pairs:
        r = torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1]
        assert abs(r.item()) < 0.01


def test_decode_noise_is_the_prompt_noise_at_the_held_positions():
    seeds = nz.seeds_tensor([7, 8], "cpu")
    pos = torch.tensor([[[3, 0, 9, 11]], [[1, 5, -1, 12]]])  # [B, Hkv=1, S]; -1 is an empty slot
    cur = torch.tensor([11, 12])
    got = nz.noise_at(seeds, 2, cur, pos, group=3)  # [B, 1, 3, S]
    for b, (s, p) in enumerate(((7, 11), (8, 12))):
        row = nz.prompt_noise(s, 2, p, p + 1, 3, "cpu")[:, 0]  # [3 heads, p + 1]
        for j, kp in enumerate(pos[b, 0].tolist()):
            if kp >= 0:
                assert torch.allclose(got[b, 0, :, j], row[:, kp], rtol=1e-6)


def test_compiled_kernels_agree_with_eager(monkeypatch):
    """Inductor's kernels (the fallback where the native loop cannot be built) give the eager bits."""
    monkeypatch.setenv("KEYFORMER_COMPILE", "1")
    monkeypatch.setenv("KEYFORMER_NATIVE", "0")
    rk = (nz.row_keys(nz.seeds_tensor([3, 4], "cpu"), 5, torch.arange(6),
                      torch.arange(40).view(1, -1).repeat(2, 1)))
    ck = nz.col_keys(torch.arange(40)).view(1, 1, -1).expand(2, 1, -1)
    eager = nz.exp_noise(rk.unsqueeze(-1), ck.unsqueeze(2))
    fast = nz.exp_noise_fast(rk.unsqueeze(-1), ck.unsqueeze(2))
    assert torch.equal(fast, eager)
    pos = torch.randint(0, 40, (2, 2, 33))
    full = nz.noise_at(nz.seeds_tensor([3, 4], "cpu"), 5, torch.tensor([39, 39]), pos, 3)
    part = nz.noise_at(nz.seeds_tensor([3, 4], "cpu"), 5, torch.tensor([39, 39]), pos[..., :7], 3)
    assert torch.equal(full[..., :7], part)  # the value of an entry does not depend on the tensor's shape
    # really compiled
    assert nz._COMPILED.get("ok", True) and "at" in nz._COMPILED and "block" in nz._COMPILED
    monkeypatch.setenv("KEYFORMER_COMPILE", "0")
    assert torch.equal(nz.noise_at(nz.seeds_tensor([3, 4], "cpu"), 5, torch.tensor([39, 39]), pos, 3), full)


def test_per_sample_seeds():
    """Articles are independent draws: an article's output is the same alone and in any batch, and two
    articles' seeds give different noise (here: different kept sets for the same text)."""
    a, b = nz.sample_seed(0, "article-a"), nz.sample_seed(0, "article-b")
    assert a == nz.sample_seed(0, "article-a") and a != b and a != nz.sample_seed(1, "article-a")
    model = tiny_model("gptj")
    ids = torch.randint(3, 256, (1, 48), generator=torch.Generator().manual_seed(0))
    pol = make_policy("keyformer", budget=0.3)
    both = generate(model, ids.repeat(2, 1), None, pol, max_new_tokens=6, seeds=[a, b])
    alone = [generate(model, ids, None, pol, max_new_tokens=6, seeds=[s]) for s in (a, b)]
    swapped = generate(model, ids.repeat(2, 1), None, pol, max_new_tokens=6, seeds=[b, a])
    for li in range(2):
        kept = both.cache.kept_positions(li)
        assert (kept[0] == alone[0].cache.kept_positions(li)[0]
                and kept[1] == alone[1].cache.kept_positions(li)[0])
        assert swapped.cache.kept_positions(li) == kept[::-1]
    assert any(both.cache.kept_positions(li)[0] != both.cache.kept_positions(li)[1] for li in range(2))


@pytest.mark.parametrize("bad", [0, -1, True])
def test_noise_samples_validation(bad):
    with pytest.raises(ValueError, match="noise_samples"):
        make_policy("keyformer", noise_samples=bad)


def test_noise_samples_average_fields():
    """m = 2 averages two independent fields: it differs from either field alone, and m = 1 is the default."""
    model = tiny_model("llama")
    ids = torch.randint(3, 256, (1, 48), generator=torch.Generator().manual_seed(1))

    def kept(m: int) -> list:
        return [generate(model, ids, None, make_policy("keyformer", budget=0.3, noise_samples=m),
                         max_new_tokens=4, seed=9).cache.kept_positions(li) for li in range(2)]

    assert kept(1) == [generate(model, ids, None, make_policy("keyformer", budget=0.3), max_new_tokens=4,
                                seed=9).cache.kept_positions(li) for li in range(2)]
    assert kept(4) != kept(1)


def test_compiled_gumbel_score_agrees_with_eager(monkeypatch):
    from keyformer.core.policies.keyformer import gumbel_score

    # >= FUSE_MIN
    p = torch.softmax(torch.randn(2, 3, 2, 64, 400, generator=torch.Generator().manual_seed(0)), -1)
    e = -torch.rand(p.shape, generator=torch.Generator().manual_seed(1)).clamp(min=1e-7).log()
    from keyformer.core.policies.keyformer import FUSE_MIN

    assert p.numel() >= FUSE_MIN  # the compiled path is the one taken with KEYFORMER_COMPILE=1
    out = {}
    for flag in ("0", "1"):
        monkeypatch.setenv("KEYFORMER_COMPILE", flag)
        out[flag] = [gumbel_score(p.clone(), e, tau) for tau in (1.0, 1.7, 1.9)]  # two taus: one graph
    assert nz._COMPILED.get("ok", True) and "gumbel" in nz._COMPILED and "gumbel1" in nz._COMPILED
    for a, b in zip(out["0"], out["1"], strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-7)
        assert torch.allclose(a.sum(-1), torch.ones(()), atol=1e-5)


def test_exp_noise_is_never_zero():
    """The top hash value used to round u to 1 in fp32 (E = 0, score p / 0 = inf, NaN): one draw in 2**24,
    several per article at 512 tokens. Every 24-bit value must give a positive, finite draw."""
    from keyformer.core.noise import exp_of_hash

    h = torch.arange(2**24 - 4096, 2**24, dtype=torch.int64) << 8
    e = exp_of_hash(h)
    assert bool((e > 0).all()) and bool(e.isfinite().all())
    lo = exp_of_hash(torch.arange(0, 4096, dtype=torch.int64) << 8)  # the other end: large, finite draws
    assert bool(lo.isfinite().all()) and float(lo.max()) < 18.0


def test_compiler_failure_falls_back_to_eager_once_and_is_recorded(monkeypatch):
    """A compiled kernel that fails (here: a corrupt inductor cache's unloadable kernel, simulated) falls back
    to eager with one warning naming the reason, and :func:`kernel_record` says so (metrics.json's
    ``noise_kernel``); the values are the eager ones."""
    import warnings

    fail = []

    def fast_at(*args):  # stands in for the compiled kernel; fails once ``fail`` is set
        if fail:
            raise RuntimeError("backend='inductor' raised:\n...") from ImportError(
                "/tmp/torchinductor_root/x/y.so: invalid ELF header\nmore lines")
        return nz._noise_at(*args)

    monkeypatch.setenv("KEYFORMER_COMPILE", "1")
    monkeypatch.setenv("KEYFORMER_NATIVE", "0")  # the inductor kernels' fallback (the native loop's: below)
    monkeypatch.setattr(nz, "_COMPILED", {"at": fast_at})
    monkeypatch.setattr(nz, "_RAN", set())
    monkeypatch.setattr(nz, "_FALLBACK", [])
    seeds, cur, pos = nz.seeds_tensor([3, 4], "cpu"), torch.tensor([39, 39]), torch.randint(0, 40, (2, 2, 9))
    expected = nz._noise_at(seeds, torch.full((1,), 5), cur, pos, 3)
    assert nz.kernel_record() is None  # no noise drawn yet
    assert torch.equal(nz.noise_at(seeds, 5, cur, pos, 3), expected)
    assert nz.kernel_record() == {"kernels": ["compiled"], "fallback": None}
    fail.append(True)
    with pytest.warns(RuntimeWarning, match="invalid ELF header") as caught:
        got = nz.noise_at(seeds, 5, cur, pos, 3)
    assert len(caught) == 1 and "TORCHINDUCTOR_CACHE_DIR" in str(caught[0].message)
    assert torch.equal(got, expected)
    reason = ("RuntimeError: backend='inductor' raised: (from ImportError: /tmp/torchinductor_root/x/y.so: "
              "invalid ELF header)")
    assert nz.kernel_record() == {"kernels": ["compiled", "eager"], "fallback": reason}
    nz.reset_kernel_record()  # the next job of this process: eager from the start, the reason still given
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per process, not per call
        assert torch.equal(nz.noise_at(seeds, 5, cur, pos, 3), expected)
        rk, ck = nz.row_keys(seeds, 5, torch.arange(6), cur.view(-1, 1)), nz.col_keys(torch.arange(40))
        assert torch.equal(nz.exp_noise_fast(rk.unsqueeze(-1), ck.view(1, 1, 1, -1)),
                           nz.exp_noise(rk.unsqueeze(-1), ck.view(1, 1, 1, -1)))
    assert not nz.use_compile(pos) and nz.kernel_record() == {"kernels": ["eager"], "fallback": reason}


def test_eager_by_choice_is_recorded_without_a_fallback(monkeypatch):
    monkeypatch.setenv("KEYFORMER_COMPILE", "0")
    monkeypatch.setattr(nz, "_RAN", set())
    nz.noise_at(nz.seeds_tensor([1], "cpu"), 0, torch.tensor([3]), torch.arange(4).view(1, 1, 4), 2)
    assert nz.kernel_record() == {"kernels": ["eager"], "fallback": None}


def _mix_py(x: int) -> int:
    """The documented finaliser on Python ints (the reference for both lane widths)."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & 0xFFFFFFFF
    x = ((x >> 16) ^ x) * 0x45D9F3B & 0xFFFFFFFF
    return (x >> 16) ^ x


BACKENDS = {"native": ("1", "1"), "compiled": ("1", "0"), "eager": ("0", "0")}  # KEYFORMER_COMPILE, _NATIVE


def _backend(monkeypatch, name: str) -> None:
    compile_, native = BACKENDS[name]
    monkeypatch.setenv("KEYFORMER_COMPILE", compile_)
    monkeypatch.setenv("KEYFORMER_NATIVE", native)
    monkeypatch.setattr(nz, "_RAN", set())  # kernel_record() then names this test's kernels only


def _e_ref(h: torch.Tensor) -> torch.Tensor:
    """The documented draw of 32-bit hashes ``h`` (int64): the fp32 uniform of their top 24 bits, then
    ``-log`` in float64 (the exact value the fp32 polynomial must be within one ulp of)."""
    u = (((h >> 8) & 0xFFFFFF).to(torch.float32) + 0.5) * (1.0 / 16777216.0)
    return -torch.log(u.clamp(max=1.0 - 2.0**-24).double())


def _within_one_ulp(got: torch.Tensor, exact: torch.Tensor) -> bool:
    ulp = (torch.nextafter(got, torch.tensor(float("inf"))) - got).double()
    return bool(((got.double() - exact).abs() < ulp).all())


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_hash_in_int32_lanes_equals_the_python_int_reference(monkeypatch, backend):
    """The per-entry hash runs in int32 lanes: its bits equal the 32-bit formula computed on Python ints, for
    keys with the top bit set too, and every draw is within one ulp of the exact ``-log`` of its uniform, on
    every backend; the backends give the same bits."""
    _backend(monkeypatch, backend)
    g = torch.Generator().manual_seed(0)
    rk = torch.randint(0, 2**32, (2, 3, 40, 1), generator=g)  # [B, H, r, 1] int64 keys
    ck = torch.randint(0, 2**32, (2, 1, 1, 64), generator=g)
    rk[0, 0, :4, 0] = torch.tensor([0, 2**31 - 1, 2**31, 2**32 - 1])
    ck[0, 0, 0, :4] = torch.tensor([2**32 - 1, 2**31, 0, 2**16])
    want_h = torch.tensor([[_mix_py(a ^ c) for c in ck.flatten(1)[b].tolist()] for b in range(2)
                           for a in rk[b].flatten().tolist()]).view(2, 3, 40, 64)
    assert torch.equal(nz.mix32(nz.lanes32(rk) ^ nz.lanes32(ck)).to(torch.int64) & 0xFFFFFFFF, want_h)
    got = nz.exp_noise_fast(rk, ck)
    assert nz.kernel_record()["kernels"] == [backend]  # the backend asked for ran
    assert _within_one_ulp(got, _e_ref(want_h))
    assert torch.equal(got, nz.exp_noise(rk, ck))


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_column_keys_in_int32_lanes_equal_the_python_int_reference(monkeypatch, backend):
    """The decode step hashes key positions in int32 lanes: their keys, and the step's noise, equal the
    documented formula on Python ints, up to the largest int32 position, on every backend."""
    _backend(monkeypatch, backend)
    pos = [0, 1, 2, 4095, 65535, 2**20 + 7, 2**31 - 2, 2**31 - 1]
    want = torch.tensor([_mix_py((p * 0xC2B2AE3D + 0x5BD1E995) & 0xFFFFFFFF) for p in pos])
    assert torch.equal(nz.col_keys(torch.tensor(pos)), want)
    assert torch.equal(nz.col_keys(torch.tensor(pos, dtype=torch.int32)).to(torch.int64) & 0xFFFFFFFF, want)
    seeds, cur = nz.seeds_tensor([5, 2**40 + 3], "cpu"), torch.tensor([2**31 - 1, 9])
    kpos = torch.tensor(pos).repeat(2, 2, 1)  # [B=2, Hkv=2, S=8]
    rk = nz.row_keys(seeds, 4, torch.arange(6), cur.view(-1, 1))  # [2, 6, 1] int64
    h = torch.tensor([[[_mix_py(a ^ c) for c in want.tolist()] for a in rk[b, :, 0].tolist()]
                      for b in range(2)])
    got = nz.noise_at(seeds, 4, cur, kpos, 3)
    assert nz.kernel_record()["kernels"] == [backend]
    assert _within_one_ulp(got, _e_ref(h).view(2, 2, 3, 8))  # heads hkv * G + g, G = 3
    monkeypatch.setenv("KEYFORMER_COMPILE", "0")
    assert torch.equal(got, nz.noise_at(seeds, 4, cur, kpos, 3))


def test_the_log_polynomial_is_within_one_ulp_on_every_uniform():
    """All 2**24 uniforms the hash makes: ``-log`` within one ulp of the float64 value (max 0.83 ulp;
    torch.log's own is 0.91 here), eager equal to compiled."""
    h = torch.arange(2**24, dtype=torch.int64) << 8
    got = nz.exp_of_hash(h)
    assert _within_one_ulp(got, _e_ref(h))
    assert torch.equal(torch.compile(nz.exp_of_hash, dynamic=True)(h), got)


def _fresh_native(monkeypatch, tmp_path, cc: str | None = None) -> None:
    from keyformer.core import noise_native

    monkeypatch.setattr(noise_native, "_LIB", [])
    monkeypatch.setattr(noise_native, "_FAILURE", [])
    monkeypatch.setenv("KEYFORMER_CACHE_DIR", str(tmp_path))
    if cc is not None:
        monkeypatch.setenv("CC", cc)
    _backend(monkeypatch, "native")


def test_native_loop_equals_eager_bit_for_bit(monkeypatch, tmp_path):
    """The C loop on every 24-bit uniform (through the hash), on decode steps with empty slots (-1), strided
    positions, per-row layers, several draws and seeds with high bits, and on a prompt block, each in one
    call and split over three threads: the eager bits every time."""
    from keyformer.core import noise_native

    _fresh_native(monkeypatch, tmp_path)
    lib = noise_native.load(nz.HASH_CONSTANTS)
    assert lib is not None, noise_native.failure()
    h = nz.lanes32(torch.arange(2**24, dtype=torch.int64) << 8)
    assert torch.equal(noise_native.outer(lib, h.view(1, -1), torch.zeros(1, 1, dtype=torch.int32)).view(-1),
                       nz.exp_of_hash(nz.mix32(h)))
    g = torch.Generator().manual_seed(0)
    seeds = nz.seeds_tensor([3, 2**40 + 5, 2**32 - 1], "cpu")
    cur = torch.tensor([5000, 77, 2**31 - 1])
    pos = torch.randint(-1, 6000, (3, 2, 900), generator=g)
    cases = ((5, pos, 0), (torch.tensor([1, 0, 29]), pos, 1), (2, pos[:, :, 100:613], 2))
    want = [nz._noise_at(nz.draw_seeds(seeds, draw), layer if isinstance(layer, torch.Tensor) else
                         torch.full((1,), layer), cur, kpos.contiguous(), 4) for layer, kpos, draw in cases]
    rk = nz.row_keys(seeds[:1], 3, torch.arange(8), torch.arange(64, 160).view(1, -1)).view(1, 2, 4, 96, 1)
    ck = nz.col_keys(torch.arange(160)).view(1, 1, 1, 1, -1)
    threads = torch.get_num_threads()
    for split in (False, True):
        if split:
            monkeypatch.setattr(noise_native, "SPLIT_MIN", 1)
        try:
            torch.set_num_threads(3 if split else 1)  # three slices of the rows, whatever the machine
            got = [nz.noise_at(seeds, layer, cur, kpos, 4, draw) for layer, kpos, draw in cases]
            block = nz.exp_noise_fast(rk, ck)
        finally:
            torch.set_num_threads(threads)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        assert torch.equal(block, nz.exp_noise(rk, ck))
    assert nz.kernel_record() is not None and "native" in nz.kernel_record()["kernels"]
    assert (tmp_path / "native").is_dir() and len(list((tmp_path / "native").glob("*.so"))) == 1  # cached


def test_fused_prompt_score_is_the_gumbel_score_of_the_same_noise(monkeypatch, tmp_path):
    """:func:`nz.gumbel_fast` (the prompt's score at tau = 1 without the noise field) against a float64
    ``normalise(p / E)`` built from the eager noise: on a row slice of a softmax block (as the prompt loop
    passes it), per-sample column keys and shared ones, row lengths that are and are not multiples of its 16
    sum lanes, one call and split over three threads; in place; None (and ``probs`` untouched) for a layout
    it cannot walk."""
    from keyformer.core import noise_native

    _fresh_native(monkeypatch, tmp_path)
    g = torch.Generator().manual_seed(5)
    seeds = nz.seeds_tensor([3, 2**40 + 5], "cpu")
    threads = torch.get_num_threads()
    for c, shared, split in ((160, False, False), (37, True, False), (1, False, False), (211, False, True)):
        r = min(c, 24)
        rk = nz.row_keys(seeds, 3, torch.arange(6), torch.arange(c - r, c).view(1, -1).expand(2, -1))
        rk = rk.view(2, 2, 3, r, 1)
        ck = nz.col_keys(torch.arange(c)).view(1, 1, 1, 1, -1)
        if not shared:
            ck = torch.cat([ck, nz.col_keys(torch.arange(c) * 7 + 1).view(1, 1, 1, 1, -1)])
        block = torch.softmax(torch.randn(2, 2, 3, r + 5, c, generator=g) * 4, dim=-1)
        probs = block[:, :, :, 5:]  # the scored rows of a block: a view with a plane stride
        w = probs.double() / nz.exp_noise(rk, ck).double()
        want = w / w.sum(-1, keepdim=True)
        if split:
            monkeypatch.setattr(noise_native, "SPLIT_MIN", 1)
        try:
            torch.set_num_threads(3 if split else 1)
            got = nz.gumbel_fast(rk, ck, probs)
        finally:
            torch.set_num_threads(threads)
        assert got is not None and got.data_ptr() == probs.data_ptr()
        torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-12)
    rk = nz.row_keys(seeds, 3, torch.arange(6), torch.arange(4).view(1, -1).expand(2, -1)).view(2, 2, 3, 4, 1)
    ck = nz.col_keys(torch.arange(8)).view(1, 1, 1, 1, -1)
    odd = torch.rand(2, 3, 2, 4, 8).transpose(1, 2)  # [2, 2, 3, 4, 8] whose planes do not flatten
    before = odd.clone()
    assert nz.gumbel_fast(rk, ck, odd) is None and torch.equal(odd, before)
    assert nz.gumbel_fast(rk, ck, odd.contiguous().double()) is None


def test_native_build_failure_falls_back_to_the_compiled_kernels(monkeypatch, tmp_path):
    """No C compiler: the native loop is not used, :func:`noise_native.failure` says why, and the noise
    (from inductor's kernels) is the same."""
    from keyformer.core import noise_native

    _fresh_native(monkeypatch, tmp_path, cc=str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(nz, "_RAN", set())
    seeds, cur, pos = nz.seeds_tensor([3], "cpu"), torch.tensor([39]), torch.randint(0, 40, (1, 2, 9))
    got = nz.noise_at(seeds, 5, cur, pos, 3)
    assert noise_native.load(nz.HASH_CONSTANTS) is None and "no-such-cc" in noise_native.failure()
    assert nz.kernel_record()["kernels"] == ["compiled"]
    assert torch.equal(got, nz._noise_at(seeds, torch.full((1,), 5), cur, pos, 3))


@pytest.mark.slow
def test_noise_kernels_script_runs(tmp_path, monkeypatch):
    """scripts/noise_kernels.py (the timing behind results/bench/noise_kernels.txt) runs: it checks the
    native kernels equal inductor's (and within one ulp of torch.log's) before timing them."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "KEYFORMER_COMPILE": "1"}  # what runs use on CPU (the suite's default is eager)
    subprocess.run([sys.executable, str(root / "scripts" / "noise_kernels.py"), "--quick", "--pairs", "1",
                    "--out", str(tmp_path / "t.txt")], check=True, cwd=root, env=env)
    rows = [x.split() for x in (tmp_path / "t.txt").read_text().splitlines() if x[:1] != "#"]
    assert [r[0] for r in rows] == ["kernel", "decode", "block"] and all(float(r[-7]) > 0 for r in rows[1:])


def test_a_generation_on_the_native_noise_equals_the_eager_one(monkeypatch, tmp_path):
    """End to end: Keyformer (per-sample seeds, batch 2, the steady all-layers step and the prompt blocks) on
    the native loop accumulates the same scores (every draw enters them), keeps the same tokens and generates
    the same text as on the eager kernels: bit for bit with the noise materialised, and within fp32 rounding
    of the normaliser with the prompt's fused score (:func:`keyformer.core.noise.gumbel_fast`, which must
    run)."""
    model = tiny_model("llama")
    ids = torch.randint(3, 256, (2, 40), generator=torch.Generator().manual_seed(3))
    pol = make_policy("keyformer", budget=0.4)
    fused_calls = []
    fused = nz.gumbel_fast

    def counted(*args):
        out = fused(*args)
        fused_calls.append(out is not None)
        return out

    def run():
        out = generate(model, ids, None, pol, max_new_tokens=8, seeds=[11, 2**33 + 1])
        scores = [lay.score.clone() for lay in out.cache.layers]
        return out.sequences.tolist(), [out.cache.kept_positions(li) for li in range(2)], scores

    _fresh_native(monkeypatch, tmp_path)
    monkeypatch.setattr(nz, "gumbel_fast", counted)
    fused_run = run()
    assert fused_calls and all(fused_calls)  # every prompt block scored by the fused loop
    with nz.fused_score(False):
        native_run = run()
    assert nz.kernel_record()["kernels"] == ["native"]
    _backend(monkeypatch, "eager")
    eager_run = run()
    assert nz.kernel_record()["kernels"] == ["eager"]
    assert eager_run[:2] == native_run[:2] == fused_run[:2]
    assert all(torch.equal(a, b) for a, b in zip(eager_run[2], native_run[2], strict=True))
    for a, b in zip(eager_run[2], fused_run[2], strict=True):
        torch.testing.assert_close(b, a, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("tau", [0.5, 1.37, 2.0])
def test_gumbel_score_power_is_within_fp32_rounding(tau):
    """The decode step's eager score ``normalise((p / E) ** (1 / tau))`` (on CPU the power is
    ``exp(log(w) / tau)``) against float64: within a few ulp, masked entries (p = 0) exactly 0, rows summing
    to 1."""
    from keyformer.core.policies.keyformer import gumbel_score

    g = torch.Generator().manual_seed(7)
    logits = torch.randn(4, 3, 3, 1, 257, generator=g) * 6
    logits[..., 200:] = float("-inf")  # empty slots
    p = torch.softmax(logits, dim=-1)
    E = torch.rand(p.shape, generator=g) * 17 + 3e-8
    got = gumbel_score(p.clone(), E, tau)
    w = (p.double() / E.double()) ** (1 / tau)
    want = w / w.sum(-1, keepdim=True)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=0)
    assert torch.equal(got[..., 200:], torch.zeros_like(got[..., 200:]))
