"""Generated ``ruler`` dataset: NVIDIA RULER's synthetic tasks, rebuilt offline (see ``docs/ruler.md``).

Tasks (``TASKS``): the needle-in-a-haystack variants ``niah_single_1-3``, ``niah_multikey_1-3``,
``niah_multivalue``, ``niah_multiquery``, variable tracking ``vt``, common-words extraction ``cwe`` and
frequent-words extraction ``fwe``, with RULER's templates, answer prefixes, needle/value types (words, 7-digit
numbers, uuids) and tokens to generate (``TOKENS_TO_GENERATE``). RULER's two QA tasks need SQuAD/HotpotQA and
are not built.

* **Length**: every sample's RULER text (template filled with the context, plus the answer prefix; no chat
  wrapper) is the longest that fits ``length - tokens_to_generate`` tokens of the given tokenizer
  (SmolLM2's by default), found by a binary search over the number of haystack units (noise blocks, essay
  words, distractor needles, list words), as RULER does.
* **Essay haystack**: RULER uses Paul Graham's essays, which cannot be downloaded here. ``niah_single_2/3``,
  ``niah_multikey_1``, ``niah_multivalue`` and ``niah_multiquery`` use the article text of local documents
  instead: the ``essay_field`` of ``essay_file`` (default ``cnn_dailymail.jsonl``, field ``article``) under
  ``KEYFORMER_DATA_DIR``, concatenated in file order and split at whitespace; needles go between sentences
  (``keyformer.run.metrics.regex_sentences``, as nltk's punkt is not available offline) at depths drawn from
  40 evenly spaced depths in [0, 100] %.
* **Generated essay haystack** (``essay_source: generated``): deterministic English-like sentences built from
  ``wonderwords``' lists (MIT licence) by :func:`generated_essay_words`, so the essay tasks need no file.
* **Words** come from ``wonderwords``' noun, adjective and verb lists (as RULER).
* **Determinism**: sample ``i`` of (task, length, seed) is drawn from ``random.Random`` seeded with a string
  naming all four, so it does not depend on how many samples are generated.

A record is ``{id, document, question, answer_prefix, answers, reference, ruler_task, ruler_length,
ruler_tokens, queries}``: ``document`` is the RULER text before the question (instruction head and context),
``question`` the question line; the RULER prompt is ``document + "\\n" + question`` (the dataset template
``"{document}\\n{question}"``) followed by ``answer_prefix``. ``queries`` lists the questions the
query-agnostic mode asks over one compressed context: one per asked key for ``niah_multiquery``
(singular template), else the record's own question.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import string
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

TOKENS_TO_GENERATE = {"niah": 128, "vt": 30, "cwe": 120, "fwe": 50}
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_v} for {key} is: {value}."
NIAH_HEAD = ("Some special magic {type_v} are hidden within the following text. Make sure to memorize it. "
             "I will quiz you about the {type_v} afterwards.")
NIAH_QUESTION = "What are all the special magic {type_v} for {query} mentioned in the provided text?"
NIAH_PREFIX = " The special magic {type_v} for {query} mentioned in the provided text are"
VT_HEAD = "Memorize and track the chain(s) of variable assignment hidden in the following text."
VT_QUESTION = "Question: Find all variables that are assigned the value {query} in the text above."
VT_PREFIX = (" Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables "
             "are assigned the value {query}, they are: ")
CWE_HEAD = ("Below is a numbered list of words. In these words, some appear more often than others. Memorize "
            "the "
            "ones that appear most often.")
CWE_QUESTION = "Question: What are the 10 most common words in the above list?"
CWE_PREFIX = " Answer: The top 10 words that appear most often in the list are:"
FWE_HEAD = ("Read the following coded text and track the frequency of each coded word. Find the three most "
            "frequently appeared coded words.")
FWE_QUESTION = ("Question: Do not provide any explanation. Please ignore the dots '....'. What are the three "
                "most "
                "frequently appeared words in the above coded text?")
FWE_PREFIX = " Answer: According to the coded text above, the three most frequently appeared words are:"
DEPTHS = [round(100 * i / 39) for i in range(40)]  # RULER: np.round(np.linspace(0, 100, 40))
LENGTHS = (4096, 8192, 16384, 32768)
ESSAY_FILE, ESSAY_FIELD = "cnn_dailymail.jsonl", "article"
ESSAY_SOURCES = ("generated", "file")  # dataset.essay_source: sentences made here | essay_file's text
ESSAY_SEED = "keyformer-ruler-essay-v1"
# Sentence frames of the generated essay, filled from wonderwords' adjectives, nouns and (base-form) verbs.
ESSAY_FRAMES = (
    "The {a} {n} will {v} the {n}.",
    "A {n} is {a}, and the {n} is {a}.",
    "Nobody knew why the {n} would {v} every {a} {n}.",
    "In the {a} {n}, a {n} might {v}.",
    "It is {a} to {v} a {n} before the {n} is {a}.",
    "Every {n} near the {a} {n} tried to {v}.",
    "They said the {n} could {v} the {a} {n} again.",
    "Later that day, the {a} {n} began to {v}.",
)


@dataclass(frozen=True)
class Niah:
    """One NIAH variant: haystack (noise | essay | needle), key and value types, numbers of
    keys/values/queries."""

    haystack: str
    type_k: str
    type_v: str
    num_k: int = 1
    num_v: int = 1
    num_q: int = 1


NIAH = {
    "niah_single_1": Niah("noise", "words", "numbers"),
    "niah_single_2": Niah("essay", "words", "numbers"),
    "niah_single_3": Niah("essay", "words", "uuids"),
    "niah_multikey_1": Niah("essay", "words", "numbers", num_k=4),
    "niah_multikey_2": Niah("needle", "words", "numbers"),
    "niah_multikey_3": Niah("needle", "uuids", "uuids"),
    "niah_multivalue": Niah("essay", "words", "numbers", num_v=4),
    "niah_multiquery": Niah("essay", "words", "numbers", num_k=4, num_q=4),
}
TASKS = (*NIAH, "vt", "cwe", "fwe")


class RulerError(ValueError):
    """A ruler setting that cannot be generated; ``key`` names the dataset key (``ruler_task``,
    ``length``...)."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(message)


