"""Sampled decoding (``generation=sample`` / ``do_sample=True``): seeded, under any policy, validated."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from keyformer import generate, make_policy, tiny_model
from keyformer.run.validate import ConfigError, _check_sampling

ROOT = Path(__file__).resolve().parents[1]


def _sample(model, seed: int) -> torch.Tensor:
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(seed)
    return generate(model, ids, None, make_policy("h2o", budget=0.5), max_new_tokens=12, do_sample=True,
                    temperature=1.0, top_p=1.0, top_k=0).sequences


def test_sampling_is_seeded_and_differs_from_greedy() -> None:
    model = tiny_model("llama", seed=0)
    a, b, c = _sample(model, 1), _sample(model, 1), _sample(model, 2)
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    greedy = generate(model, ids, None, make_policy("h2o", budget=0.5), max_new_tokens=12).sequences
    assert torch.equal(a, b) and not torch.equal(a, c) and not torch.equal(a, greedy)


@pytest.mark.parametrize("gen, key", [({"do_sample": "yes"}, "generation.do_sample"),
                                      ({"do_sample": True, "temperature": 0}, "generation.temperature"),
                                      ({"do_sample": True, "top_p": 1.5}, "generation.top_p"),
                                      ({"do_sample": True, "top_k": -1}, "generation.top_k")])
def test_bad_sampling_settings_are_refused(gen: dict, key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _check_sampling(gen)


@pytest.mark.slow
def test_run_py_samples_reproducibly(tmp_path: Path) -> None:
    """``python run.py generation=sample``: the same seed gives the same outputs, another seed others."""
    def run(seed: int, out: str) -> list[str]:
        r = subprocess.run([sys.executable, str(ROOT / "run.py"), "model=tiny_llama", "generation=sample",
                            "n_samples=2", f"seed={seed}", f"output_dir={tmp_path / out}"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        return [json.loads(x)["prediction"] for x in (tmp_path / out / "predictions.jsonl").read_text()
                .splitlines()]

    assert run(0, "a") == run(0, "b") != run(1, "c")
