"""GPU-test plumbing: the ``gpu`` marker's skip rule and the NumPy-vs-CuPy twin check.

- :func:`gpu_skip_reason`: why ``gpu`` tests cannot run here (``None`` when they can).
- :func:`gpu_required`: ``DFLASH_REQUIRE_GPU=1`` turns those skips into failures (conftest.py).
- :func:`check_twin`: run an op on NumPy and on CuPy with the same inputs and compare on the
  host with :func:`dflash_ref.testing.assert_close`.
- :func:`twin_dry_run`: where no GPU is usable, a ``gpu`` test that calls :func:`check_twin`
  still runs on the CPU (conftest.py): its inputs are built, every ``check_twin`` runs the NumPy
  side and checks that the inputs could go to the device, then the test is reported skipped. A
  ``gpu`` test that cannot even build its inputs (a ragged array, a wrong keyword) fails in CI.
"""

from __future__ import annotations

import contextlib
import inspect
import os

import numpy as np

from dflash_ref.backend import cupy_unavailable_reason, get_backend
from dflash_ref.testing import assert_close


def gpu_skip_reason() -> str | None:
    """``None`` when CuPy and a CUDA device are usable, else the reason ``gpu`` tests skip."""
    return cupy_unavailable_reason()


def gpu_required() -> bool:
    """``DFLASH_REQUIRE_GPU=1`` turns ``gpu`` skips into failures (set it on GPU machines)."""
    return os.environ.get("DFLASH_REQUIRE_GPU", "") not in ("", "0")


_DRY_RUN: list[str] | None = None  # ops whose NumPy side ran in the current dry run, else None


def calls_check_twin(test_function) -> bool:
    """Whether a test function's own code calls :func:`check_twin` (through hypothesis's
    wrapper and ``functools.wraps`` too): such a ``gpu`` test can run as a CPU dry run."""
    fn = getattr(getattr(test_function, "hypothesis", None), "inner_test", test_function)
    return "check_twin" in inspect.unwrap(fn).__code__.co_names


@contextlib.contextmanager
def twin_dry_run():
    """Within it, :func:`check_twin` runs only the NumPy side (no device); yields the list of the
    ops it ran, filled as the body goes."""
    global _DRY_RUN
    previous, _DRY_RUN = _DRY_RUN, []
    try:
        yield _DRY_RUN
    finally:
        _DRY_RUN = previous


def _check_device_ready(op: str, args: tuple, case: str) -> None:
    """What :func:`check_twin` would copy to the device: plain numeric NumPy arrays."""
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray) and a.dtype.kind not in "biuf":
            raise TypeError(f"check_twin({op!r}, case={case!r}): argument {i} is a {a.dtype} array "
                            "and cannot be copied to the device; pass a numeric NumPy array "
                            "(a ragged list becomes an object array)")


def check_twin(op: str, args: tuple, kwargs: dict | None = None, tol: str = "float32_elementwise",
               case: str = "") -> None:
    """Run ``op`` on the NumPy reference and the CuPy twin with the same host inputs; compare.

    ``args`` are NumPy arrays or scalars; arrays are copied to the device for the twin.
    Tuple outputs are compared element by element. In a :func:`twin_dry_run`, only the NumPy side.
    """
    kwargs = kwargs or {}
    np_be = get_backend("numpy")
    _check_device_ready(op, args, case)
    expected = getattr(np_be.ops, op)(*args, **kwargs)
    if _DRY_RUN is not None:
        _DRY_RUN.append(op)
        return
    cp_be = get_backend("cupy")
    dev_args = tuple(cp_be.to_backend(a) if isinstance(a, np.ndarray) else a for a in args)
    actual = getattr(cp_be.ops, op)(*dev_args, **kwargs)
    if isinstance(expected, tuple):
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, tol, op=op, tensor=f"output[{i}]", case=case)
    else:
        assert_close(actual, expected, tol, op=op, case=case)
