"""Projections from bf16-stored weights on the CuPy backend (``get_backend("cupy",
weights="bf16")``; off by default).

A weight [N, K] is rounded once to bf16 (round to nearest even, :func:`kernels_cupy.tf32.
round_bf16` is its CPU emulation; cuda/linear_mma.cu ``weights_to_bf16``) and kept as its 16-bit
patterns, so a decode step reads half the weight bytes. 1 to 16 rows run the tensor-core kernel
``linear_mma_rows16_bf16w`` (float32 x split hi + lo in TF32, float32 accumulators; sm_80+);
more rows widen the weight to float32 in blocks of :data:`WIDEN_ROWS` rows for cuBLAS.

The tolerance class (against the float32-weight product ``x @ w.T``, per element):
``|y - x w^T| <= tf32.bf16_coefficient(d_hi, d_lo) * sum_k |x_k w_k|``: the bf16 rounding
(2^-8 of each |w|) and the 3xTF32 bound of the rest (kernels_cupy/tf32.py; depths from
:func:`kernels_cupy.linear_mma_plan.mma_depths` with ``weights="bf16"``). Against the product
with the rounded weights, the 3xTF32 bound alone.

:class:`Bf16Weights` is the backend's ``linear`` op: the model keeps handing it its float32
weight arrays, and it converts each one the first time it sees it, keyed by its memory (device
pointer, shape and strides: a new view of the same weight finds its copy), so the float32
copies stay resident beside the bf16 ones. A weight changed in place after its first use is
not seen again: build a new backend for new weights.
"""

from __future__ import annotations

import cupy as cp

from dflash_ref.ops.linear import check_linear_shapes
from kernels_cupy._build import get_kernel
from kernels_cupy._launch import f32, i32, i64, launch_elementwise
from kernels_cupy.linear import has_tensor_cores
from kernels_cupy.linear_mma_plan import MIN_SM, ROWS, plan_mma

WIDEN_ROWS = 4096  # weight rows widened to float32 at a time for T > 16 (4096 x K floats)


def to_bf16(w) -> cp.ndarray:
    """w [N, K] float32 -> its bf16 bit patterns [N, K] uint16 (nearest, ties to even)."""
    w = f32(w, "to_bf16", "w")
    bits = cp.empty(w.shape, cp.uint16)
    launch_elementwise("linear_mma", "weights_to_bf16", w.size, (w, bits, i64(w.size)))
    return bits


def widen_bf16(bits: cp.ndarray) -> cp.ndarray:
    """bf16 bit patterns (uint16) -> the float32 values they hold (exact)."""
    return (bits.astype(cp.uint32) << 16).view(cp.float32)


def linear_bf16w(x, bits: cp.ndarray) -> cp.ndarray:
    """x [T, K] float32, bits [N, K] uint16 (bf16 weights) -> x @ w.T [T, N] float32."""
    x = f32(x, "linear_bf16w", "x")
    if bits.dtype != cp.uint16 or not bits.flags.c_contiguous:
        raise TypeError(f"linear_bf16w: the weight must be contiguous uint16 bf16 bit patterns "
                        f"(to_bf16), got {bits.dtype}")
    check_linear_shapes(x.shape, bits.shape, "linear_bf16w")
    (T, K), N = x.shape, bits.shape[0]
    y = cp.empty((T, N), cp.float32)
    if T == 0 or N == 0:
        return y
    if T > ROWS:
        for n0 in range(0, N, WIDEN_ROWS):
            blk = slice(n0, min(N, n0 + WIDEN_ROWS))
            y[:, blk] = cp.matmul(x, widen_bf16(bits[blk]).T)  # [T, K] @ [K, n] -> [T, n]
        return y
    if not has_tensor_cores(x.device.id):
        raise RuntimeError(f"linear_bf16w: bf16 weights need a GPU of sm_{MIN_SM} or later "
                           f"(tensor cores); use the default float32 weights here")
    p = plan_mma(T, N, K, weights="bf16")
    get_kernel(p["family"], p["kernel"])(p["grid"], p["block"],
                                         (x, bits, y, i32(T), i32(N), i32(K)))
    return y


class Bf16Weights:
    """The ``linear`` op of a backend with bf16 weights: ``(x, w) -> x @ bf16(w).T``.

    Holds each weight it has converted (and the array itself, so its memory is never freed and
    reused by another array while the copy is held)."""

    def __init__(self):
        self._bits: dict[tuple, tuple[cp.ndarray, cp.ndarray]] = {}

    def __call__(self, x, w) -> cp.ndarray:
        if type(w) is not cp.ndarray:
            raise TypeError(f"linear (bf16 weights): the weight must be a CuPy array, got "
                            f"{type(w).__name__}; move it with backend.to_backend first")
        key = (w.data.ptr, w.shape, w.strides, w.dtype.str)
        hit = self._bits.get(key)
        if hit is None:
            hit = (w, to_bf16(w))
            self._bits[key] = hit
        return linear_bf16w(x, hit[1])

    def __len__(self) -> int:
        """How many weights have a bf16 copy."""
        return len(self._bits)
