"""Argument checks and launch helpers shared by the CuPy twins (docs/backend.md, "Adding an op").

CuPy checks nothing about RawKernel arguments: a Python int is passed as 64 bits and an ``int``
parameter then reads garbage, and a non-contiguous or float64 array is read as raw float32
memory. Every wrapper therefore goes through these helpers: arrays are checked for dtype and made
contiguous, scalars are cast to the exact C types the kernel declares.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from kernels_cupy._build import ELEMENTWISE_BLOCK, ROW_BLOCK, get_kernel

_F32 = np.dtype(np.float32)


def f32(x, op: str, arg: str) -> cp.ndarray:
    """``x`` as a contiguous float32 CuPy array; any other dtype is a TypeError naming the op.

    The common case (already one) returns at once: three attribute reads, no call into CuPy
    (this check runs for every array of every launch; an op call costs 13.4 us of host time
    against 5.7 us for a bare ``RawKernel`` on an H200: docs/performance.md)."""
    if type(x) is cp.ndarray and x.dtype == _F32 and x.flags.c_contiguous:
        return x
    x = cp.asarray(x)
    if x.dtype != cp.float32:
        raise TypeError(
            f"{op}: {arg} has dtype {x.dtype}, but the CuPy kernels take float32; "
            f"cast with .astype(cupy.float32) (float64 is for the NumPy reference's closed-form "
            f"tests only)"
        )
    return cp.ascontiguousarray(x)


def f32_strided(x, op: str, arg: str) -> tuple[cp.ndarray, tuple[int, ...]]:
    """``x`` as float32 CuPy with its last axis contiguous, and its strides in elements.

    For the twins that read rows in place (``swiglu``, ``geglu``, ``sigmoid_gate``,
    ``gdn_gates``, ``l2_norm``, ``qk_norm_rope``): a column slice of a stacked product
    (``Projections``, dflash_ref/models/layers.py) is strided over its rows and contiguous along
    them, and is passed as it is, with no copy launched. Anything else (a float32 array with a
    strided last axis, negative strides) is made contiguous by :func:`f32` first.
    tests/device_counter.py counts copies by the same rule (``READS_STRIDED_ROWS``)."""
    if not (type(x) is cp.ndarray and x.dtype == _F32 and x.ndim
            and x.strides[-1] == 4 and all(s >= 0 and s % 4 == 0 for s in x.strides)):
        x = f32(x, op, arg)
    return x, tuple(s // 4 for s in x.strides)


def i32(v) -> np.int32:
    """A C ``int`` kernel argument."""
    return np.int32(v)


def i64(v) -> np.int64:
    """A C ``long long`` kernel argument."""
    return np.int64(v)


def fp32(v) -> np.float32:
    """A C ``float`` kernel argument."""
    return np.float32(v)


def launch_rows(family: str, name: str, rows: int, args: tuple) -> None:
    """Launch a one-block-per-row kernel over ``rows`` rows (nothing to do for zero rows)."""
    if rows > 0:
        get_kernel(family, name)((rows,), (ROW_BLOCK,), args)


def launch_elementwise(family: str, name: str, total: int, args: tuple) -> None:
    """Launch a grid-stride elementwise kernel over ``total`` elements."""
    if total > 0:
        blocks = min((total + ELEMENTWISE_BLOCK - 1) // ELEMENTWISE_BLOCK, 65536)
        get_kernel(family, name)((blocks,), (ELEMENTWISE_BLOCK,), args)


def check_last_dim(x: cp.ndarray, weight: cp.ndarray, op: str) -> None:
    """``weight`` must be [n] where n is the last dimension of ``x``."""
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"{op}: weight has shape {weight.shape}, expected ({x.shape[-1]},)")
