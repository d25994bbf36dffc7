"""Performance benchmarks, each an installed entry point (see ``[project.scripts]`` in pyproject.toml).

* :mod:`keyformer.lab.bench.cpu` (``keyformer-bench``): prefill, decode, memory and KV bytes of every
  policy on SmolLM2-135M, interleaved in one process; config ``conf/bench/default.yaml`` (targets included).
* :mod:`keyformer.lab.bench.gpu` (``keyformer-gpu-bench``): GPT-J-6B- and MPT-7B-shaped models on CUDA,
  latency and throughput, full vs a policy.
* :mod:`keyformer.lab.bench.gpu_profile` (``keyformer-gpu-profile``): where a GPU decode step's time goes.

Importing this package loads nothing heavy; each module imports torch itself.
"""