def tokens_to_generate(task: str) -> int:
    """RULER's tokens to generate for ``task`` (NIAH 128, vt 30, cwe 120, fwe 50)."""
    check_task(task)
    return TOKENS_TO_GENERATE["niah" if task in NIAH else task]


def needs_essay(task: str) -> bool:
    """True when ``task`` reads the essay haystack (local documents under ``KEYFORMER_DATA_DIR``)."""
    return task in NIAH and NIAH[task].haystack == "essay"


def check_task(task: Any) -> None:
    if task not in TASKS:
        raise RulerError("ruler_task", f"ruler_task {task!r} is unknown; valid: {', '.join(TASKS)}")


# -- word lists ----------------------------------------------------------------------------------------------
@lru_cache(maxsize=8)
def wonder_list(name: str) -> tuple[str, ...]:
    """A word list of ``wonderwords`` (``nounlist.txt``, ``adjectivelist.txt``, ``verblist.txt``), as RULER
    reads it."""
    try:
        from importlib.resources import files

        text = (files("wonderwords") / "assets" / name).read_text(encoding="utf-8")
    except ModuleNotFoundError:
        raise RulerError("ruler_task", "the ruler dataset needs the `wonderwords` package: pip install "
                                       "wonderwords"
                         ) from None
    return tuple(w.strip() for w in text.splitlines() if w.strip())


@lru_cache(maxsize=1)
def _key_parts() -> tuple[tuple[str, ...], tuple[str, ...]]:
    adjectives, nouns = wonder_list("adjectivelist.txt"), wonder_list("nounlist.txt")
    return tuple(sorted(set(adjectives))), tuple(sorted(set(nouns)))


def key_word(rng: random.Random) -> str:
    """A NIAH word key: ``adjective-noun``, uniform over RULER's pairs of wonderwords' adjectives and nouns
    (drawn as one adjective and one noun instead of from the ~10M-pair list RULER materialises)."""
    adjs, nouns = _key_parts()
    return f"{rng.choice(adjs)}-{rng.choice(nouns)}"


