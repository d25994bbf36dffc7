"""Correctness of the cache on an accelerator: the CPU test suite's key semantics, re-checked on ``--device``.

Tiny random models of every supported architecture, fp32 with TF32 off (so CPU tolerances apply):

* ``full`` greedy == the plain transformers model's ``generate`` (same weights, same device);
* physical eviction == the mask simulation (tokens, logits, kept sets) for window, H2O and Keyformer;
* H2O's accumulated scores == column sums of naive eager attention;
* the fused-kernel log-sum-exp (flash in bf16, memory-efficient in fp32) == a float64 reference;
* Keyformer noise is seeded: same seed, same result; another seed, other kept sets;
* a padded batch of 3 == each prompt alone (H2O, Keyformer).

Prints one PASS/FAIL line per check and exits 1 if any failed.

    python scripts/gpu_check.py                 # CUDA
    python scripts/gpu_check.py --device cpu    # the same checks on CPU (smoke test)
"""

from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from keyformer import generate, make_cache, make_policy, tiny_model  # noqa: E402
from keyformer.attention import _sdpa_blocked_lse, _sdpa_with_lse  # noqa: E402
from keyformer.models import TINY_ARCHS, tiny_config  # noqa: E402

NEW = 12
failures: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"{'PASS' if ok else 'FAIL'} {name}{'  ' + detail if detail else ''}", flush=True)
    if not ok:
        failures.append(name)


def prompt(seed: int, n: int, dev: torch.device, b: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 256, (b, n), generator=g).to(dev)


def plain(arch: str, dev: torch.device):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    impl = "eager" if arch == "mpt" else "sdpa"
    return AutoModelForCausalLM.from_config(tiny_config(arch), attn_implementation=impl).eval().to(dev)


def arch_checks(arch: str, dev: torch.device) -> None:
    model = tiny_model(arch, seed=0).to(dev)
    ids = prompt(1, 40, dev)
    ref = plain(arch, dev).generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW,
                                    do_sample=False, pad_token_id=0, use_cache=True)
    out = generate(model, ids, None, make_policy("full"), max_new_tokens=NEW, pad_token_id=0)
    check(f"{arch}: full == plain generate", torch.equal(out.sequences, ref[:, ids.shape[1]:]))
    full = generate(model, ids, None, make_policy("full"), max_new_tokens=NEW, min_new_tokens=NEW, output_logits=True)
    for pname in ("window", "h2o", "keyformer"):
        pol = make_policy(pname, budget=0.5)
        phys = generate(model, ids, None, pol, max_new_tokens=NEW, min_new_tokens=NEW, output_logits=True, seed=3)
        sim = generate(model, ids, None, pol, max_new_tokens=NEW, min_new_tokens=NEW, output_logits=True, seed=3,
                       mode="mask")
        diff = (phys.logits - sim.logits).abs().max().item()
        kept = all(phys.cache.kept_positions(i) == sim.cache.kept_positions(i) for i in range(len(phys.cache.layers)))
        changed = (full.logits - phys.logits).abs().max().item() > 1e-4
        check(f"{arch}: {pname} physical == mask", torch.equal(phys.sequences, sim.sequences) and diff < 1e-4
              and kept and changed, f"max |dlogit| {diff:.1e}, kept sets equal {kept}, differs from full {changed}")
    for pname in ("h2o", "keyformer"):
        pol = make_policy(pname, budget=0.5)
        batch = torch.zeros(3, 40, dtype=torch.long, device=dev)
        mask = torch.zeros_like(batch)
        lens = (40, 31, 22)
        for i, n in enumerate(lens):
            batch[i, 40 - n:] = prompt(10 + i, n, dev)[0]
            mask[i, 40 - n:] = 1
        both = generate(model, batch, mask, pol, max_new_tokens=NEW, seed=5, pad_token_id=0)
        alone = [generate(model, batch[i:i + 1, 40 - n:], None, pol, max_new_tokens=NEW, seed=5, pad_token_id=0)
                 for i, n in enumerate(lens)]
        ok = all(torch.equal(both.sequences[i], alone[i].sequences[0]) for i in range(3))
        check(f"{arch}: {pname} padded batch of 3 == each alone", ok)


