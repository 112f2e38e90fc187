"""Shared test configuration: hypothesis profiles and the ``gpu`` marker's skip rule.

Hypothesis profiles (choose with HYPOTHESIS_PROFILE; ``ci`` is the default):
    ci        derandomized, 30 examples, no deadline: reproducible and bounded for CI
    dev       60 random examples, no deadline
    thorough  500 random examples, no deadline: run before a release or after touching an op

``gpu`` tests skip with the reason from :func:`tests.gpu.gpu_skip_reason` when CuPy or
a CUDA device is missing; with DFLASH_REQUIRE_GPU=1 they fail instead, so a GPU machine with a
broken CuPy install cannot pass by skipping. A skipped ``gpu`` test that calls ``check_twin`` first
runs as a CPU dry run (:func:`tests.gpu.twin_dry_run`): a failure there is a failure.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import dflash_ref
from dflash_ref.errors import BackendUnavailable
from tests.gpu import calls_check_twin, gpu_required, gpu_skip_reason, twin_dry_run

DRY_RUN = pytest.StashKey[str]()  # the skip reason of a gpu test that runs as a CPU dry run

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
    if isinstance(item, pytest.Function) and calls_check_twin(item.function):
        item.stash[DRY_RUN] = reason  # runs in pytest_runtest_call, NumPy side only
        return
    pytest.skip(f"needs a CUDA GPU: {reason}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    reason = item.stash.get(DRY_RUN, None)
    if reason is None:
        return (yield)
    stopped = ""
    with twin_dry_run() as ran:
        try:
            yield  # an exception here (inputs that cannot be built, the NumPy side failing) fails
        except Exception as e:
            if not _needs_the_device(e):
                raise
            stopped = f"; it stopped at its own use of the device ({type(e).__name__})"
    pytest.skip(f"needs a CUDA GPU: {reason} (CPU dry run passed: inputs built, NumPy side of "
                f"{len(ran)} check_twin call(s) ran{stopped})")


def _needs_the_device(e: Exception) -> bool:
    """The dry run went as far as a CPU goes: the test asked for the CuPy backend or CUDA."""
    return (isinstance(e, BackendUnavailable)
            or type(e).__name__ in ("CUDARuntimeError", "CUDADriverError"))


@pytest.fixture
def rng() -> np.random.Generator:
    """A fixed-seed generator: tests that draw data themselves stay reproducible."""
    return np.random.default_rng(20261121)


DEMO_PAIR = os.path.join(os.path.dirname(dflash_ref.__file__), "data", "demo")


@pytest.fixture(scope="module")
def demo_pair():
    """The shipped demo pair (dflash_ref/data/demo) as (target, drafter), loaded the way a user
    loads it; one per test module (a test that changes a model changes a copy)."""
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel

    target = TargetModel.from_pretrained(os.path.join(DEMO_PAIR, "target"))
    return target, DFlashDrafter.from_pretrained(os.path.join(DEMO_PAIR, "drafter"), target)


@pytest.fixture(scope="module")
def demo_tokenizer():
    """The demo target's byte tokenizer (dflash_ref/data/demo/target/tokenizer.json)."""
    from dflash_ref.io.tokenizer import load_tokenizer

    return load_tokenizer(os.path.join(DEMO_PAIR, "target"))


# CI's second pass (.ci/run): the first run of the README's test command records every test that
# skipped (DFLASH_SKIPPED_LOG=FILE, one node id a line); after the optional extras are installed,
# DFLASH_RERUN_SKIPPED=FILE runs only those, so each test runs once with what it needs.
def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    log = os.environ.get("DFLASH_SKIPPED_LOG")
    if log and report.skipped and report.when in ("setup", "call"):
        with open(log, "a") as f:
            f.write(report.nodeid + "\n")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    log = os.environ.get("DFLASH_SKIPPED_LOG")
    if log and report.skipped:  # a whole module skipped (importorskip at its top)
        with open(log, "a") as f:
            f.write(report.nodeid + "\n")


def _was_skipped(item: pytest.Item, skipped: set[str]) -> bool:
    return item.nodeid in skipped or item.nodeid.split("::")[0] in skipped


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rerun = os.environ.get("DFLASH_RERUN_SKIPPED")
    if not rerun:
        return
    skipped = set(open(rerun).read().split("\n")) - {""}
    config.hook.pytest_deselected(items=[it for it in items if not _was_skipped(it, skipped)])
    items[:] = [it for it in items if _was_skipped(it, skipped)]
