"""Shared fixtures of the library's tests (tests/) and the studies' (experiments/<study>/test_*.py).

Tests run Keyformer's noise kernels eagerly unless ``KEYFORMER_COMPILE`` is set (see ``pytest_configure``).

``device``: the torch device the device-aware tests run on, from ``KEYFORMER_TEST_DEVICE`` (default
``cpu``), e.g. ``KEYFORMER_TEST_DEVICE=cuda pytest -m on_device`` on a GPU machine (what
``scripts/run_gpu_all.sh`` does). Every test that takes the fixture gets the ``on_device`` marker. On CUDA,
TF32 is turned off so that the CPU tolerances apply. Asking for an absent CUDA device is a usage error, not a
skip.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

DEVICE_ENV = "KEYFORMER_TEST_DEVICE"


def device_name() -> str:
    return os.environ.get(DEVICE_ENV, "").strip() or "cpu"


def pytest_report_header(config: pytest.Config) -> str:
    return f"{DEVICE_ENV}={device_name()}"


def pytest_configure(config: pytest.Config) -> None:
    # Tests run the eager noise kernels (no compile time in the suite); tests/test_noise.py checks that the
    # compiled ones, which real runs use on CPU, agree with them. KEYFORMER_COMPILE=1 runs everything
    # compiled.
    os.environ.setdefault("KEYFORMER_COMPILE", "0")
    name = device_name()
    if name != "cpu":
        import torch

        dev = torch.device(name)
        if dev.type == "cuda" and (not torch.cuda.is_available()
                                   or (dev.index or 0) >= torch.cuda.device_count()):
            raise pytest.UsageError(f"{DEVICE_ENV}={name}, but that CUDA device is not available here")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "device" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.on_device)


@pytest.fixture(scope="session")
def device() -> Any:
    """The ``torch.device`` of ``KEYFORMER_TEST_DEVICE`` (default cpu)."""
    import torch

    dev = torch.device(device_name())
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return dev


@pytest.fixture(scope="module")
def one_thread():
    """Tiny tensors: one thread is faster, and much faster on a shared, loaded machine."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
