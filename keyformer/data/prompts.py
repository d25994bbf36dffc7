"""Prompt templates (as in the Keyformer paper's code) and token-level truncation of the document.

Templates contain a ``{document}`` slot; when a prompt exceeds the token limit, the *document's tail*
is cut at token level so the instruction and the ``### Response:`` suffix (or the chat template's
assistant header) survive. The authors' code truncated the whole prompt, cutting the suffix off.
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
SODA = "{document} <sep> Generate a dialogue between {speaker_a} and {speaker_b} given above narrative. <sep> {history}"
# User message used with a tokenizer's chat template (instruct models): no Alpaca scaffolding needed.
CHAT = "{instruction}\n\n{document}"
# Retrieval (the embedded ``sample`` data): the question comes after the document, so truncating the
# document's tail never cuts it.
ALPACA_QA = ALPACA.replace("{document}\n\n### Response:", "{document}\n\nQuestion: {question}\n\n### Response:")
CHAT_QA = "{instruction}\n\n{document}\n\nQuestion: {question}"

TEMPLATES = {"alpaca": ALPACA, "soda": SODA, "chat": CHAT, "alpaca_qa": ALPACA_QA, "chat_qa": CHAT_QA}
CHAT_TEMPLATES = {"alpaca": "chat", "alpaca_qa": "chat_qa"}  # what an instruct model gets instead
_SLOT = "\x00DOCUMENT\x00"


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
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
    before, after = text.split(_SLOT)
    return before, after


def encode_prompt(
    tokenizer: Any,
    record: Mapping[str, Any],
    template: str,
    instruction: str,
    max_tokens: int,
    chat: bool = False,
) -> tuple[list[int], int]:
    """Token ids of the prompt, at most ``max_tokens`` long, and the number of document tokens cut.

    Pieces are tokenized separately and concatenated; only the document is shortened (from its end).
    """
    before, after = prompt_parts(record, template, instruction, tokenizer, chat)
    special = not chat  # chat templates already contain their special tokens
    pre = tokenizer(before, add_special_tokens=special)["input_ids"] if before else []
    doc = tokenizer(str(record["document"]), add_special_tokens=False)["input_ids"]
    post = tokenizer(after, add_special_tokens=False)["input_ids"] if after else []
    room = max_tokens - len(pre) - len(post)
    if room < 1:
        raise ValueError(
            f"max_prompt_tokens={max_tokens} leaves no room for the document: the template alone takes "
            f"{len(pre) + len(post)} tokens"
        )
    cut = max(0, len(doc) - room)
    return list(pre) + list(doc[: len(doc) - cut]) + list(post), cut