def h2o_naive(dev: torch.device) -> None:
    model = tiny_model("llama", seed=0).to(dev)
    ids = prompt(6, 24, dev)
    cache = make_cache(model, make_policy("h2o", budget=1.0), torch.ones_like(ids), max_new_tokens=2, mode="mask")
    out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, max_new_tokens=2,
                         do_sample=False, pad_token_id=0)
    eager = model.__class__(copy.deepcopy(model.config)).eval().to(dev)
    eager.load_state_dict(model.state_dict())
    eager.set_attn_implementation("eager")
    att = eager(input_ids=out[:, :25], output_attentions=True, use_cache=False).attentions
    G = model.config.num_attention_heads // model.config.num_key_value_heads
    worst = 0.0
    for li, a in enumerate(att):
        naive = a[0].sum(1).view(-1, G, 25).sum(1)
        layer = cache.layers[li]
        ours = torch.zeros_like(naive)
        pos = layer.pos[0, :, : layer.length]
        ours.scatter_add_(1, pos.clamp(min=0), torch.where(pos >= 0, layer.score[0, :, : layer.length], 0.0))
        worst = max(worst, (ours - naive).abs().max().item())
    check("llama: H2O scores == naive eager column sums", worst < 1e-5, f"max diff {worst:.1e}")


def lse_kernel(dev: torch.device) -> None:
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(4, 300, 64, generator=g).to(dev, dtype) for _ in range(3))
        ctx, lse = _sdpa_with_lse(q, k, v, 0.125)
        s = (q.double() @ k.double().transpose(-1, -2)) * 0.125
        s = s.masked_fill(torch.ones(300, 300, dtype=torch.bool, device=dev).triu(1), float("-inf"))
        ref = torch.logsumexp(s, -1)
        ctx2, _ = _sdpa_blocked_lse(q, k, v, 0.125)
        d = (lse[0].double() - ref).abs().max().item()
        dc = (ctx.float() - ctx2.float()).abs().max().item()
        check(f"lse kernel ({dtype}) == float64 reference", tuple(lse.shape) == (1, 4, 300) and d < tol and dc < tol,
              f"max |dlse| {d:.1e}, max |dctx| {dc:.1e}")


def seeding(dev: torch.device) -> None:
    model = tiny_model("gptj", seed=0).to(dev)
    ids = prompt(7, 40, dev)
    pol = make_policy("keyformer", budget=0.3)
    a = generate(model, ids, None, pol, max_new_tokens=NEW, seed=1, output_logits=True)
    b = generate(model, ids, None, pol, max_new_tokens=NEW, seed=1, output_logits=True)
    c = generate(model, ids, None, pol, max_new_tokens=NEW, seed=2, output_logits=True)
    same = torch.equal(a.logits, b.logits)
    other = any(a.cache.kept_positions(i) != c.cache.kept_positions(i) for i in range(len(a.cache.layers)))
    check("keyformer: same seed reproduces, another seed changes the kept sets", same and other)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    dev = torch.device(ap.parse_args().device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    print(f"device {dev}" + (f" ({torch.cuda.get_device_name(dev)})" if dev.type == "cuda" else "")
          + f", torch {torch.__version__}", flush=True)
    for arch in TINY_ARCHS:
        try:
            arch_checks(arch, dev)
        except Exception as e:  # report and go on: one broken architecture should not hide the rest
            check(f"{arch}: ran", False, f"{type(e).__name__}: {e}")
    for fn in (h2o_naive, lse_kernel, seeding):
        try:
            fn(dev)
        except Exception as e:
            check(f"{fn.__name__}: ran", False, f"{type(e).__name__}: {e}")
    print(f"{len(failures)} failed" + (f": {failures}" if failures else ""), flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
