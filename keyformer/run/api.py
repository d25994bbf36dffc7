"""The one-call Python API: :func:`load` a prepared model, :func:`apply` a policy to plain ``model.generate``,
and :func:`lm_eval_main`, lm-eval's own command line with the ``keyformer`` model registered.

Usage (see docs/usage.md)::

    import keyformer
    model, tok = keyformer.load("smollm2")                 # the embedded SmolLM2-135M-Instruct, offline
    with keyformer.apply(model, "h2o", budget=0.5):
        out = model.generate(**tok("Hello", return_tensors="pt"), max_new_tokens=32, do_sample=False)

``apply`` gives every ``model.generate`` call inside the block a fresh :class:`~keyformer.core.cache.KVCache`
(the same one :func:`keyformer.generate` builds: same policy, seed and horizon), unless the call passes its
own ``cache=`` / ``past_key_values=``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def load(name: str = "smollm2", device: str = "auto", dtype: str = "auto",
         seed: int = 0) -> tuple[Any, Any]:
    """``(model, tokenizer)`` for ``conf/model/<name>.yaml`` (``smollm2``, ``tiny_llama``, ``mpt``...) or a
    Hugging Face hub id or local checkpoint folder (``"Qwen/Qwen3-8B"``: any name with a ``/``, loaded as
    ``conf/model/hub.yaml``): the HF model in eval mode, prepared for the evicting cache
    (:func:`keyformer.prepare_model`; it behaves as before with any ordinary cache). ``device``/``dtype``
    as in ``run.py`` (``auto``: cuda when available, bfloat16 there, else cpu/float32). A bad name or value
    raises :class:`~keyformer.run.validate.ConfigError`, a hub model that cannot be fetched
    :class:`~keyformer.run.validate.JobError` (one line each)."""
    from keyformer.run.loading import load_model, model_config
    from keyformer.run.paths import CONF_DIR
    from keyformer.run.validate import ConfigError, resolve_device, resolve_dtype

    names = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml") if p.stem != "base")
    if name not in names and "/" not in name:
        raise ConfigError("model", name, f"allowed: {', '.join(names)}, or a hub id such as Qwen/Qwen3-8B")
    dev = resolve_device(device)
    cfg = {"model": model_config(name) if name in names else {**model_config("hub"), "name": name},
           "device": dev, "dtype": resolve_dtype(dtype, dev), "seed": int(seed)}
    if name in names:
        return load_model(cfg)
    return _load_hub(cfg)


def _load_hub(cfg: dict[str, Any]) -> tuple[Any, Any]:
    """:func:`load_model` for a hub id; a repo that cannot be fetched is one JobError line with the fix."""
    import os
    from pathlib import Path

    from keyformer.run.loading import load_model
    from keyformer.run.validate import JobError, first_line, hub_cached, hub_offline, hub_reachable

    name = cfg["model"]["name"]
    fix = "fetch it once on a machine with network access, or use a conf/model name such as 'smollm2'"
    if not Path(name).is_dir() and not hub_cached(name):  # a local checkpoint folder needs no hub
        if hub_offline():
            raise JobError(f"model {name!r} is not in the local Hugging Face cache and the hub is offline "
                           f"(HF_HUB_OFFLINE=1): unset HF_HUB_OFFLINE and {fix}")
        proxy = any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"))
        if not proxy and not hub_reachable():  # one 2 s probe instead of a minute of retries
            raise JobError(f"model {name!r} is not in the local Hugging Face cache and the hub is "
                           f"unreachable (no network): {fix}")
    try:
        return load_model(cfg)
    except OSError as e:  # huggingface_hub reports unreachable or unknown repos as OSError subclasses
        raise JobError(f"model {name!r} could not be loaded from the Hugging Face hub: {first_line(e)} "
                       "(check the id, the network, and HF_TOKEN for gated models)") from None


@contextlib.contextmanager
def apply(model: Any, policy: Any, *, seed: int = 0, mode: str = "physical", kv_quant: Any = None,
          **policy_kwargs: Any) -> Iterator[Any]:
    """Within the block, ``model.generate(...)`` runs under ``policy`` (a :class:`~keyformer.Policy`, or a
    name built with ``policy_kwargs``, e.g. ``apply(model, "h2o", budget=0.5)``); yields the policy.

    Each call gets a new cache: ``make_cache(model, policy, attention_mask, max_new_tokens=...,
    seed=seed, mode=mode, kv_quant=kv_quant)`` (left-padded batches need their ``attention_mask``), so greedy
    output equals :func:`keyformer.generate` with the same arguments. A call that passes ``cache=`` or
    ``past_key_values=`` is left alone. On exit ``model.generate`` is the model's own again."""
    from keyformer.core.generate import make_cache
    from keyformer.core.models import prepare_model
    from keyformer.core.policies import make_policy

    pol = make_policy(policy, **policy_kwargs) if isinstance(policy, str) else policy
    if policy_kwargs and not isinstance(policy, str):
        raise TypeError(f"policy knobs {sorted(policy_kwargs)} go with a policy name, not a Policy object")
    prepare_model(model)
    had_own = "generate" in vars(model)
    previous = vars(model).get("generate")
    original = model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("cache") is None and kwargs.get("past_key_values") is None:
            kwargs.pop("past_key_values", None)
            gen_cfg = kwargs.get("generation_config") or model.generation_config
            horizon = kwargs.get("max_new_tokens") or getattr(gen_cfg, "max_new_tokens", None) or 0
            kwargs["cache"] = make_cache(model, pol, kwargs.get("attention_mask"),
                                         max_new_tokens=int(horizon),
                                         seed=seed, mode=mode, kv_quant=kv_quant)
        return original(*args, **kwargs)

    model.generate = generate
    try:
        yield pol
    finally:
        if had_own:
            model.generate = previous
        else:
            del model.generate


def lm_eval_main(argv: list[str] | None = None) -> None:
    """``keyformer-lm-eval``: lm-eval's command line (same arguments as ``lm_eval``) with the ``keyformer``
    model registered, e.g. ``keyformer-lm-eval --model keyformer --model_args policy=h2o,budget=0.5 --tasks
    piqa``. Without ``--device``, cuda when available, else cpu (lm-eval's own default is cuda). (lm-eval
    0.4.13 finds models only in its own registry: plain ``lm_eval`` cannot see this one.)"""
    import sys

    import keyformer.run.tasks.lm_eval.adapter  # noqa: F401 - registers the "keyformer" model

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] not in ("ls", "validate", "-h", "--help") and "--device" not in args:
        import torch  # lm-eval's default device is cuda: take run.py's device=auto instead

        args += ["--device", "cuda" if torch.cuda.is_available() else "cpu"]
    sys.argv = [sys.argv[0], *args]
    from lm_eval.__main__ import cli_evaluate

    cli_evaluate()
