"""Shared test configuration: hypothesis profiles and the ``gpu`` marker's skip rule.

Hypothesis profiles (choose with HYPOTHESIS_PROFILE; ``ci`` is the default):
    ci        derandomized, 30 examples, no deadline: reproducible and bounded for CI
    dev       60 random examples, no deadline
    thorough  500 random examples, no deadline: run before a release or after touching an op

``gpu`` tests skip with the reason from :func:`tests.gpu.gpu_skip_reason` when CuPy or
a CUDA device is missing; with DFLASH_REQUIRE_GPU=1 they fail instead, so a GPU machine with a
broken CuPy install cannot pass by skipping.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

from tests.gpu import gpu_required, gpu_skip_reason

settings.register_profile(
    "ci", max_examples=30, derandomize=True, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=60, deadline=None, print_blob=True)
settings.register_profile(
    "thorough", max_examples=500, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
ACTIVE_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "ci")
settings.load_profile(ACTIVE_PROFILE)


def pytest_configure(config: pytest.Config) -> None:
    # ``real``: tests on a published checkpoint installed from the package index (tests/real);
    # declared here unless pyproject.toml already declares it.
    if not any(m.split(":")[0].strip() == "real" for m in config.getini("markers")):
        config.addinivalue_line(
            "markers", "real: a published checkpoint from the package index (install-or-skip)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    reason = gpu_skip_reason()
    if reason is None:
        return
    if gpu_required():
        pytest.fail(f"DFLASH_REQUIRE_GPU is set but the GPU backend is unusable: {reason}")
    pytest.skip(f"needs a CUDA GPU: {reason}")


@pytest.fixture
def rng() -> np.random.Generator:
    """A fixed-seed generator: tests that draw data themselves stay reproducible."""
    return np.random.default_rng(20261121)
