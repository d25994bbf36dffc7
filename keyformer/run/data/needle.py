"""Generated ``needle`` dataset: a pass key hidden at a controlled depth of a filler text of controlled
length.

The classic pass-key retrieval task (filler sentences, one "needle" sentence holding a number, a question
asking for it), generated here from small word lists, deterministically from a seed; no files, no network.

* **Length** is counted in tokens of SmolLM2's tokenizer (the default model and the tiny test models), and
  is exact for it: every filler word is one token with or without a leading space, ``.`` is one token and a
  number of ``d`` digits after a space is ``d + 1`` tokens (tested in ``tests/test_longctx.py``). For another
  tokenizer it is a count of these pieces (about one token per word for English BPE vocabularies); the
  prompts' real lengths are in ``prompt_tokens`` of every result row.
* **Depth** ``d`` in [0, 1] puts the needle at the sentence boundary nearest to ``d`` of the filler's
  tokens: 0 = the needle opens the document, 1 = it closes it.
* **Records** are the grid values x lengths x depths, in that order, so the first ``len(lengths) *
  len(depths)`` records are one whole grid. For one value and one length the filler is the same at every
  depth: only the needle's position changes. Ids name the grid point: ``needle-L<length>-D<depth>-v<value>``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

NOUNS = ["grass", "sky", "sun", "sea", "river", "road", "tree", "hill", "field", "lake", "wind", "sand",
         "stone",
         "cloud", "moon", "garden", "forest", "bridge", "house", "door", "wall", "boat", "bird", "flower",
         "valley", "meadow", "village", "harbor", "mountain", "street"]
ADJECTIVES = ["green", "blue", "yellow", "red", "white", "black", "bright", "dark", "quiet", "calm", "warm",
              "cold",
              "soft", "wide", "tall", "old", "clear", "still", "grey", "golden", "silver", "gentle",
              "peaceful"]
# Filler sentence forms by their token count (SmolLM2: one token per word and one for the period).
FORMS: dict[int, list[str]] = {
    4: ["It is {a}.", "Here we go."],
    5: ["The {n} is {a}.", "There and back again."],
    6: ["The {n} is {a} today.", "The {n} is very {a}."],
}
# Exact finishes for the last 8..14 filler tokens (sums of the form sizes above).
_FINISH = {8: (4, 4), 9: (4, 5), 10: (5, 5), 11: (5, 6), 12: (6, 6), 13: (4, 4, 5), 14: (4, 5, 5)}
MIN_FILLER = min(_FINISH)
NEEDLE = "The pass key is {value}. Remember it. {value} is the pass key."
QUESTION = "What is the pass key?"
INSTRUCTION = ("There is a pass key hidden inside a lot of irrelevant text. Find it and memorize it. "
               "I will quiz you about the pass key.")
LENGTHS = (1000, 2000, 4000, 8000)
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
VALUE_DIGITS = 5


def needle_tokens(value: str) -> int:
    """Tokens of the needle sentence (SmolLM2): 13 word/period tokens plus ``len(value) + 1`` per number."""
    return 13 + 2 * (len(value) + 1)


def _sentence(rng: random.Random, size: int) -> str:
    return rng.choice(FORMS[size]).format(n=rng.choice(NOUNS), a=rng.choice(ADJECTIVES))


def filler(n_tokens: int, rng: random.Random) -> list[tuple[str, int]]:
    """Filler sentences ``(text, tokens)`` whose token counts sum to exactly ``n_tokens`` (>= 8)."""
    if n_tokens < MIN_FILLER:
        raise ValueError(f"filler of {n_tokens} tokens: at least {MIN_FILLER} are needed")
    out: list[tuple[str, int]] = []
    left = n_tokens
    while left > max(_FINISH):
        size = rng.choice(sorted(FORMS))
        out.append((_sentence(rng, size), size))
        left -= size
    out.extend((_sentence(rng, size), size) for size in _FINISH[left])
    return out


def needle_value(seed: int, index: int) -> str:
    """The pass key of value index ``index``: a number of ``VALUE_DIGITS`` digits (no leading zero)."""
    rng = random.Random(f"keyformer-needle-value-{seed}-{index}")
    return str(rng.randint(10 ** (VALUE_DIGITS - 1), 10**VALUE_DIGITS - 1))


def haystack(length: int, depth: float, value: str, rng: random.Random) -> tuple[str, int]:
    """A document of ``length`` tokens with the needle at ``depth``; returns (text, needle's token offset)."""
    sentences = filler(length - needle_tokens(value), rng)
    offsets = [0]
    for _, size in sentences:
        offsets.append(offsets[-1] + size)
    target = depth * offsets[-1]
    # nearest boundary, earlier on ties
    at = min(range(len(offsets)), key=lambda i: (abs(offsets[i] - target), i))
    texts = [s for s, _ in sentences]
    texts.insert(at, NEEDLE.format(value=value))
    return " ".join(texts), offsets[at]


class GridError(ValueError):
    """A needle grid setting that cannot be generated; ``key`` is ``lengths``, ``depths`` or ``n_values``."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(message)


def check_grid(lengths: Sequence[int], depths: Sequence[float], n_values: int) -> None:
    """Raise GridError naming the bad value when the grid cannot be generated."""
    shortest = needle_tokens("9" * VALUE_DIGITS) + MIN_FILLER
    if not lengths:
        raise GridError("lengths", "lengths is empty: give at least one document length in tokens")
    for n in lengths:
        if isinstance(n, bool) or not isinstance(n, int) or n < shortest:
            raise GridError("lengths", f"length {n!r}: lengths are integers >= {shortest} (tokens)")
    if not depths:
        raise GridError("depths", "depths is empty: give at least one depth in [0, 1]")
    for d in depths:
        if isinstance(d, bool) or not isinstance(d, int | float) or not 0.0 <= d <= 1.0:
            raise GridError("depths", f"depth {d!r}: depths are numbers in [0, 1] (0 = start, 1 = end)")
    if isinstance(n_values, bool) or not isinstance(n_values, int) or n_values < 1:
        raise GridError("n_values", f"n_values {n_values!r}: must be an integer >= 1")


def generate_needle(
    lengths: Sequence[int] = LENGTHS, depths: Sequence[float] = DEPTHS, n_values: int = 3, seed: int = 0
) -> list[dict]:
    """Records ``{id, document, question, answer, reference, needle_length, needle_depth, needle_offset}``.

    ``needle_offset`` is the needle's first token in the document (SmolLM2 tokens).
    """
    check_grid(lengths, depths, n_values)
    records = []
    for v in range(n_values):
        value = needle_value(seed, v)
        for length in lengths:
            for depth in depths:
                rng = random.Random(f"keyformer-needle-{seed}-{length}-{v}")  # same filler at every depth
                text, offset = haystack(int(length), float(depth), value, rng)
                records.append({
                    "id": f"needle-L{length}-D{float(depth):g}-v{v}", "document": text, "question": QUESTION,
                    "answer": value, "reference": f"The pass key is {value}.", "needle_length": int(length),
                    "needle_depth": float(depth), "needle_offset": offset,
                })
    return records
