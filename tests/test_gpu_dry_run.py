"""The CPU dry run of ``gpu`` twin tests (tests/gpu.py, conftest.py): what CI checks of a ``gpu``
test on a machine without a GPU."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu import calls_check_twin, check_twin, twin_dry_run


def test_dry_run_runs_the_numpy_side_only():
    with twin_dry_run() as ran:
        check_twin("argmax_rows", (np.zeros((2, 3), np.float32),), tol="exact")
        check_twin("softmax", (np.ones((1, 4), np.float32),), tol="float32_rowsum")
    assert ran == ["argmax_rows", "softmax"]


def test_dry_run_fails_on_inputs_a_twin_cannot_take():
    # The shape of the bug issue 28 found: a ragged array never reaches the op on the GPU either.
    ragged = np.array([[1.0, 3.0], [2.0]], dtype=object)
    with twin_dry_run(), pytest.raises(TypeError, match="cannot be copied to the device"):
        check_twin("argmax_rows", (ragged,), tol="exact")
    with twin_dry_run(), pytest.raises(TypeError):  # the NumPy side itself runs: a bad keyword
        check_twin("argmax_rows", (np.zeros((2, 3), np.float32),), {"axis": 0}, tol="exact")


def _a_twin_test():
    check_twin("argmax_rows", (np.zeros((1, 1), np.float32),), tol="exact")


def _not_a_twin_test():
    return np.zeros(1)


def test_which_tests_run_as_a_dry_run():
    assert calls_check_twin(_a_twin_test) and not calls_check_twin(_not_a_twin_test)
