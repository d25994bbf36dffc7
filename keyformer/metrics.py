"""ROUGE (rouge-score, stemming, F1 x 100) and aggregation of per-sample results.

``rougeLsum`` needs one sentence per line. Sentences come from nltk's punkt model when its data is
installed; otherwise (as here: punkt cannot be downloaded offline) from a regex splitter. The splitter
used is reported in metrics.json as ``sentence_splitter``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import lru_cache

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL", "rougeLsum")
_SENT = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])")
_ABBREV = re.compile(r"(?:\b(?:Mr|Mrs|Ms|Dr|Prof|St|Jr|Sr|Gen|Sen|Rep|Gov|No|vs|etc)|\b[A-Z])\.$")


def regex_sentences(text: str) -> list[str]:
    """Split on ., ! or ? followed by whitespace and an upper-case letter or digit; also on newlines."""
    out: list[str] = []
    for line in text.splitlines():
        parts = [s.strip() for s in _SENT.split(line) if s.strip()]
        merged: list[str] = []
        for part in parts:  # re-join splits after abbreviations such as "Mr." or "U.S."
            if merged and _ABBREV.search(merged[-1]):
                merged[-1] += " " + part
            else:
                merged.append(part)
        out.extend(merged)
    return out


@lru_cache(maxsize=1)
def sentence_splitter() -> str:
    """``"nltk-punkt"`` when nltk's punkt data is available, else ``"regex"``."""
    try:
        import nltk

        nltk.sent_tokenize("A test. Another one.")
        return "nltk-punkt"
    except Exception:  # LookupError when punkt is missing; anything else means unusable too
        return "regex"


def split_sentences(text: str) -> list[str]:
    if sentence_splitter() == "nltk-punkt":
        import nltk

        return [s for line in text.splitlines() for s in nltk.sent_tokenize(line) if s.strip()]
    return regex_sentences(text)


@lru_cache(maxsize=1)
def _scorer():
    import logging

    logging.getLogger("absl").setLevel(logging.WARNING)  # rouge-score logs "Using default tokenizer." at INFO
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(list(ROUGE_KEYS), use_stemmer=True)


def rouge(prediction: str, reference: str) -> dict[str, float]:
    """ROUGE-1/2/L/Lsum F1 x 100 of one prediction against one reference."""
    pred, ref = prediction.strip(), reference.strip()
    scores = _scorer().score(ref, pred)
    lsum = _scorer().score("\n".join(split_sentences(ref)), "\n".join(split_sentences(pred)))["rougeLsum"]
    out = {k: 100.0 * scores[k].fmeasure for k in ROUGE_KEYS}
    out["rougeLsum"] = 100.0 * lsum.fmeasure
    return out


def answer_found(prediction: str, answer: str) -> bool:
    """True when ``answer`` occurs in ``prediction`` as whole words, ignoring case (retrieval datasets)."""
    words = re.escape(" ".join(answer.lower().split())).replace(r"\ ", r"\s+")
    return re.search(rf"(?<!\w){words}(?!\w)", prediction.lower()) is not None


def mean(values: Iterable[float]) -> float:
    vals = [float(v) for v in values]
    return sum(vals) / len(vals) if vals else float("nan")


def aggregate(rows: list[Mapping]) -> dict[str, float]:
    """Aggregate per-sample prediction rows (see results.py) into run-level metrics.

    * ROUGE: mean of per-sample F1 x 100.
    * ``prefill_ms``: mean prefill time per batch (one batch = ``batch_size`` samples).
    * ``decode_ms_per_token``: total decode time / total decode steps (one step = one token per sequence).
    * ``tokens_per_s``: generated tokens (all samples) / total prefill+decode time.
    * ``kv_bytes`` / ``kv_bytes_full``: mean per sample, physical KV bytes held at the end of generation
      and what a full cache would hold for the same tokens; ``kv_ratio`` is their ratio.
    * ``accuracy`` (retrieval datasets, whose rows carry ``answer_found``): % of samples whose prediction
      contains the answer.
    """
    out = {k: mean(r[k] for r in rows) for k in ROUGE_KEYS}
    if rows and all("answer_found" in r for r in rows):
        out["accuracy"] = 100.0 * mean(float(r["answer_found"]) for r in rows)
    batches = {r["batch"]: r for r in rows}.values()  # batch-level timings are repeated per sample
    prefill = [b["prefill_ms"] for b in batches]
    decode_s = sum(b["decode_ms"] for b in batches) / 1000.0
    steps = sum(b["n_decode_steps"] for b in batches)
    total_s = decode_s + sum(prefill) / 1000.0
    gen = sum(r["generated_tokens"] for r in rows)
    kv, kv_full = mean(r["kv_bytes"] for r in rows), mean(r["kv_bytes_full"] for r in rows)
    out.update(
        prefill_ms=mean(prefill),
        decode_ms_per_token=1000.0 * decode_s / steps if steps else float("nan"),
        tokens_per_s=gen / total_s if total_s > 0 else float("nan"),
        kv_bytes=kv,
        kv_bytes_full=kv_full,
        kv_ratio=kv / kv_full if kv_full else float("nan"),
        prompt_tokens=mean(r["prompt_tokens"] for r in rows),
        generated_tokens=mean(r["generated_tokens"] for r in rows),
        n_samples=len(rows),
    )
    return out