@lru_cache(maxsize=1)
def common_words() -> tuple[str, ...]:
    """RULER's CWE vocabulary: nouns, adjectives and verbs, sorted and de-duplicated."""
    return tuple(sorted(set(wonder_list("nounlist.txt") + wonder_list("adjectivelist.txt")
                            + wonder_list("verblist.txt"))))


def _random(rng: random.Random, kind: str) -> str:
    if kind == "words":
        return key_word(rng)
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    raise ValueError(f"needle type {kind!r}; valid: words, numbers, uuids")


# -- essay haystack ------------------------------------------------------------------------------------------
def essay_path(essay_file: str = ESSAY_FILE, path: str | None = None) -> Path | None:
    """The essay source: ``path`` or ``$KEYFORMER_DATA_DIR/<essay_file>``; None when neither is set."""
    if path:
        return Path(os.path.expanduser(path))
    root = os.environ.get("KEYFORMER_DATA_DIR")
    return Path(root).expanduser() / essay_file if root else None


@lru_cache(maxsize=4)
def essay_words(path: str, field: str = ESSAY_FIELD) -> tuple[str, ...]:
    """The ``field`` text of every JSONL record of ``path``, concatenated in file order, whitespace-split."""
    words: list[str] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                words.extend(str(json.loads(line).get(field) or "").split())
    if not words:
        raise RulerError("essay_field", f"{path} has no text in field {field!r}")
    return tuple(words)


@lru_cache(maxsize=4)
def generated_essay_words(n_words: int) -> tuple[str, ...]:
    """The first ``n_words`` words of the generated essay: sentences of :data:`ESSAY_FRAMES` filled with
    wonderwords' adjectives, nouns and verbs, drawn from one fixed seed, so a shorter essay is a prefix of a
    longer one. No digits (the needles' values are numbers)."""
    adjs, nouns = _key_parts()
    verbs = tuple(sorted(set(wonder_list("verblist.txt"))))
    rng = random.Random(ESSAY_SEED)
    words: list[str] = []
    while len(words) < n_words:
        frame = rng.choice(ESSAY_FRAMES)
        sentence = frame.replace("{a}", "\0a").replace("{n}", "\0n").replace("{v}", "\0v")
        filled = []
        for part in sentence.split("\0")[1:]:
            pool = {"a": adjs, "n": nouns, "v": verbs}[part[0]]
            filled.append(rng.choice(pool) + part[1:])
        text = re.sub(r"\b([Aa]) (?=[aeiou])", r"\1n ", sentence.split("\0")[0] + "".join(filled))
        words.extend(text.split())
    return tuple(words[:n_words])


# -- one sample per task -------------------------------------------------------------------------------------
@dataclass
class Sample:
    """A RULER sample: ``head`` + sep + ``context`` form the document; the questions follow it."""

    head: str
    sep: str
    context: str
    question: str
    answer_prefix: str
    answers: list[str]
    queries: list[dict]  # [{question, answer_prefix, answers}] for the query-agnostic mode

    def text(self) -> str:
        """The RULER input the length counts: document, newline, question, answer prefix."""
        return f"{self.head}{self.sep}{self.context}\n{self.question}{self.answer_prefix}"


def _niah_text(spec: Niah, type_v: str, query: str, n_asked: int) -> tuple[str, str, str]:
    """(head, question, answer prefix); singular when one value is asked (RULER's replacements)."""
    head, question, prefix = NIAH_HEAD, NIAH_QUESTION, NIAH_PREFIX
    if n_asked == 1:
        head, question, prefix = (t.replace("Some", "A").replace("are all", "is").replace("are", "is")
                                  for t in (head, question, prefix))
        type_v = type_v[:-1]
    return (head.format(type_v=type_v), question.format(type_v=type_v, query=query),
            prefix.format(type_v=type_v, query=query))


def _join_keys(keys: Sequence[str]) -> str:
    return keys[0] if len(keys) == 1 else ", ".join(keys[:-1]) + ", and " + keys[-1]


