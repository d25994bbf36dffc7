"""ROUGE (rouge-score, stemming, F1 x 100), the long-context metrics, and aggregation of per-sample results.

``rougeLsum`` needs one sentence per line. Sentences come from nltk's punkt model when its data is
installed; otherwise (as here: punkt cannot be downloaded offline) from a regex splitter. The splitter
used is reported in metrics.json as ``sentence_splitter``.

Every row gets ROUGE (the results contract). A dataset's ``metrics`` list adds (all x 100, and against
several reference answers the best one, as LongBench's ``scorer`` takes the max over ``answers``):

* ``token_f1``: LongBench's ``qa_f1_score`` (SQuAD ``normalize_answer``: lower case, no punctuation, no
  articles a/an/the, single spaces; then the F1 of the bag-of-words overlap).
* ``exact_match``: the normalized prediction equals a normalized answer (row: bool; metric: %).
* ``rougeL_longbench``: ROUGE-L F as LongBench scores it: the ``rouge`` package (pltrdy, 1.0.1) behind
  LongBench's ``rouge_score``: text split into sentences at every ``.``, words split at spaces (no stemming,
  case and punctuation kept), summary-level union LCS over *distinct* words; an empty text scores 0. It
  differs from ``rougeL`` (rouge-score: stemmed, lower-cased alphanumeric tokens, one LCS). One difference
  from LongBench remains: the package traces the LCS recursively, so a sentence pair of about 1000 words
  overflows Python's stack and LongBench scores it 0; here it is scored.
* ``accuracy``: the answer word is in the prediction (``answer_found``; the generated ``sample`` and
  ``needle`` sets, whose records carry an ``answer``, get it whether listed or not).
* ``string_match_all`` / ``string_match_part`` (RULER, ``docs/ruler.md``): the share of the reference answers
  found in the prediction as case-insensitive substrings / 1 if any is found (x 100; never the best-of).
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

ROUGE_KEYS = ("rouge1", "rouge2", "rougeL", "rougeLsum")
METRICS = ("rouge", "rougeL_longbench", "token_f1", "exact_match", "accuracy", "string_match_all",
           "string_match_part")
_PUNCT = frozenset(string.punctuation)
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
      contains the answer; ``needle`` rows add ``accuracy_by_length`` and ``accuracy_by_depth`` ({value: %}).
    * ``token_f1``, ``rougeL_longbench`` (mean x 100) and ``exact_match`` (%), when the rows carry them.
    * ``n_truncated``: samples whose prompt lost document tokens (``truncated_tokens > 0``).
    """
    out = {k: mean(r[k] for r in rows) for k in ROUGE_KEYS}
    for k in ("rougeL_longbench", "token_f1", "string_match_all", "string_match_part"):
        if rows and all(k in r for r in rows):
            out[k] = mean(r[k] for r in rows)
    if rows and all("exact_match" in r for r in rows):
        out["exact_match"] = 100.0 * mean(float(r["exact_match"]) for r in rows)
    if rows and all("answer_found" in r for r in rows):
        out["accuracy"] = 100.0 * mean(float(r["answer_found"]) for r in rows)
        for key, field in (("accuracy_by_length", "needle_length"), ("accuracy_by_depth", "needle_depth")):
            if all(field in r for r in rows):
                out[key] = _accuracy_by(rows, field)
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
        n_truncated=sum(1 for r in rows if r.get("truncated_tokens", 0) > 0),
        n_samples=len(rows),
    )
    return out


def _accuracy_by(rows: list[Mapping], field: str) -> dict[str, float]:
    """% of ``answer_found`` per value of ``field`` (keys as text, in increasing order of the value)."""
    groups: dict[Any, list[float]] = {}
    for r in rows:
        groups.setdefault(r[field], []).append(float(r["answer_found"]))
    return {f"{v:g}" if isinstance(v, float) else str(v): 100.0 * mean(groups[v]) for v in sorted(groups)}


