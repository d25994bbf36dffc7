"""Steady decode steps at batch 64 over a 256-token cache: ms/step and top aten ops per policy."""
import copy, sys, time, torch
from keyformer.lab.bench.cpu import load_bench_model, make_prompts, Config, decode
from keyformer.core.generate import make_cache
from keyformer.core.policies import make_policy
B, L, K, STEPS = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
pols = sys.argv[5].split(",")
model, _ = load_bench_model({"model_name": "smollm2", "dtype": "float32", "prompt": "random"})
ids = make_prompts(None, model.config.vocab_size, L, B, 0)
res = {}
with torch.inference_mode():
    snaps = {}
    for p in pols:
        cache = make_cache(model, make_policy(p, budget=K), torch.ones_like(ids), max_new_tokens=64, seed=0)
        t0 = time.perf_counter()
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), cache=cache, logits_to_keep=1)
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(2):  # into the steady state
            out = model(input_ids=tok, cache=cache, logits_to_keep=1); tok = out.logits[:, -1].argmax(-1, keepdim=True)
        snaps[p] = (cache, tok)
        print(p, "prefill", round(time.perf_counter() - t0, 1), flush=True)
    for rnd in range(2):
        for p in pols:
            cache, tok = copy.deepcopy(snaps[p][0]), snaps[p][1]
            t0 = time.perf_counter()
            for _ in range(STEPS):
                out = model(input_ids=tok, cache=cache, logits_to_keep=1); tok = out.logits[:, -1].argmax(-1, keepdim=True)
            res.setdefault(p, []).append(1000 * (time.perf_counter() - t0) / STEPS)
            print(p, "round", rnd, round(res[p][-1], 1), "ms/step", flush=True)
    from torch.profiler import profile, ProfilerActivity
    for p in pols:
        cache, tok = copy.deepcopy(snaps[p][0]), snaps[p][1]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                out = model(input_ids=tok, cache=cache, logits_to_keep=1); tok = out.logits[:, -1].argmax(-1, keepdim=True)
        print("==", p)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
