"""Keyformer's noise as one C loop: the hash and ``E = -log(u)`` of :mod:`keyformer.core.noise`, compiled once
per machine with the system C compiler and called through ``ctypes``.

Why: inductor's fused kernel for the same formula is slow on an AVX2 host (its int32 vectors round-trip
through the stack, and ``log`` is an out-of-line call); this loop, auto-vectorised by gcc with the log as an
inline polynomial, is faster (``scripts/noise_kernels.py`` measures both side by side,
``results/bench/noise_kernels.txt``). The values are bit-identical to :func:`keyformer.core.noise.exp_noise`
evaluated eagerly: the same 32-bit hash, the same fp32 operations in the same order (``-ffp-contract=off``:
no fused multiply-adds), the constants as the exact fp32 values the tensor code uses (tested on every one of
the 2**24 uniforms).

Three entry points, the first two filling a contiguous fp32 output:

* :func:`outer` ``(rk [N, R] int32 bits, ck [N or 1, C] int32 bits) -> [N, R, C]``: ``E(mix(rk ^ ck))`` (the
  prompt's causal blocks; split over ``torch.get_num_threads()`` Python threads when large: ``ctypes``
  releases the GIL);
* :func:`at` ``(seeds [B], layer [B], qpos [B], kpos [B, Hkv, S] int64, G) -> [B, Hkv, G, S]``: a decode
  step's noise at the held slots, row and column keys included (:func:`keyformer.core.noise.noise_at`);
* :func:`outer_gumbel` ``(rk, ck, probs)``: Keyformer's prompt score at tau = 1, ``normalise(probs / E)`` with
  the noise of :func:`outer`, in place, without writing the noise field.

:func:`load` returns None (and says why once, in :func:`failure`) when there is no compiler or the build
fails; callers then use the torch kernels. ``KEYFORMER_NATIVE=0`` turns it off. The library's SHA-256 is
recorded beside it when built (``<name>.so.sha256``) and checked before every load: a damaged or unrecorded
one is never loaded (a truncated library can kill the process with a bus error) but rebuilt, with one line on
stderr.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import struct
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

# the polynomial of -log(u), u in (0, 1): Cephes' logf (max error < 1 ulp over every u the hash makes, tested)
SQRTHF = 0.707106781186547524
LOG_P = (7.0376836292E-2, -1.1514610310E-1, 1.1676998740E-1, -1.2420140846E-1, 1.4249322787E-1,
         -1.6668057665E-1, 2.0000714765E-1, -2.4999993993E-1, 3.3333331174E-1)
LOG_Q1, LOG_Q2 = -2.12194440e-4, 0.693359375
U_MAX = 1.0 - 2.0**-24
SPLIT_MIN = 1 << 20  # entries from which outer() splits over threads


def f32(x: float) -> float:
    """``x`` rounded to fp32, as a Python float (what a tensor op does to a Python scalar)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _c(x: float) -> str:
    return f"{f32(x).hex()}f"  # exact: hex floats, no decimal-to-float rounding of their own


