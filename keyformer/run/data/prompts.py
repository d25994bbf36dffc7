"""Prompt templates (as in the Keyformer paper's code and LongBench) and token-level truncation of the
document.

Templates contain a ``{document}`` slot; when a prompt exceeds the token limit, only the document is cut, at
token level, so the instruction, the question and the ``### Response:`` suffix (or the chat template's
assistant header) survive. ``truncation="end"`` (the default, and the rule of every dataset before the
long-context ones) cuts the *document's tail*; ``truncation="middle"`` cuts its *middle*, keeping its first
and last halves of the room left, as LongBench does (``pred.py``: "truncate in the middle, since the left and
right side may contain crucial instructions"). The authors' code truncated the whole prompt, cutting the
suffix off.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Alpaca ``prompt_input`` exactly as in keyformer-llm summarization/dataset.py.
ALPACA = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{document}\n\n### Response:"
)
# SODA conversation prompt from keyformer-llm conversation/dialogue.py: narrative <sep> role <sep> history.
SODA = ("{document} <sep> Generate a dialogue between {speaker_a} and {speaker_b} given above narrative. "
        "<sep> {history}")
# User message used with a tokenizer's chat template (instruct models): no Alpaca scaffolding needed.
CHAT = "{instruction}\n\n{document}"
# Retrieval (the embedded ``sample`` data): the question comes after the document, so truncating the
# document's tail never cuts it.
ALPACA_QA = (ALPACA.replace("{document}\n\n### Response:", "{document}\n\nQuestion: {question}\n\n### "
                                                           "Response:"))
CHAT_QA = "{instruction}\n\n{document}\n\nQuestion: {question}"

# LongBench v1 prompts (THUDM/LongBench config/dataset2prompt.json; {context} -> {document}, {input} ->
# {question}). Instruct models get the whole prompt as their one user message (no CHAT_TEMPLATES entry).
LONGBENCH_MULTI_NEWS = (
    "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{document}\n\n"
    "Now, write a one-page summary of all the news.\n\nSummary:"
)
_QASPER_RULES = (
    "as concisely as you can, using a single phrase or sentence if possible. If the question cannot be "
    "answered "
    "based on the information in the article, write \"unanswerable\". If the question is a yes/no question, "
    "answer \"yes\", \"no\", or \"unanswerable\". Do not provide any explanation."
)
LONGBENCH_QASPER = (
    f"You are given a scientific article and a question. Answer the question {_QASPER_RULES}\n\n"
    f"Article: {{document}}\n\n Answer the question based on the above article {_QASPER_RULES}\n\n"
    "Question: {question}\n\nAnswer:"
)
LONGBENCH_MULTIFIELDQA_EN = (
    "Read the following text and answer briefly.\n\n{document}\n\nNow, answer the following question based "
    "on "
    "the above text, only give me the answer and do not output any other words.\n\nQuestion: "
    "{question}\nAnswer:"
)

# Base models (model.prompt_style=base) get a completion to continue instead of the Alpaca scaffolding
# (experiment 9: Gemma 3 270M answered the Alpaca prompt with "The following is a response to the
# instruction.").
BASE_SUMMARY = "Article: {document}\n\nSummary:"
BASE_QA = "{instruction}\n\n{document}\n\nQuestion: {question}\nAnswer:"

TEMPLATES = {"alpaca": ALPACA, "soda": SODA, "chat": CHAT, "alpaca_qa": ALPACA_QA, "chat_qa": CHAT_QA,
             "longbench_multi_news": LONGBENCH_MULTI_NEWS, "longbench_qasper": LONGBENCH_QASPER,
             "longbench_multifieldqa_en": LONGBENCH_MULTIFIELDQA_EN, "base_summary": BASE_SUMMARY,
             "base_qa": BASE_QA}
CHAT_TEMPLATES = {"alpaca": "chat", "alpaca_qa": "chat_qa"}  # what an instruct model gets instead
BASE_TEMPLATES = {"alpaca": "base_summary", "alpaca_qa": "base_qa"}  # what a base model gets instead
PROMPT_STYLES = ("instruct", "base", "auto")  # model.prompt_style
CHAT_CHOICES = ("auto", True, False)  # model.chat_template


def use_chat_template(model: Mapping[str, Any], tokenizer: Any) -> bool:
    """Whether prompts go through the tokenizer's chat template: ``model.chat_template`` ``true`` (required:
    a ValueError when the tokenizer has none), ``auto`` (when it has one) or ``false``."""
    choice = model.get("chat_template", False)
    has = getattr(tokenizer, "chat_template", None) is not None
    if choice == "auto":
        return has
    if choice is True and not has:
        raise ValueError(f"model.chat_template=true but the tokenizer of {model.get('name')} has no chat "
                         "template; use model.chat_template=auto or false")
    return bool(choice)


def styled_template(template: str, style: str, chat: bool) -> str:
    """The dataset template a model of prompt style ``style`` gets: ``base`` (or ``auto`` without a chat
    template) turns the Alpaca templates into completions (:data:`BASE_TEMPLATES`); other templates and the
    ``instruct`` style keep the dataset's own."""
    if style == "base" or (style == "auto" and not chat):
        return BASE_TEMPLATES.get(template, template)
    return template