def _niah(spec: Niah, seed_key: str, essay: Sequence[str] | None) -> Callable[[int], Sample]:
    def make(n: int) -> Sample:
        rng = random.Random(seed_key)
        keys, values, needles = [], [], []
        for _ in range(spec.num_k):
            keys.append(_random(rng, spec.type_k))
            vals = [_random(rng, spec.type_v) for _ in range(spec.num_v)]
            values.append(vals)
            needles.extend(NEEDLE.format(type_v=spec.type_v, key=keys[-1], value=v) for v in vals)
        rng.shuffle(needles)
        asked = rng.sample(range(spec.num_k), spec.num_q)
        place = random.Random(f"{seed_key}-{n}")  # positions depend on the haystack size
        if spec.haystack == "essay":
            sents = _sentences(" ".join(essay[:n]))  # type: ignore[index]
            depths = sorted(place.sample(DEPTHS, len(needles)))
            cuts = [0, *(int(len(sents) * d / 100) for d in depths), len(sents)]
            parts: list[str] = []
            for i in range(1, len(cuts)):
                chunk = " ".join(sents[cuts[i - 1]: cuts[i]])
                if chunk:
                    parts.append(chunk)
                if i - 1 < len(needles):
                    parts.append(needles[i - 1])
            context = " ".join(parts)
        else:
            if spec.haystack == "noise":
                lines = [NOISE] * n
            else:  # distractor needles with random keys and values
                lines = [NEEDLE.format(type_v=spec.type_v, key=_random(place, spec.type_k),
                                       value=_random(place, spec.type_v)) for _ in range(n)]
            for at, needle in zip(sorted(place.sample(range(n + 1), len(needles)), reverse=True), needles,
                                  strict=True):
                lines.insert(at, needle)
            context = "\n".join(lines)
        qkeys = [keys[i] for i in asked]
        answers = [v for i in asked for v in values[i]]
        head, question, prefix = _niah_text(spec, spec.type_v, _join_keys(qkeys), len(answers))
        if spec.num_q > 1:
            queries = []
            for i in asked:
                _, q, p = _niah_text(spec, spec.type_v, keys[i], len(values[i]))
                queries.append({"question": q, "answer_prefix": p, "answers": list(values[i])})
        else:
            queries = [{"question": question, "answer_prefix": prefix, "answers": answers}]
        return Sample(head, "\n", context, question, prefix, answers, queries)

    return make


def _sentences(text: str) -> list[str]:
    from keyformer.run.metrics import regex_sentences

    return regex_sentences(text)


def _vt(seed_key: str, num_hops: int = 4) -> Callable[[int], Sample]:
    def make(n: int) -> Sample:
        rng = random.Random(seed_key)
        names: list[str] = []
        while len(names) < num_hops + 1:
            name = "".join(rng.choices(string.ascii_uppercase, k=5))
            if name not in names:
                names.append(name)
        value = str(rng.randint(10000, 99999))
        chain = [f"VAR {names[0]} = {value}"] + [f"VAR {names[j + 1]} = VAR {names[j]}"
                                                 for j in range(num_hops)]
        lines = [NOISE] * n
        place = random.Random(f"{seed_key}-{n}")
        for j, at in enumerate(sorted(place.sample(range(n + 1), len(chain)))):
            lines.insert(at + j, chain[j])  # in chain order
        q = VT_QUESTION.format(query=value)
        p = VT_PREFIX.format(num_v=len(names), query=value)
        return Sample(VT_HEAD, "\n\n", "\n".join(lines), q, p, names, [{"question": q, "answer_prefix": p,
                                                                         "answers": names}])

    return make


def _cwe(seed_key: str, length: int) -> Callable[[int], Sample]:
    freq_common, freq_other = (30, 3) if length >= 4096 else (6, 1)

    def make(n: int) -> Sample:  # n: words that are not among the 10 common ones
        rng = random.Random(seed_key)
        pool = rng.sample(common_words(), 10 + n)
        common, others = pool[:10], pool[10:]
        words = common * freq_common + others * freq_other
        random.Random(f"{seed_key}-{n}").shuffle(words)
        context = " ".join(f"{i + 1}. {w}" for i, w in enumerate(words))
        return Sample(CWE_HEAD, "\n", context, CWE_QUESTION, CWE_PREFIX, list(common),
                      [{"question": CWE_QUESTION, "answer_prefix": CWE_PREFIX, "answers": list(common)}])

    return make