_SOURCE = r"""
#include <stdint.h>
#include <string.h>

static inline uint32_t mix32(uint32_t x) {
    x = ((x >> 16) ^ x) * 0x45D9F3Bu;
    x = ((x >> 16) ^ x) * 0x45D9F3Bu;
    return (x >> 16) ^ x;
}

/* Branch-free, so that gcc vectorises the loops: min of positive floats as min of their bits (they order
   alike), and m or 2m as m + m * small. U_MAX_24 = U_MAX * 2**24: clamping before the exact * 2**-24. */
static inline float e_of_hash(uint32_t h) {
    float v = (float)(int32_t)((h >> 8) & 0xFFFFFFu) + 0.5f;
    int32_t vb, cb; float cap = U_MAX_24;
    memcpy(&vb, &v, 4); memcpy(&cb, &cap, 4);
    vb = vb < cb ? vb : cb;
    memcpy(&v, &vb, 4);
    float u = v * 0x1p-24f;
    int32_t b; memcpy(&b, &u, 4);
    int32_t e = ((b >> 23) & 0xFF) - 126;
    int32_t mb = (b & 0x7FFFFF) | 0x3F000000;
    float m; memcpy(&m, &mb, 4);
    int32_t small = m < SQRTHF;
    e = e - small;
    float ef = (float)e;
    float x = (m + m * (float)small) - 1.0f;
    float z = x * x;
    float y = x * P0;
    y = y + P1; y = y * x; y = y + P2; y = y * x; y = y + P3; y = y * x; y = y + P4; y = y * x;
    y = y + P5; y = y * x; y = y + P6; y = y * x; y = y + P7; y = y * x; y = y + P8;
    y = y * x; y = y * z;
    float t = ef * Q1; y = y + t;
    t = z * -0.5f; y = y + t;
    float r = x + y;
    t = ef * Q2; r = r + t;
    return -r;
}

void kf_outer(const int32_t* rk, const int32_t* ck, int64_t ck_sn, float* out, int64_t n0, int64_t n1,
              int64_t R, int64_t C) {
    for (int64_t i = n0; i < n1; i++) {
        const int32_t* c = ck + (i / R) * ck_sn;
        uint32_t r = (uint32_t)rk[i];
        float* o = out + i * C;
        for (int64_t k = 0; k < C; k++) o[k] = e_of_hash(mix32(r ^ (uint32_t)c[k]));
    }
}

/* The prompt's Gumbel score at tau = 1 without the noise field: each probability row divided in place by
   its noise, then normalised (the sum in 16 lanes, so that it vectorises). Row i is the i-th row of the
   [N, R] row keys; its probabilities start at p + (i / P) * p_sp + (i % P) * p_sr (P rows a plane). */
void kf_outer_gumbel(const int32_t* rk, const int32_t* ck, int64_t ck_sn, float* p, int64_t P, int64_t p_sp,
                     int64_t p_sr, int64_t n0, int64_t n1, int64_t R, int64_t C) {
    for (int64_t i = n0; i < n1; i++) {
        const int32_t* c = ck + (i / R) * ck_sn;
        uint32_t r = (uint32_t)rk[i];
        float* o = p + (i / P) * p_sp + (i % P) * p_sr;
        for (int64_t k = 0; k < C; k++) o[k] = o[k] / e_of_hash(mix32(r ^ (uint32_t)c[k]));
        float acc[16] = {0};
        int64_t k = 0;
        for (; k + 16 <= C; k += 16)
            for (int j = 0; j < 16; j++) acc[j] += o[k + j];
        for (int j = 0; k < C; k++, j++) acc[j] += o[k];
        for (int w = 8; w > 0; w >>= 1)
            for (int j = 0; j < w; j++) acc[j] += acc[j + w];
        float s = acc[0];
        for (k = 0; k < C; k++) o[k] = o[k] / s;
    }
}

void kf_at(const int64_t* seeds, const int64_t* layer, int64_t layer_sn, const int64_t* qpos,
           const int64_t* kpos, int64_t kp_sb, int64_t kp_sh, int64_t B, int64_t Hkv, int64_t G, int64_t S,
           uint32_t* ckbuf, float* out) {
    for (int64_t b = 0; b < B; b++) {
        uint32_t base = mix32((uint32_t)seeds[b] * C1 + (uint32_t)layer[b * layer_sn] * C2);
        uint32_t q = (uint32_t)qpos[b] * C4;
        for (int64_t h = 0; h < Hkv; h++) {
            const int64_t* kp = kpos + b * kp_sb + h * kp_sh;
            for (int64_t s = 0; s < S; s++) {
                int64_t p = kp[s] > 0 ? kp[s] : 0;
                ckbuf[s] = mix32((uint32_t)p * C5 + 0x5BD1E995u);
            }
            for (int64_t g = 0; g < G; g++) {
                uint32_t r = mix32(mix32(base ^ ((uint32_t)(h * G + g) * C3)) ^ q);
                float* o = out + ((b * Hkv + h) * G + g) * S;
                for (int64_t s = 0; s < S; s++) o[s] = e_of_hash(mix32(r ^ ckbuf[s]));
            }
        }
    }
}
"""


def source(hash_constants: tuple[int, ...]) -> str:
    """The C source with its constants: the hash's ``C1..C5`` (:data:`keyformer.core.noise.HASH_CONSTANTS`,
    passed in: this module does not import that one) and the log's."""
    defs = {"U_MAX_24": _c(U_MAX * 2.0**24), "SQRTHF": _c(SQRTHF), "Q1": _c(LOG_Q1), "Q2": _c(LOG_Q2),
            **{f"P{i}": _c(p) for i, p in enumerate(LOG_P)},
            **{f"C{i}": f"{c:#x}u" for i, c in enumerate(hash_constants, start=1)}}
    return "".join(f"#define {k} ({v})\n" for k, v in defs.items()) + _SOURCE


FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC")
_LIB: list = []  # [ctypes.CDLL or None] once tried
_FAILURE: list[str] = []
_LOCK = threading.Lock()


