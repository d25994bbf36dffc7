"""ROUGE scoring, answer matching, sentence splitting and aggregation."""

from __future__ import annotations

import math

import pytest

from keyformer.run.metrics import (
    aggregate,
    answer_found,
    regex_sentences,
    rouge,
    sentence_splitter,
    split_sentences,
)


def test_identical_and_disjoint():
    same = rouge("The council approved the plan.", "The council approved the plan.")
    assert all(v == pytest.approx(100.0) for v in same.values())
    assert set(same) == {"rouge1", "rouge2", "rougeL", "rougeLsum"}
    assert rouge("alpha beta", "gamma delta")["rouge1"] == 0.0


def test_stemming_and_scale():
    s = rouge("The councils approved plans", "The council approves the plan")
    assert 50.0 < s["rouge1"] <= 100.0  # stems match: council(s), approv(es|ed), plan(s)


def test_lsum_uses_sentences():
    pred = "Rain fell all day. The river rose."
    ref = "The river rose. Rain fell all day."
    s = rouge(pred, ref)
    assert s["rougeLsum"] == pytest.approx(100.0) and s["rougeL"] < 100.0


def test_regex_splitter():
    assert regex_sentences('Mr. Smith went to the U.S. Army base. 3 dogs barked! "Why?" he asked.') == [
        "Mr. Smith went to the U.S. Army base.", "3 dogs barked!", '"Why?" he asked.']
    assert regex_sentences("one\ntwo") == ["one", "two"]
    assert sentence_splitter() in ("nltk-punkt", "regex")
    assert split_sentences("A b. C d.") == ["A b.", "C d."]


def test_aggregate():
    row = dict(rouge1=10.0, rouge2=5.0, rougeL=8.0, rougeLsum=9.0, prompt_tokens=100, generated_tokens=10,
               kv_bytes=50, kv_bytes_full=100)
    rows = [
        {**row, "id": "a", "batch": "a", "prefill_ms": 100.0, "decode_ms": 900.0, "n_decode_steps": 9},
        {**row, "id": "b", "batch": "a", "prefill_ms": 100.0, "decode_ms": 900.0, "n_decode_steps": 9,
         "rouge1": 30.0, "kv_bytes": 70},
    ]
    m = aggregate(rows)
    assert m["rouge1"] == 20.0 and m["n_samples"] == 2
    assert m["prefill_ms"] == 100.0 and m["decode_ms_per_token"] == 100.0  # one batch counted once
    assert m["tokens_per_s"] == pytest.approx(20 / 1.0)
    assert m["kv_bytes"] == 60 and m["kv_bytes_full"] == 100 and m["kv_ratio"] == pytest.approx(0.6)
    assert math.isnan(aggregate([{**rows[0], "n_decode_steps": 0}])["decode_ms_per_token"])
    assert "accuracy" not in m  # summarisation rows carry no answer


def test_answer_found_whole_words_and_accuracy():
    assert answer_found("The code name of the project is Cobalt.", "cobalt")
    assert (answer_found("It is in Kestrel\nBay.", "Kestrel Bay")
            and not answer_found("in Kestrel", "Kestrel Bay"))
    assert not answer_found("Lemonade Day", "lemon") and not answer_found("", "lemon")
    row = dict(rouge1=1.0, rouge2=1.0, rougeL=1.0, rougeLsum=1.0, prompt_tokens=1, generated_tokens=1,
               kv_bytes=1,
               kv_bytes_full=1, prefill_ms=1.0, decode_ms=1.0, n_decode_steps=1)
    rows = [{**row, "id": str(i), "batch": str(i), "answer_found": i < 3} for i in range(4)]
    assert aggregate(rows)["accuracy"] == 75.0