def _fwe(seed_key: str, vocab_size: int = 2000, alpha: float = 2.0) -> Callable[[int], Sample]:
    rng = random.Random(seed_key)
    vocab: set[str] = set()
    while len(vocab) < vocab_size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=6)))
    words = sorted(vocab)
    rng.shuffle(words)
    words[0] = "..."  # the top-ranked word is noise
    zeta = math.pi**2 / 6 if alpha == 2.0 else sum(k**-alpha for k in range(1, 100000))

    def make(n: int) -> Sample:  # n: the sample size of the Zipf law
        counts = [int(n * (k + 1) ** -alpha / zeta) for k in range(vocab_size)]
        text = [w for w, c in zip(words, counts, strict=True) for _ in range(c)]
        random.Random(f"{seed_key}-{n}").shuffle(text)
        answers = words[1:4]
        return Sample(FWE_HEAD, " ", " ".join(text), FWE_QUESTION, FWE_PREFIX, answers,
                      [{"question": FWE_QUESTION, "answer_prefix": FWE_PREFIX, "answers": answers}])

    return make


def _fit(make: Callable[[int], Sample], count: Callable[[str], int], target: int, lo: int,
         hi: int) -> tuple[Sample, int]:
    """The sample of the largest ``n`` in [lo, hi] whose text has at most ``target`` tokens, and its
    tokens."""
    best = make(lo)
    best_n = count(best.text())
    if best_n > target:
        raise RulerError("length", f"length leaves {target} tokens for the input, less than the smallest "
                                   f"sample "
                         f"({best_n} tokens); use a larger length")
    while lo < hi:  # invariant: make(lo) fits
        mid = (lo + hi + 1) // 2
        s = make(mid)
        t = count(s.text())
        if t <= target:
            lo, best, best_n = mid, s, t
        else:
            hi = mid - 1
    return best, best_n


def generate_ruler(task: str, length: int, n: int, tokenizer: Any, seed: int = 0,
                   essay: Sequence[str] | None = None) -> list[dict]:
    """``n`` RULER samples of ``task`` filling ``length - tokens_to_generate(task)`` tokens of ``tokenizer``.

    ``essay``: the essay haystack's words (the NIAH tasks with an essay haystack need it).
    """
    check_task(task)
    if isinstance(length, bool) or not isinstance(length, int) or length < 256:
        raise RulerError("length", f"length {length!r}: an integer >= 256 (tokens)")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise RulerError("n", f"n {n!r}: an integer >= 1 (samples)")
    if needs_essay(task) and not essay:
        raise RulerError("essay_file", f"ruler task {task} needs the essay haystack: set "
                                       f"essay_source=generated, or KEYFORMER_DATA_DIR to a folder holding "
                                       f"{ESSAY_FILE} (or essay_path)")
    target = length - tokens_to_generate(task)

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    records = []
    for i in range(n):
        key = f"keyformer-ruler-{task}-{seed}-{length}-{i}"
        if task in NIAH:
            spec = NIAH[task]
            make = _niah(spec, key, essay)
            hi = min(len(essay), target) if spec.haystack == "essay" else target  # type: ignore[arg-type]
            lo = 0 if spec.haystack == "essay" else spec.num_k * spec.num_v
        elif task == "vt":
            make, lo, hi = _vt(key), 5, target
        elif task == "cwe":
            make, lo, hi = _cwe(key, length), 0, min(target, len(common_words()) - 10)
        else:
            make, lo, hi = _fwe(key), 0, 2 * target
        s, tokens = _fit(make, count, target, lo, hi)
        records.append({
            "id": f"ruler-{task}-L{length}-{i:04d}", "document": f"{s.head}{s.sep}{s.context}",
            "question": s.question, "answer_prefix": s.answer_prefix, "answers": list(s.answers),
            "reference": ", ".join(s.answers), "ruler_task": task, "ruler_length": length,
            "ruler_tokens": tokens, "queries": s.queries,
        })
    return records
