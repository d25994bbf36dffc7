"""Keyformer's noise: a counter-based function of (seed, layer, query position, key position, head).

Keyformer adds Gumbel(0, 1) noise ``g`` to the logits. We use ``E ~ Exp(1)`` with ``g = -log E``:
``softmax((x + g) / tau) = normalise((softmax(x) / E) ** (1 / tau))`` (see
:class:`keyformer.core.policies.KeyformerPolicy`).

Each value is a hash of its coordinates, not a draw from a stateful generator, so it is computed only where it
is needed: at the entries a forward actually scores (the held slots at a decode step, the causal triangle of
the prompt). It does not depend on the batch, padding, slot layout, simulation mode or device type:

    key(b, l, h, p) = mix(mix(mix(seed_b * C1 + l * C2) ^ h * C3) ^ p * C4)     one per (sample, head, query)
    u = (mix(key ^ colkey(j)) >> 8 + 0.5) / 2**24,   E = -log(u)                  per key position j

``mix`` is a 32-bit integer finaliser (two multiply-xorshift rounds). Keys are int64 tensors holding values in
[0, 2**32); the per-entry hash (``mix(key ^ colkey)``, the bulk of the work) runs in int32 lanes holding the
same bits, since every step is mod 2**32: the same values (tested against a Python-int reference), and CPUs
without AVX-512 have no 64-bit vector multiply. The 24-bit uniform gives ``E`` in [2.9e-8, 17.3].

``-log(u)`` is a fixed fp32 polynomial (Cephes' ``logf``, under 1 ulp from the exact value over all 2**24
uniforms), not the platform's ``log``: so eager, compiled (inductor), native
(:mod:`keyformer.core.noise_native`, a C loop) and GPU evaluation give the same bits, and the native loop can
inline it. The noise stream changed twice: in the fast-core rewrite (it was numpy PCG64 / torch generator
draws before), and in the last bit of some draws when ``log`` became this polynomial (2026-12-02; before,
compiled and eager could differ there).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import warnings

import torch

from . import noise_native as native

M32 = 0xFFFFFFFF
U_MAX = native.U_MAX  # the largest fp32 below 1 (the native loop's cap too)
C1, C2, C3, C4, C5 = 0x9E3779B1, 0x85EBCA77, 0x27D4EB2F, 0x165667B1, 0xC2B2AE3D
HASH_CONSTANTS = (C1, C2, C3, C4, C5)  # what the native loop is built with
_C5_LANES = C5 - 2**32  # C5's bits as a signed int32 constant


def mix32(x: torch.Tensor) -> torch.Tensor:
    """32-bit avalanche finaliser on int64 tensors holding values in [0, 2**32), or on int32 tensors holding
    the same bits (:func:`lanes32`): multiplies wrap mod 2**32 there, and masks make the right shifts
    logical."""
    if x.dtype == torch.int32:
        x = (((x >> 16) & 0xFFFF) ^ x) * 0x45D9F3B
        x = (((x >> 16) & 0xFFFF) ^ x) * 0x45D9F3B
        return ((x >> 16) & 0xFFFF) ^ x
    x = ((x >> 16) ^ x) * 0x45D9F3B & M32
    x = ((x >> 16) ^ x) * 0x45D9F3B & M32
    return (x >> 16) ^ x


def seed32(seed: int) -> int:
    """Any Python int folded to 32 bits."""
    s = int(seed)
    return ((s & M32) ^ ((s >> 32) & M32) ^ ((s >> 64) & M32)) & M32


def row_keys(seeds: torch.Tensor, layer: int | torch.Tensor, heads: torch.Tensor,
             qpos: torch.Tensor) -> torch.Tensor:
    """Keys of query rows: ``seeds`` [B], ``layer`` an int or [B], ``heads`` [Hq], ``qpos`` [B, r] -> [B, Hq,
    r]."""
    if isinstance(layer, torch.Tensor):
        layer = layer.view(-1, 1)
    base = mix32((seeds.view(-1, 1) * C1 + layer * C2) & M32)  # [B, 1]
    hk = mix32(base ^ (heads.view(1, -1) * C3 & M32))  # [B, Hq]
    return mix32(hk.unsqueeze(-1) ^ (qpos.unsqueeze(1) * C4 & M32))


def col_keys(kpos: torch.Tensor) -> torch.Tensor:
    """Keys of key positions (any shape): int64 positions give int64 keys in [0, 2**32); int32 positions give
    the same 32 bits in int32 lanes (the decode step's path: no 64-bit multiply)."""
    if kpos.dtype == torch.int32:
        return mix32(kpos * _C5_LANES + 0x5BD1E995)
    return mix32((kpos * C5 + 0x5BD1E995) & M32)


def lanes32(x: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2**32) as int32 with the same 32 bits (values >= 2**31 read as negative); int32
    tensors as they are."""
    return x if x.dtype == torch.int32 else x.to(torch.int32)


def exp_noise(rkey: torch.Tensor, ckey: torch.Tensor) -> torch.Tensor:
    """Exp(1) noise of broadcast (row key, column key) pairs (int64 keys), fp32; hashed in int32 lanes."""
    return exp_of_hash(mix32(lanes32(rkey) ^ lanes32(ckey)))


def exp_of_hash(h: torch.Tensor) -> torch.Tensor:
    """Exp(1) draws from 32-bit hashes (their top 24 bits; int64 in [0, 2**32) or int32 bits), fp32, > 0."""
    u = (((h >> 8) & 0xFFFFFF).to(torch.float32) + 0.5) * (1.0 / 16777216.0)
    # (2**24 - 1) + 0.5 rounds to 2**24 in fp32, so u would be 1 and E = 0 (score p / 0 = inf, then NaN) once
    # in 2**24 draws; the largest u below 1 gives E = 6e-8 (Gumbel g = 16.6) and leaves every other draw
    # unchanged
    return neg_log_unit(u.clamp_(max=U_MAX))


def neg_log_unit(u: torch.Tensor) -> torch.Tensor:
    """``-log(u)`` for fp32 ``u`` in (0, 1) (normal numbers): ``u = m 2**e``, ``m`` in [sqrt(1/2), sqrt(2)),
    ``log u = e log 2 + log m`` with Cephes' polynomial for ``log m``; every operation an fp32 one, in the
    order of the native loop (:mod:`keyformer.core.noise_native`), so every backend gives the same bits."""
    bits = u.view(torch.int32)
    e = ((bits >> 23) & 0xFF) - 126
    m = ((bits & 0x7FFFFF) | 0x3F000000).view(torch.float32)  # [1/2, 1)
    small = m < native.SQRTHF
    e = (e - small.to(torch.int32)).to(torch.float32)
    x = torch.where(small, m + m, m) - 1.0
    z = x * x
    y = x * native.LOG_P[0]
    for p in native.LOG_P[1:]:
        y = (y + p) * x
    y = y * z + e * native.LOG_Q1
    y = y + z * -0.5
    return -((x + y) + e * native.LOG_Q2)


def draw_seeds(seeds: torch.Tensor, draw: int) -> torch.Tensor:
    """Seeds of the ``draw``-th independent noise field (draw 0: the seeds themselves)."""
    return seeds if draw == 0 else mix32((seeds ^ (draw * 0x632BE5AB)) & M32)


def noise_at(seeds: torch.Tensor, layer: int | torch.Tensor, qpos: torch.Tensor, kpos: torch.Tensor,
             group: int,
             draw: int = 0) -> torch.Tensor:
    """Noise of one query per row at given key positions (a decode step over its held slots).

    ``seeds`` [B]; ``layer`` an int or [B] per row; ``qpos`` [B]; ``kpos`` [B, Hkv, S] -> [B, Hkv, G, S] for
    query heads ``hkv * G + g``. About 50 small integer ops: on CPU one native loop
    (:mod:`keyformer.core.noise_native`), else one fused compiled kernel (see :func:`exp_noise_fast`); an
    entry's value does not depend on the shape it is computed in."""
    if not isinstance(layer, torch.Tensor):  # a tensor, so that there is no recompilation per layer
        layer = torch.full((1,), layer, dtype=torch.long, device=kpos.device)
    lib = _native(kpos)
    if lib is not None:
        return native.at(lib, draw_seeds(seeds, draw), layer, qpos, kpos, group)
    fn = compiled("at", _noise_at) if use_compile(kpos) else _eager(_noise_at)
    return fn(draw_seeds(seeds, draw), layer, qpos, kpos, group)


def _noise_at(seeds, layer_t, qpos, kpos, group: int):
    B, Hkv, S = kpos.shape
    rk = row_keys(seeds, layer_t, torch.arange(Hkv * group, device=kpos.device), qpos.view(-1, 1))
    # positions (< 2**31) enter int32 lanes before their keys are hashed: 1.2-1.4x on this kernel, compiled
    return exp_noise(rk.view(B, Hkv, group, 1), col_keys(kpos.clamp(min=0).to(torch.int32)).unsqueeze(2))


def sample_seed(seed: int, sample_id: object) -> int:
    """A sample's own noise seed from the run seed and its id: samples are independent draws, and a sample's
    noise does not depend on its batch or its place in the dataset."""
    h = int.from_bytes(hashlib.blake2b(f"{int(seed)}:{sample_id}".encode(), digest_size=8).digest(), "little")
    return h & M32


def seeds_tensor(seeds: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor([seed32(s) for s in seeds], dtype=torch.long, device=device)


def prompt_noise(seed: int, layer: int, r0: int, r1: int, heads: int, device: torch.device) -> torch.Tensor:
    """Noise of unpadded prompt rows [r0, r1) over keys [0, r1): [heads, r1 - r0, r1] (a reference
    accessor)."""
    rows = torch.arange(r0, r1, device=device)
    rk = (row_keys(seeds_tensor([seed], device), layer, torch.arange(heads, device=device),
                   rows.view(1, -1))[0])
    return exp_noise(rk.unsqueeze(-1), col_keys(torch.arange(r1, device=device)).view(1, 1, -1))


def decode_noise(seed: int, p: int, layers: int, heads: int, device: torch.device) -> torch.Tensor:
    """Noise of the query at position ``p`` over keys [0, p], every layer: [layers, p + 1, heads]
    (reference)."""
    return (torch.stack([prompt_noise(seed, layer, p, p + 1, heads, device)[:, 0].t()
                         for layer in range(layers)]))


_COMPILED: dict[str, object] = {}
_RAN: set[str] = set()  # "compiled" / "eager": what the kernels ran as since reset_kernel_record()
_FALLBACK: list[str] = []  # why this process fell back to eager (the first failure), else empty


def _native(t: torch.Tensor):
    """The native noise library where the compiled kernels would run (CPU, ``KEYFORMER_COMPILE`` on) and
    ``KEYFORMER_NATIVE`` is not 0; None else, or when it cannot be built (the compiled kernels then run)."""
    if not (use_compile(t) and native.enabled()):
        return None
    lib = native.load(HASH_CONSTANTS)
    if lib is not None:
        _RAN.add("native")
    return lib


def use_compile(t: torch.Tensor) -> bool:
    """Whether CPU kernels on ``t`` run compiled (``KEYFORMER_COMPILE``, default on; off after a failure)."""
    return (t.device.type == "cpu" and os.environ.get("KEYFORMER_COMPILE", "1") != "0"
            and _COMPILED.get("ok", True))


def kernel_record() -> dict | None:
    """What the noise kernels (:func:`noise_at`, :func:`exp_noise_fast` and the compiled Gumbel score) ran
    as in this process since :func:`reset_kernel_record`: None when none ran, else ``{"kernels": [...],
    "fallback": ...}``: the kernels any of ``native`` (the C loop), ``compiled`` (inductor: the Gumbel
    score of a prompt block at tau != 1, and noise and score where the native loop cannot be built) and
    ``eager``; the fallback null or why the compiled kernels failed (exception type and first line;
    process-wide: once failed, every later call is eager). Eager without a fallback: by choice (a device
    other than CPU, ``KEYFORMER_COMPILE=0``). Every kernel gives the same noise bits (tested); the native
    and compiled Gumbel scores of a prompt block can differ from eager in the last bit (the normaliser's
    sum order)."""
    if not _RAN:
        return None
    return {"kernels": sorted(_RAN), "fallback": _FALLBACK[0] if _FALLBACK and "eager" in _RAN else None}


def reset_kernel_record() -> None:
    """Start a new :func:`kernel_record` (one per job); a fallback stays: it holds for the whole process."""
    _RAN.clear()


def _eager(fn):
    _RAN.add("eager")
    return fn


def compiled(name: str, fn):
    """``torch.compile(fn, dynamic=True)``, made once per name, falling back to ``fn`` on any compiler
    error."""
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=True)
    return _guarded(_COMPILED[name], fn)


def failure_reason(e: BaseException) -> str:
    """``Type: first line`` of an exception, and of the compiler error it wraps (``BackendCompilerFailed``
    holds the real one, e.g. a C++ compile error or an unloadable kernel from a corrupt inductor cache)."""
    def one(x: BaseException) -> str:
        first = next((line.strip() for line in str(x).splitlines() if line.strip()), "")
        return f"{type(x).__name__}: {first}"[:300]

    inner = getattr(e, "inner_exception", None) or e.__cause__
    return one(e) + (f" (from {one(inner)})" if inner is not None and inner is not e else "")


def _guarded(fast, eager):
    def call(*args):
        if not _COMPILED.get("ok", True):
            return _eager(eager)(*args)
        try:
            out = fast(*args)
        except Exception as e:  # noqa: BLE001 - any compiler failure: eager is always correct
            _COMPILED["ok"] = False  # once per process: every later call runs eager
            _FALLBACK.append(failure_reason(e))
            warnings.warn(f"Keyformer's compiled noise kernels failed ({_FALLBACK[0]}); this process now "
                          f"runs them eager (the same noise; the Gumbel score can differ in the last bit) "
                          f"(recorded as metrics.json's noise_kernel). A known cause: an inductor cache "
                          f"(TORCHINDUCTOR_CACHE_DIR) corrupted by processes compiling into it at once.",
                          RuntimeWarning, stacklevel=3)
            return _eager(eager)(*args)
        _RAN.add("compiled")
        return out

    return call


def exp_noise_fast(rkey: torch.Tensor, ckey: torch.Tensor) -> torch.Tensor:
    """:func:`exp_noise` of ``rkey`` [B, ..., r, 1] and ``ckey`` [B, 1, ..., c] for large blocks (the prompt's
    causal triangle): on CPU one native loop (:mod:`keyformer.core.noise_native`, split over the torch thread
    count), else one fused compiled loop (about 10x fewer passes over memory than eager); eager on other
    devices, with ``KEYFORMER_COMPILE=0``, or when no compiler is available. Every path gives the same
    bits."""
    shape = torch.broadcast_shapes(rkey.shape, ckey.shape)
    if not use_compile(rkey):
        return _eager(exp_noise)(rkey, ckey)
    B, c = shape[0], shape[-1]
    lib = _native(rkey)
    if lib is not None:
        return native.outer(lib, *_native_keys(rkey, ckey, shape)).view(shape)
    r2 = lanes32(rkey.expand(*shape[:-1], 1).reshape(B, -1, 1))  # [B, M, 1]: few graphs (B == 1 or not)
    # int32 keys in: the fused loop then reads and hashes 32-bit lanes only
    return compiled("block", exp_noise)(r2, lanes32(ckey.reshape(B, 1, c))).view(shape)



def _native_keys(rkey: torch.Tensor, ckey: torch.Tensor,
                 shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    """Row keys [B, M] and column keys [B or 1, c] as int32 lanes, as the native loops take them."""
    B, c = shape[0], shape[-1]
    return lanes32(rkey.expand(*shape[:-1], 1).reshape(B, -1)), lanes32(ckey.reshape(ckey.shape[0], c))


_FUSED = [True]  # the prompt's fused native score in use (fused_score(False): the noise field materialised)


@contextlib.contextmanager
def fused_score(enabled: bool):
    """Within the block, :func:`gumbel_fast` is used (True, the default) or not (False: the noise field is
    materialised, as where the native loop is not available; ``keyformer-bench --floors`` times both)."""
    before = _FUSED[0]
    _FUSED[0] = enabled
    try:
        yield
    finally:
        _FUSED[0] = before


def gumbel_fast_available(t: torch.Tensor) -> bool:
    """Whether :func:`gumbel_fast` runs for tensors like ``t`` (checked once per prompt block, before any
    key is computed for it)."""
    return _FUSED[0] and use_compile(t) and native.enabled() and _native(t) is not None


def gumbel_fast(rkey: torch.Tensor, ckey: torch.Tensor, probs: torch.Tensor) -> torch.Tensor | None:
    """Keyformer's score at tau = 1, ``normalise(probs / E)`` over the last axis with ``E`` the noise of
    :func:`exp_noise_fast` ``(rkey, ckey)``, in place on ``probs`` (fp32, the broadcast shape), as one native
    loop that never writes the noise field (a prompt block's: 2.3 G entries at a 4k prompt); None where that
    loop is not in use (:func:`gumbel_fast_available`) or ``probs``' layout does not suit it (then the caller
    materialises the noise). The division gives the same bits as ``probs / E``; the normaliser's sum is taken
    in another order than torch's (last-bit differences, as the compiled score's)."""
    shape = torch.broadcast_shapes(rkey.shape, ckey.shape)
    if probs.shape != shape or not gumbel_fast_available(rkey):
        return None
    return native.outer_gumbel(native.load(HASH_CONSTANTS), *_native_keys(rkey, ckey, shape), probs)
