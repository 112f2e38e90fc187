"""Tests of the scripts in benchmarks/ (not a package): :func:`load_benchmark` imports one."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(name: str) -> ModuleType:
    """Import ``benchmarks/<name>.py`` as a module (its ``main(argv)`` is then callable)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_exits_cleanly_without_a_gpu(name: str) -> None:
    """``benchmarks/<name>.py --quick`` on a machine without a usable GPU: exit 1, one message
    naming the reason on stderr, no traceback, and no table or half-printed timings."""
    import subprocess
    import sys

    import pytest

    from tests.gpu import gpu_skip_reason

    if gpu_skip_reason() is None:
        pytest.skip("a GPU is usable here; test_quick_run_checks_then_times covers the script")
    run = subprocess.run([sys.executable, str(BENCHMARKS / f"{name}.py"), "--quick"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr
    assert "no usable CUDA GPU" in run.stderr and "Traceback" not in run.stderr
    assert run.stdout == ""
