"""The backend contract: op table parity between the reference and the twins, backend choice."""

from __future__ import annotations

import importlib
import inspect
import os

import numpy as np
import pytest
from hypothesis import settings

import dflash_ref
from dflash_ref.backend import as_backend, cupy_unavailable_reason, get_backend
from dflash_ref.errors import BackendUnavailable, DFlashRefError
from dflash_ref.ops import OP_FAMILIES


def all_op_names() -> list[str]:
    """Every op name in the table, family order then listed order."""
    return [name for names in OP_FAMILIES.values() for name in names]


def _params(fn) -> inspect.Signature:
    """The signature without its return annotation (np.ndarray vs cp.ndarray may differ)."""
    return inspect.signature(fn).replace(return_annotation=inspect.Signature.empty)


@pytest.mark.parametrize("family", sorted(OP_FAMILIES))
def test_every_op_has_a_twin_with_the_same_signature(family):
    # Importing kernels_cupy needs CuPy (installed by the test extra) but no GPU.
    ref = importlib.import_module(f"dflash_ref.ops.{family}")
    twin = importlib.import_module(f"kernels_cupy.{family}")
    for name in OP_FAMILIES[family]:
        assert hasattr(ref, name), f"dflash_ref.ops.{family} lacks {name}"
        assert hasattr(twin, name), f"kernels_cupy.{family} lacks the twin of {name}"
        assert _params(getattr(ref, name)) == _params(getattr(twin, name)), (
            f"{family}.{name}: reference and twin parameters differ"
        )
        assert getattr(ref, name).__doc__, f"dflash_ref.ops.{family}.{name} needs a docstring"


def test_numpy_backend_has_the_whole_op_table():
    be = get_backend("numpy")
    assert be.name == "numpy" and be.xp is np
    assert sorted(vars(be.ops)) == sorted(all_op_names())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert be.to_numpy(be.to_backend(x)) is not None
    np.testing.assert_array_equal(be.to_numpy(be.to_backend(x)), x)


def test_unknown_backend_name():
    with pytest.raises(ValueError, match="numpy"):
        get_backend("torch")


def test_as_backend_accepts_names_and_backends():
    be = get_backend("numpy")
    assert as_backend(be) is be and as_backend("numpy") is be


def test_cupy_backend_reports_why_it_is_unavailable():
    reason = cupy_unavailable_reason()
    if reason is None:
        be = get_backend("cupy")
        assert be.name == "cupy" and sorted(vars(be.ops)) == sorted(all_op_names())
        assert get_backend("auto").name == "cupy"
        return
    # No usable GPU here: "cupy" must raise with the precise reason, "auto" must fall back.
    with pytest.raises(BackendUnavailable) as info:
        get_backend("cupy")
    assert reason in str(info.value)
    assert isinstance(info.value, DFlashRefError)
    assert get_backend("auto").name == "numpy"


def test_exports():
    assert dflash_ref.__version__ and dflash_ref.get_backend is get_backend


def test_hypothesis_profile_is_the_intended_one():
    intended = os.environ.get("HYPOTHESIS_PROFILE", "ci")
    assert settings().max_examples == settings.get_profile(intended).max_examples
    if intended == "ci":
        assert settings().derandomize and settings().deadline is None


def test_blas_threads_oversubscribed_for_a_tiny_model():
    # issue 25: with the default BLAS threads the demo's speedup fell to ~1.1x on a busy
    # machine; a model below 1024 wide runs with one BLAS thread, a larger one is left alone.
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from dflash_ref.backend import limit_blas_threads

    def blas_threads():
        return [i["num_threads"] for i in threadpoolctl.threadpool_info()
                if i["user_api"] == "blas"]

    before = blas_threads()
    assert before, "NumPy's BLAS is not visible to threadpoolctl"
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):  # a known start
        with limit_blas_threads(128):  # 128 wide: the demo pair
            assert blas_threads() == [1] * len(before)
        assert blas_threads() == [2] * len(before)
        assert limit_blas_threads(2048) is None
        assert blas_threads() == [2] * len(before)
        limiter = limit_blas_threads(640)
        assert blas_threads() == [1] * len(before)
        limiter.restore_original_limits()
        assert blas_threads() == [2] * len(before)
        with limit_blas_threads():  # no size: the caller knows its models are small
            assert blas_threads() == [1] * len(before)
        # A narrow model with a head of LARGE_HEAD weights or more keeps its threads: the head
        # is read from memory every token (Gemma 3 270M: 640 x 262,144). 512 x 32,768 == 2**24.
        assert limit_blas_threads(512, vocab_size=32768) is None
        assert blas_threads() == [2] * len(before)
        with limit_blas_threads(512, vocab_size=32767):  # one column below
            assert blas_threads() == [1] * len(before)
        assert limit_blas_threads(640, vocab_size=262144) is None
