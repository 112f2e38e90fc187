"""GPU-test plumbing: the ``gpu`` marker's skip rule and the NumPy-vs-CuPy twin check.

- :func:`gpu_skip_reason`: why ``gpu`` tests cannot run here (``None`` when they can).
- :func:`gpu_required`: ``DFLASH_REQUIRE_GPU=1`` turns those skips into failures (conftest.py).
- :func:`check_twin`: run an op on NumPy and on CuPy with the same inputs and compare on the
  host with :func:`dflash_ref.testing.assert_close`.
"""

from __future__ import annotations

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


def check_twin(op: str, args: tuple, kwargs: dict | None = None, tol: str = "float32_elementwise",
               case: str = "") -> None:
    """Run ``op`` on the NumPy reference and the CuPy twin with the same host inputs; compare.

    ``args`` are NumPy arrays or scalars; arrays are copied to the device for the twin.
    Tuple outputs are compared element by element.
    """
    kwargs = kwargs or {}
    np_be, cp_be = get_backend("numpy"), get_backend("cupy")
    expected = getattr(np_be.ops, op)(*args, **kwargs)
    dev_args = tuple(cp_be.to_backend(a) if isinstance(a, np.ndarray) else a for a in args)
    actual = getattr(cp_be.ops, op)(*dev_args, **kwargs)
    if isinstance(expected, tuple):
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, tol, op=op, tensor=f"output[{i}]", case=case)
    else:
        assert_close(actual, expected, tol, op=op, case=case)