# -- long-context metrics (LongBench / L-Eval) ---------------------------------------------------------------
def normalize_answer(text: str) -> str:
    """SQuAD/LongBench ``normalize_answer``: lower case, drop punctuation, drop articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def _f1(pred: Sequence[str], ref: Sequence[str]) -> float:
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, answers: Sequence[str]) -> float:
    """LongBench ``qa_f1_score`` x 100, the best over ``answers``."""
    pred = normalize_answer(prediction).split()
    return 100.0 * max((_f1(pred, normalize_answer(a).split()) for a in answers), default=0.0)


def string_match_all(prediction: str, references: Sequence[str]) -> float:
    """RULER's ``string_match_all`` x 100: the share of ``references`` that occur in ``prediction``
    (lower-cased substrings)."""
    pred = prediction.lower()
    return 100.0 * sum(r.lower() in pred for r in references) / len(references) if references else 0.0


def string_match_part(prediction: str, references: Sequence[str]) -> float:
    """RULER's ``string_match_part`` x 100: 100 when any of ``references`` occurs in ``prediction``
    (lower-cased substrings), else 0."""
    pred = prediction.lower()
    return 100.0 * any(r.lower() in pred for r in references)


def exact_match(prediction: str, answers: Sequence[str]) -> bool:
    """True when the normalized prediction equals a normalized answer."""
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(a) for a in answers)


def _lcs_words(x: Sequence[str], y: Sequence[str]) -> list[str]:
    """One longest common subsequence of ``x`` and ``y``, traced back as the ``rouge`` package does (on a
    tie, step back in ``y``)."""
    table = [[0] * (len(y) + 1) for _ in range(len(x) + 1)]
    for i, xi in enumerate(x, 1):
        row, prev = table[i], table[i - 1]
        for j, yj in enumerate(y, 1):
            row[j] = prev[j - 1] + 1 if xi == yj else max(prev[j], row[j - 1])
    out, i, j = [], len(x), len(y)
    while i and j:
        if x[i - 1] == y[j - 1]:
            out.append(x[i - 1])
            i, j = i - 1, j - 1
        elif table[i - 1][j] > table[i][j - 1]:
            i -= 1
        else:
            j -= 1
    return out[::-1]


def _rouge_sentences(text: str) -> list[str]:
    return [" ".join(s.split()) for s in text.split(".") if len(s) > 0]


def rouge_l_longbench(prediction: str, reference: str) -> float:
    """ROUGE-L F x 100 as LongBench's ``rouge_score`` computes it (``rouge`` 1.0.1, summary level)."""
    hyp, ref = _rouge_sentences(prediction), _rouge_sentences(reference)
    if not hyp or not ref:
        return 0.0  # the package raises; LongBench scores 0
    hyp_words, ref_words = [s.split(" ") for s in hyp], [s.split(" ") for s in ref]
    union: set[str] = set()
    for r in ref_words:
        for h in hyp_words:
            union.update(_lcs_words(r, h))
    m, n = len({w for s in ref_words for w in s}), len({w for s in hyp_words for w in s})
    recall, precision = len(union) / m, len(union) / n
    return 100.0 * (2.0 * ((precision * recall) / (precision + recall + 1e-8)))


def score(prediction: str, record: Mapping[str, Any], metrics: Sequence[str] = ()) -> dict[str, Any]:
    """The metric fields of one result row: ROUGE (always), then the ``metrics`` named by the dataset.

    References are ``record["answers"]`` when present (the best answer counts, per ROUGE key too), else
    ``record["reference"]``. A record with an ``answer`` always gets ``answer`` and ``answer_found``.
    """
    refs = list(record.get("answers") or [record["reference"]])
    if len(refs) == 1:
        out: dict[str, Any] = rouge(prediction, refs[0])
    else:
        each = [rouge(prediction, r) for r in refs]
        out = {k: max(s[k] for s in each) for k in ROUGE_KEYS}
    if "rougeL_longbench" in metrics:
        out["rougeL_longbench"] = max(rouge_l_longbench(prediction, r) for r in refs)
    if "token_f1" in metrics:
        out["token_f1"] = token_f1(prediction, refs)
    if "exact_match" in metrics:
        out["exact_match"] = exact_match(prediction, refs)
    if "string_match_all" in metrics:
        out["string_match_all"] = string_match_all(prediction, refs)
    if "string_match_part" in metrics:
        out["string_match_part"] = string_match_part(prediction, refs)
    if "answer" in record or "accuracy" in metrics:
        out["answer"] = record["answer"]
        out["answer_found"] = answer_found(prediction, record["answer"])
    return out
