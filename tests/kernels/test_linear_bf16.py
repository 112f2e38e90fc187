"""bf16 weight storage (kernels_cupy/linear_bf16.py, ``get_backend("cupy", weights="bf16")``).

On CPU: the option's errors, and that bf16 storage needs its own tolerance class: the emulated
kernel (tests/kernels/test_linear_mma.py) with bf16 weights is within
``tf32.bf16_coefficient * sum |x w|`` of the float32-weight product, and outside the float32
weights' 3xTF32 bound (so the class is not the float32 one in disguise). The rounding itself is
checked against gguf-py's BF16 quantizer (tests/kernels/test_tf32_bound.py). On a GPU (``gpu``):
the device rounding bit for bit, the kernel and the widened cuBLAS path within their bounds, and
the backend's weight cache.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dflash_ref.backend import get_backend
from kernels_cupy.linear_mma_plan import mma_depths
from kernels_cupy.tf32 import U_BF16, bf16_coefficient, bound_coefficient, round_bf16
from tests.kernels.test_linear_mma import assert_within, emulate_linear_mma


def _inputs(T, N, K, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((T, K)).astype(np.float32)
    w = (rng.standard_normal((N, K)) / math.sqrt(max(K, 1))).astype(np.float32)
    return x, w


def test_the_option_is_the_cupy_backends_and_named():
    with pytest.raises(ValueError, match="option of the cupy backend"):
        get_backend("numpy", weights="bf16")
    with pytest.raises(ValueError, match="unknown weight storage 'fp8'"):
        get_backend("numpy", weights="fp8")
    assert get_backend("numpy").weights == "float32"  # off by default


def test_bf16_storage_has_its_own_tolerance_class():
    # Against the float32-weight product: within bf16_coefficient (2^-8 of each |w| plus the
    # 3xTF32 bound), and outside the float32 weights' bound (which a kernel reading float32
    # weights must meet): a backend that silently read bf16 weights would be caught.
    x, w = _inputs(16, 24, 1028, seed=4)
    y = emulate_linear_mma(x, w, "random", weights="bf16")
    ratio = assert_within(y, x, w, "bf16", "bf16 class")
    assert ratio < 0.5
    with pytest.raises(AssertionError, match="past the bound"):
        assert_within(y, x, w, "float32", "bf16 held to the float32 bound")
    d = mma_depths(1028, "bf16")
    assert bf16_coefficient(*d) == pytest.approx(U_BF16 + bound_coefficient(*d) * (1 + U_BF16))


def test_rounding_to_bf16_is_within_its_unit():
    # |round_bf16(w) - w| <= 2^-8 |w| (RNE to 8 significant bits), the class's first term;
    # reached within a factor of two by halfway values.
    w = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    rel = np.abs(round_bf16(w).astype(np.float64) - w) / np.abs(w)
    assert rel.max() <= U_BF16 and rel.max() > U_BF16 / 2


# ---------------------------------------------------------------- on the device (gpu)


@pytest.mark.gpu
def test_device_rounding_equals_the_emulation():
    import cupy as cp

    from kernels_cupy.linear_bf16 import to_bf16, widen_bf16

    rng = np.random.default_rng(5)
    w = (rng.standard_normal((37, 129)) * 10.0 ** rng.integers(-20, 20, (37, 129))).astype(
        np.float32)
    w[0, :3] = [1 + 2.0**-8, 1 + 3 * 2.0**-8, np.inf]
    np.testing.assert_array_equal(widen_bf16(to_bf16(cp.asarray(w))).get(), round_bf16(w))


@pytest.mark.gpu
@pytest.mark.parametrize(("T", "N", "K"), [(1, 2560, 2560), (16, 37, 1028), (7, 5, 3),
                                           (40, 4100, 520), (16, 9, 0)], ids=str)
def test_bf16_projection_within_its_bounds(T, N, K):
    import cupy as cp

    from kernels_cupy.linear import has_tensor_cores
    from kernels_cupy.linear_bf16 import linear_bf16w, to_bf16
    from tests.kernels.test_linear_plan import linear_bound

    if not has_tensor_cores(cp.cuda.Device().id):
        pytest.skip("bf16 weights need sm_80+")
    x, w = _inputs(T, N, K, seed=T + N)
    y = linear_bf16w(cp.asarray(x), to_bf16(cp.asarray(w))).get()
    wr = round_bf16(w)
    if T <= 16:  # the tensor-core kernel: the 3xTF32 bound against the rounded weights
        assert_within(y, x, wr, "float32", f"bf16 kernel {T, N, K}")
    else:  # widened to float32 for cuBLAS: any order of K terms, gamma_K
        exact = x.astype(np.float64) @ wr.astype(np.float64).T
        err = np.abs(y - exact)
        assert (err <= linear_bound(x, wr, max(K, 1))).all()
    assert_within(y, x, w, "bf16", f"bf16 class {T, N, K}")


@pytest.mark.gpu
def test_the_backend_converts_each_weight_once():
    import cupy as cp

    from kernels_cupy.linear import has_tensor_cores

    if not has_tensor_cores(cp.cuda.Device().id):
        pytest.skip("bf16 weights need sm_80+")
    be = get_backend("cupy", weights="bf16")
    assert be.weights == "bf16" and be is not get_backend("cupy")
    x, w = _inputs(4, 24, 256, seed=9)
    wd = be.to_backend(w)
    cache = be.ops.linear
    n0 = len(cache)
    y1 = be.ops.linear(be.to_backend(x), wd).get()
    y2 = be.ops.linear(be.to_backend(x), wd[:]).get()  # a new view of the same memory
    assert len(cache) == n0 + 1
    np.testing.assert_array_equal(y1, y2)
    assert_within(y1, x, w, "bf16", "backend bf16")
    with pytest.raises(TypeError, match="CuPy array"):
        be.ops.linear(be.to_backend(x), w)
