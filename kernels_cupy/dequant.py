"""CuPy twins of :mod:`dflash_ref.ops.dequant` (kernels in cuda/dequant.cu)."""

from __future__ import annotations

import cupy as cp
import numpy as np

from dflash_ref.ops.dequant import check_quant_input
from kernels_cupy._launch import i64, launch_elementwise

# (weights per block, bytes per block, kernel) of each format, as in dflash_ref/ops/dequant.py.
_FORMATS = {
    "q8_0": (32, 34, "dequantize_q8_0_f32"),
    "q4_k": (256, 144, "dequantize_q4_k_f32"),
    "q6_k": (256, 210, "dequantize_q6_k_f32"),
}


def _dequantize(fmt: str, raw, shape) -> cp.ndarray:
    """Check raw (uint8, size = nblocks * bytes) against shape, launch, return float32 [shape]."""
    block, type_size, kernel = _FORMATS[fmt]
    raw = cp.asarray(raw)
    shape = check_quant_input(raw, shape, block, type_size, fmt)
    n = int(np.prod(shape, dtype=np.int64))
    raw = cp.ascontiguousarray(raw)
    y = cp.empty(shape, dtype=cp.float32)
    launch_elementwise("dequant", kernel, n, (raw, y, i64(n)))
    return y


def dequantize_q8_0(raw, shape) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.dequant.dequantize_q8_0`: uint8 [nb*34] -> f32 [shape]."""
    return _dequantize("q8_0", raw, shape)


def dequantize_q4_k(raw, shape) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.dequant.dequantize_q4_k`: uint8 [nb*144] -> f32 [shape]."""
    return _dequantize("q4_k", raw, shape)


def dequantize_q6_k(raw, shape) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.dequant.dequantize_q6_k`: uint8 [nb*210] -> f32 [shape]."""
    return _dequantize("q6_k", raw, shape)