def chat_kwargs(tokenizer: Any) -> dict[str, Any]:
    """Extra ``apply_chat_template`` arguments: ``enable_thinking=False`` where the template reads it
    (Qwen3: no ``<think>`` block before the answer)."""
    return {"enable_thinking": False} if "enable_thinking" in str(tokenizer.chat_template or "") else {}
_SLOT = "\x00DOCUMENT\x00"
TRUNCATIONS = ("end", "middle")  # which part of a too-long document is cut (dataset.truncation)


def render(template: str, record: Mapping[str, Any], instruction: str, document: str = _SLOT) -> str:
    """Fill a template from a record; ``document`` defaults to a placeholder used for splitting."""
    speakers = list(record.get("speakers") or ["Person A", "Person B"])
    return TEMPLATES.get(template, template).format(
        instruction=instruction,
        document=document,
        speaker_a=speakers[0],
        speaker_b=speakers[1] if len(speakers) > 1 else "Person B",
        history=" <turn> ".join(record.get("history") or []),
        question=record.get("question", ""),
    )


def prompt_parts(
    record: Mapping[str, Any], template: str, instruction: str, tokenizer: Any = None, chat: bool = False
) -> tuple[str, str]:
    """Return (text before the document, text after it), wrapped in the chat template when ``chat``."""
    text = render(CHAT_TEMPLATES.get(template, template) if chat else template, record, instruction)
    if chat:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True,
            **chat_kwargs(tokenizer),
        )
    before, after = text.split(_SLOT)
    return before, after


def bos_prefix(tokenizer: Any) -> list[int]:
    """``[bos_token_id]`` where ``tokenizer(text)`` puts a BOS before any text (Gemma, Llama), else ``[]``
    (GPT-2, SmolLM2): what a prompt whose template opens with the document gets in front of it."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is None:
        return []
    return [bos] if tokenizer("", add_special_tokens=True)["input_ids"][:1] == [bos] else []


def encode_prompt(
    tokenizer: Any,
    record: Mapping[str, Any],
    template: str,
    instruction: str,
    max_tokens: int,
    chat: bool = False,
    truncation: str = "end",
) -> tuple[list[int], int]:
    """Token ids of the prompt, at most ``max_tokens`` long, and the number of document tokens cut.

    Pieces are tokenized separately and concatenated (outside a chat template the prompt opens with the
    tokenizer's own special tokens, :func:`bos_prefix` where the template opens with the document; until
    2026-12-05 such prompts had none: docs/gemma3.md); only the document is shortened: from its end
    (``truncation="end"``), or in its middle (``"middle"``: the first ``room // 2`` and the last
    ``room - room // 2`` of the ``room`` tokens left for it are kept).
    """
    if truncation not in TRUNCATIONS:
        raise ValueError(f"truncation={truncation!r}: allowed: {', '.join(TRUNCATIONS)}")
    before, after = prompt_parts(record, template, instruction, tokenizer, chat)
    special = not chat  # chat templates already contain their special tokens
    # a template that opens with the document (RULER's, SODA's) still opens with the tokenizer's BOS
    pre = (tokenizer(before, add_special_tokens=special)["input_ids"] if before
           else bos_prefix(tokenizer) if special else [])
    doc = tokenizer(str(record["document"]), add_special_tokens=False)["input_ids"]
    post = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    room = max_tokens - len(pre) - len(post)
    if room < 1:
        raise ValueError(
            f"max_prompt_tokens={max_tokens} leaves no room for the document: the template alone takes "
            f"{len(pre) + len(post)} tokens"
        )
    cut = max(0, len(doc) - room)
    if cut and truncation == "middle":
        head = room // 2
        kept = list(doc[:head]) + list(doc[len(doc) - (room - head):])
    else:
        kept = list(doc[: len(doc) - cut])
    return list(pre) + kept + list(post), cut
