"""Where two cross-check rows differ from kvpress (Layers-Knorm [kv: our counts], LUKV-Knorm; layer 0 only):
the positions only one side keeps, their layer-0 key norms and token ids, one line per (row, budget, prompt,
KV head). Run from the repository root (the converted SmolLM2 in ``~/.cache/keyformer/smollm2``):

    PYTHONPATH=. .venv/bin/python -m experiments.crosscheck_kvpress.layer0_ties \\
        > results/crosscheck_kvpress/layer0_ties.txt
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ROWS = (("baselines", "Layers-Knorm [kv: our counts]"), ("lukv", "LUKV-Knorm"))
RES = Path("results/crosscheck_kvpress")


def main() -> None:
    import torch

    from experiments.crosscheck_kvpress import kvpress_crosscheck as xc
    from keyformer.core import attention as core_attention
    from keyformer.core.generate import generate
    from keyformer.core.policies import make_policy

    model = xc.our_model(os.path.expanduser("~/.cache/keyformer/smollm2"))
    prompts = xc.load_json(RES / "prompts.json")["prompts"]
    keys: dict[str, Any] = {}
    orig = core_attention.attend

    def attend(module, layer, query, key, value, **kw):  # type: ignore[no-untyped-def]
        if layer.layer_idx == 0 and query.shape[2] > 1:  # layer 0's prompt keys, as attended (RoPE in)
            keys["k"] = key[0, :, -query.shape[2]:].float().clone()
        return orig(module, layer, query, key, value, **kw)

    core_attention.attend = attend
    for folder, name in ROWS:
        sides = [{(m["name"], m["budget"]): m for m in xc.load_json(RES / folder / f)["methods"]}
                 for f in ("ours.json.gz", "kvpress.json.gz")]
        for budget in (0.5, 0.2):
            runs = zip(sides[0][(name, budget)]["runs"], sides[1][(name, budget)]["runs"], strict=True)
            for pi, (ro, rk) in enumerate(runs):
                for h, (a, b) in enumerate(zip(ro["kept"][0], rk["kept"][0], strict=True)):
                    ours, kv = xc.decode_kept(a), xc.decode_kept(b)
                    if ours == kv:
                        continue
                    ids = prompts[pi]["input_ids"]
                    x = torch.tensor([ids])
                    with torch.inference_mode():
                        generate(model, x, torch.ones_like(x), make_policy("full"), max_new_tokens=1)
                    norm = torch.linalg.vector_norm(keys["k"][h], dim=-1)
                    only = {"ours": sorted(ours - kv), "kvpress": sorted(kv - ours)}
                    cells = [f"{s}-only " + ", ".join(f"{p} (token {ids[p]}, |k| {float(norm[p]):.6f})"
                                                      for p in ps) for s, ps in only.items()]
                    print(f"{folder} {name} @ {budget}, prompt {pi}, KV head {h}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