def _cpu_key() -> str:
    """The CPU the library is built for (``-march=native``): its flags line, so a cache shared between
    machines never hands one a library built for another."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        flags = next((ln for ln in lines if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    return flags + os.uname().machine


def cache_dir() -> Path:
    """``$KEYFORMER_CACHE_DIR/native`` (default ``~/.cache/keyformer/native``), beside the converted
    models."""
    return Path(os.environ.get("KEYFORMER_CACHE_DIR") or Path.home() / ".cache" / "keyformer") / "native"


def failure() -> str | None:
    """Why the native kernels are not in use (None while they are, or before the first try)."""
    return _FAILURE[0] if _FAILURE else None


def enabled() -> bool:
    return os.environ.get("KEYFORMER_NATIVE", "1") != "0"


def load(hash_constants: tuple[int, ...]) -> ctypes.CDLL | None:
    """The compiled library for ``hash_constants`` (built on first use into :func:`cache_dir`; one per
    process), or None when it cannot be built."""
    if _LIB:
        return _LIB[0]
    with _LOCK:
        if not _LIB:
            _LIB.append(_build(hash_constants))
    return _LIB[0]


def _build(hash_constants: tuple[int, ...]) -> ctypes.CDLL | None:
    src = source(hash_constants)
    cc = os.environ.get("CC", "gcc")
    key = hashlib.sha256("\0".join([src, cc, *FLAGS, _cpu_key()]).encode()).hexdigest()[:20]
    so = cache_dir() / f"keyformer_noise_{key}.so"
    try:
        problem = library_problem(so) if so.is_file() else None
        if problem:  # never loaded: a damaged library can kill the process (a bus error cannot be caught)
            print(f"[keyformer] native noise library {so} {problem}; rebuilding it", file=sys.stderr,
                  flush=True)
            so.unlink(missing_ok=True)
        if not so.is_file():
            so.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=so.parent) as tmp:
                c_file, out = Path(tmp) / "noise.c", Path(tmp) / "noise.so"
                c_file.write_text(src)
                res = subprocess.run([cc, *FLAGS, str(c_file), "-o", str(out)], capture_output=True,
                                     text=True, timeout=120)
                if res.returncode != 0:
                    raise RuntimeError(f"{cc} failed: {(res.stderr or res.stdout).strip()[:300]}")
                side = Path(tmp) / "noise.so.sha256"
                side.write_text(_sha256(out) + "\n")
                os.replace(out, so)  # atomic: processes building at once each install a whole file
                os.replace(side, _checksum_file(so))
        problem = library_problem(so)
        if problem:
            raise RuntimeError(f"{so} {problem} after building it")
        lib = ctypes.CDLL(str(so))
    except Exception as e:  # noqa: BLE001 - no compiler, a failed build, an unloadable file: torch kernels
        _FAILURE.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300])
        return None
    i64, p = ctypes.c_int64, ctypes.c_void_p
    lib.kf_outer.argtypes = [p, p, i64, p, i64, i64, i64, i64]
    lib.kf_outer.restype = None
    lib.kf_outer_gumbel.argtypes = [p, p, i64, p, i64, i64, i64, i64, i64, i64, i64]
    lib.kf_outer_gumbel.restype = None
    lib.kf_at.argtypes = [p, p, i64, p, p, i64, i64, i64, i64, i64, i64, p, p]
    lib.kf_at.restype = None
    return lib


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _checksum_file(so: Path) -> Path:
    return so.with_name(so.name + ".sha256")


def library_problem(so: Path) -> str | None:
    """Why the built library ``so`` must not be loaded (its SHA-256 differs from the one recorded when it was
    built, or none was recorded), or None."""
    try:
        recorded = _checksum_file(so).read_text().strip()
    except OSError:
        return "has no recorded checksum"
    return None if recorded == _sha256(so) else "differs from its checksum at build time (damaged)"


_POOL: list[ThreadPoolExecutor] = []


def _split(n: int, size: int) -> list[tuple[int, int]]:
    """``[0, n)`` in one slice per torch thread when ``size`` entries are worth it, else one slice."""
    threads = min(torch.get_num_threads(), n)
    if threads <= 1 or size < SPLIT_MIN:
        return [(0, n)]
    cuts = [n * i // threads for i in range(threads + 1)]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def _run(calls: list) -> None:
    """Run the zero-argument ``calls`` (ctypes calls: they release the GIL) on the pool, or here if one."""
    if len(calls) == 1:
        calls[0]()
        return
    if not _POOL or _POOL[0]._max_workers < len(calls):  # noqa: SLF001
        _POOL[:] = [ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="kf-noise")]
    list(_POOL[0].map(lambda f: f(), calls))


def outer(lib: ctypes.CDLL, rk: torch.Tensor, ck: torch.Tensor) -> torch.Tensor:
    """``E(mix(rk[n, r] ^ ck[n, c]))``: ``rk`` [N, R], ``ck`` [N or 1, C] int32 (CPU) -> [N, R, C] fp32."""
    rk, ck = rk.contiguous(), ck.contiguous()
    N, R = rk.shape
    C = ck.shape[-1]
    out = torch.empty(N, R, C, dtype=torch.float32)
    args = (rk.data_ptr(), ck.data_ptr(), 0 if ck.shape[0] == 1 else C, out.data_ptr())
    _run([functools.partial(lib.kf_outer, *args, r0, r1, R, C) for r0, r1 in _split(N * R, N * R * C)])
    return out


def outer_gumbel(lib: ctypes.CDLL, rk: torch.Tensor, ck: torch.Tensor,
                 probs: torch.Tensor) -> torch.Tensor | None:
    """Keyformer's prompt score at tau = 1, ``normalise(probs / E)`` over the last axis with ``E`` the noise
    of :func:`outer` (``rk`` [N, R], ``ck`` [N or 1, C] int32), in place on ``probs`` ([N, ..., C] fp32 whose
    leading axes hold the R rows of each of the N in order; the last axis contiguous and the axes before the
    rows flattenable). The noise field is never written. None (nothing done) for any other layout."""
    rk, ck = rk.contiguous(), ck.contiguous()
    N, R = rk.shape
    C = ck.shape[-1]
    if (probs.dtype != torch.float32 or probs.device.type != "cpu" or probs.dim() < 2 or probs.shape[-1] != C
            or probs.numel() != N * R * C or (C > 1 and probs.stride(-1) != 1)):
        return None
    P = probs.shape[-2]  # rows a plane; the planes: the axes before, which must flatten to one
    lead = [(n, st) for n, st in zip(probs.shape[:-2], probs.stride()[:-2], strict=True) if n > 1]
    if any(lead[d][1] != lead[d + 1][1] * lead[d + 1][0] for d in range(len(lead) - 1)):
        return None
    planes_sn = lead[-1][1] if lead else 0
    args = (rk.data_ptr(), ck.data_ptr(), 0 if ck.shape[0] == 1 else C, probs.data_ptr(), P, planes_sn,
            probs.stride(-2))
    _run([functools.partial(lib.kf_outer_gumbel, *args, r0, r1, R, C)
          for r0, r1 in _split(N * R, N * R * C)])
    return probs


def at(lib: ctypes.CDLL, seeds: torch.Tensor, layer: torch.Tensor, qpos: torch.Tensor, kpos: torch.Tensor,
       group: int) -> torch.Tensor:
    """A decode step's noise: ``seeds`` [B], ``layer`` [B] or [1], ``qpos`` [B] int64; ``kpos`` [B, Hkv, S]
    int64 (any strides but the last) -> [B, Hkv, G, S] fp32, equal to
    :func:`keyformer.core.noise.noise_at`. Rows split over the torch threads when large (a steady step's
    one call for all layers at batch 64)."""
    B, Hkv, S = kpos.shape
    seeds, qpos = seeds.to(torch.int64).contiguous(), qpos.to(torch.int64).reshape(-1).contiguous()
    layer = layer.to(torch.int64).reshape(-1).contiguous()
    if kpos.dtype != torch.int64 or (S > 1 and kpos.stride(-1) != 1):
        kpos = kpos.to(torch.int64).contiguous()
    out = torch.empty(B, Hkv, group, S, dtype=torch.float32)
    parts = _split(B, B * Hkv * group * S)
    ckbuf = torch.empty(len(parts), max(S, 1), dtype=torch.int32)  # one column-key row per thread
    l_sn = 0 if layer.numel() == 1 else 1
    calls = [functools.partial(lib.kf_at, seeds.data_ptr() + 8 * b0, layer.data_ptr() + 8 * b0 * l_sn, l_sn,
                               qpos.data_ptr() + 8 * b0, kpos.data_ptr() + 8 * b0 * kpos.stride(0),
                               kpos.stride(0), kpos.stride(1), b1 - b0, Hkv, group, S, ckbuf[i].data_ptr(),
                               out.data_ptr() + 4 * b0 * Hkv * group * S)
             for i, (b0, b1) in enumerate(parts)]
    _run(calls)
    return out
