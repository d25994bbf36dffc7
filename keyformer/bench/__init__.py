"""Performance benchmarks, each an installed entry point (see ``[project.scripts]`` in pyproject.toml).

* :mod:`keyformer.bench.cpu` (``keyformer-bench``): prefill, decode, memory and KV bytes of every policy on
  SmolLM2-135M, interleaved in one process; config ``conf/bench.yaml`` (targets included).
* :mod:`keyformer.bench.gpu` (``keyformer-gpu-bench``): GPT-J-6B- and MPT-7B-shaped models on CUDA, latency
  and throughput, full vs a policy.
* :mod:`keyformer.bench.gpu_profile` (``keyformer-gpu-profile``): where a GPU decode step's time goes.
* :mod:`keyformer.bench.kvpress_compare` (``keyformer-bench-kvpress``): side by side with NVIDIA kvpress.

Importing this package loads nothing heavy; each module imports torch itself.
"""
