"""model=hub, keyformer.load with a hub id, chat templates (Qwen3's thinking mode), base/instruct prompts."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import keyformer
from keyformer.run.data.prompts import (
    BASE_TEMPLATES,
    chat_kwargs,
    prompt_parts,
    styled_template,
    use_chat_template,
)
from keyformer.run.paths import config_dirs
from keyformer.run.tasks.generate import GenerateTask, prompt_setup
from keyformer.run.validate import ConfigError, JobError

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "conf"
QWEN3_LIKE = ("{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}"
              "{%- if add_generation_prompt %}<|im_start|>assistant\n"
              "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
              "{%- endif %}{%- endif %}")


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        return OmegaConf.to_container(compose("config", overrides=["output_dir=/tmp/unused", *overrides]),
                                      resolve=True)


class Tok:
    def __init__(self, template: str | None):
        self.chat_template = template


def test_hub_config_reads_the_checkpoint_and_needs_a_name():
    c = _compose("model=hub", "model.name=Qwen/Qwen3-8B")
    m = c["model"]
    assert (m["source"], m["arch"], m["chat_template"], m["prompt_style"]) == ("hub", None, "auto", "auto")
    assert m["attn_implementation"] is None and m["name"] == "Qwen/Qwen3-8B"
    with pytest.raises(ConfigError, match=r"model.name=None.*model.name=<org/name>"):
        GenerateTask().validate(_compose("model=hub"))
    with pytest.raises(ConfigError, match=r"model.chat_template='maybe': allowed: auto, true, false"):
        GenerateTask().validate(_compose("model=tiny_llama", "model.chat_template=maybe"))
    with pytest.raises(ConfigError, match=r"model.prompt_style='chatty': allowed: instruct, base, auto"):
        GenerateTask().validate(_compose("model=smollm2", "model.prompt_style=chatty"))


def test_chat_template_choice():
    assert use_chat_template({"chat_template": "auto"}, Tok("x")) is True
    assert use_chat_template({"chat_template": "auto"}, Tok(None)) is False
    assert use_chat_template({"chat_template": False}, Tok("x")) is False
    assert use_chat_template({"chat_template": True}, Tok("x")) is True
    with pytest.raises(ValueError, match="has no chat template; use model.chat_template=auto or false"):
        use_chat_template({"chat_template": True, "name": "m"}, Tok(None))


def test_qwen3_thinking_is_switched_off_where_the_template_reads_it():
    from keyformer.run.loading import smollm2_tokenizer

    tok = smollm2_tokenizer()
    rec = {"document": "D", "question": "Q?"}
    plain = prompt_parts(rec, "{document}\n{question}", "", tok, chat=True)  # SmolLM2's template
    assert chat_kwargs(tok) == {} and "think" not in plain[1]
    whole = tok.apply_chat_template([{"role": "user", "content": "\x00DOCUMENT\x00\nQ?"}], tokenize=False,
                                    add_generation_prompt=True)
    assert plain == tuple(whole.split("\x00DOCUMENT\x00"))
    tok.chat_template = QWEN3_LIKE
    assert chat_kwargs(tok) == {"enable_thinking": False}
    before, after = prompt_parts(rec, "{document}\n{question}", "", tok, chat=True)
    assert before == "<|im_start|>user\n" and after.endswith("assistant<think>\n\n</think>")
    default = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False,
                                      add_generation_prompt=True)
    assert "<think>" not in default  # the empty think block comes from enable_thinking=False


def test_prompt_style_base_turns_alpaca_into_a_completion():
    assert styled_template("alpaca", "base", False) == "base_summary"
    assert styled_template("alpaca_qa", "base", True) == "base_qa"
    assert styled_template("alpaca", "instruct", False) == "alpaca"
    assert styled_template("alpaca", "auto", False) == "base_summary"
    assert styled_template("alpaca", "auto", True) == "alpaca"
    assert styled_template("longbench_qasper", "base", False) == "longbench_qasper"
    c = _compose("model=gemma3_270m", "dataset=cnn_dailymail")
    chat, template = prompt_setup(c, Tok(None))
    before, after = prompt_parts({"document": "D"}, template, c["dataset"]["instruction"], None, chat)
    assert (before, after) == ("Article: ", "\n\nSummary:")  # experiment 9's prompt
    c = _compose("dataset=cnn_dailymail")  # SmolLM2: instruct, its chat template
    assert prompt_setup(c, Tok("x")) == (True, "alpaca")


def _points(params: dict) -> list[list[str]]:
    keys = list(params)
    return [[f"{k}={v}" for k, v in zip(keys, combo, strict=True)]
            for combo in itertools.product(*[str(params[k]).split(",") for k in keys])]


def test_no_committed_experiment_changes_its_prompt():
    """Every experiment point with a base-style model uses a template the base style leaves alone."""
    for exp in sorted(p.stem for d in config_dirs() for p in (d / "experiment").glob("*.yaml")):
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            hcfg = compose("config", overrides=[f"+experiment={exp}", "output_dir=/x"],
                           return_hydra_config=True)
        params = OmegaConf.to_container(hcfg.hydra.sweeper.params) if hcfg.hydra.sweeper.params else {}
        keep = {k: v for k, v in params.items() if k.startswith(("+experiment/", "dataset", "model"))}
        for point in _points(keep) or [[]]:
            c = _compose(f"+experiment={exp}", *point)
            style = str(c["model"].get("prompt_style") or "instruct")
            template = str(c["dataset"].get("template", "alpaca"))
            assert style == "instruct" or template not in BASE_TEMPLATES, (exp, point)


def test_load_a_hub_id_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(JobError, match=r"model 'org/not-cached-model' is not in the local Hugging Face cache "
                                       r"and the hub is offline \(HF_HUB_OFFLINE=1\): unset HF_HUB_OFFLINE"):
        keyformer.load("org/not-cached-model")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr("keyformer.run.validate.hub_reachable", lambda timeout=2.0: False)
    for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(JobError, match=r"'org/not-cached-model' .* the hub is unreachable \(no network\)"):
        keyformer.load("org/not-cached-model")
    with pytest.raises(ConfigError, match=r"invalid model='qwen3': allowed: .*smollm2.*or a hub id"):
        keyformer.load("qwen3")


def test_load_a_checkpoint_folder_as_a_hub_model(tmp_path, monkeypatch):
    """The hub path end to end, offline: a tiny qwen3 checkpoint saved to a folder loads by its path, with the
    architecture its config declares, prepared for the evicting cache."""
    from keyformer.core.models import ATTN_IMPL, tiny_stock_model
    from keyformer.run.loading import smollm2_tokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = smollm2_tokenizer()
    tiny_stock_model("qwen3", vocab_size=len(tok)).save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    model, tok2 = keyformer.load(str(tmp_path / "ckpt"), device="cpu")
    assert model.config.model_type == "qwen3" and model.config._attn_implementation == ATTN_IMPL
    enc = tok2("Hello there", return_tensors="pt")
    with keyformer.apply(model, "h2o", budget=0.5):
        out = model.generate(**enc, max_new_tokens=3, do_sample=False)
    assert out.shape[1] == enc.input_ids.shape[1] + 3


@pytest.mark.slow
def test_embedded_gemma_default_run_summarises(tmp_path):
    """``python run.py model=gemma3_270m dataset=cnn_dailymail n_samples=2``: the base model's default prompt
    is a completion ("Article: ... Summary:"), so its outputs are article text, not a chat reply (which
    scored ROUGE-2 0.00 under the Alpaca prompt)."""
    import json
    import os
    import subprocess
    import sys

    from keyformer.run.loading import gemma3_available

    if not gemma3_available() or not os.environ.get("KEYFORMER_DATA_DIR"):
        pytest.skip("needs the embedded Gemma 3 (.[gemma]) and KEYFORMER_DATA_DIR")
    r = subprocess.run([sys.executable, str(ROOT / "run.py"), "model=gemma3_270m", "dataset=cnn_dailymail",
                        "n_samples=2", f"output_dir={tmp_path}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads((tmp_path / "metrics.json").read_text())
    preds = [json.loads(x)["prediction"] for x in (tmp_path / "predictions.jsonl").read_text().splitlines()]
    assert m["rouge2"] > 5.0, (m["rouge2"], preds)
    assert not any("thank you" in p.lower() for p in preds)
