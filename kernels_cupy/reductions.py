"""CuPy twins of :mod:`dflash_ref.ops.reductions` (kernels in cuda/reductions.cu).

The non-finite rule of the reference (NaN wins the argmax, first NaN first; softmax-based
reductions give NaN where the row max is not finite) is implemented in the kernels themselves.
"""

from __future__ import annotations

import cupy as cp

from kernels_cupy._launch import f32, i32, launch_rows


def _reduce_rows(kernel: str, op: str, logits, out_dtype) -> cp.ndarray:
    """Run a one-output-per-row kernel over logits [..., V] -> [...]."""
    x = f32(logits, op, "logits")
    n = x.shape[-1]
    out = cp.empty(x.shape[:-1], dtype=out_dtype)
    launch_rows("reductions", kernel, out.size, (x, out, i32(n)))
    return out


def argmax_rows(logits) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.reductions.argmax_rows`: [..., V] -> [...] int64."""
    return _reduce_rows("argmax_rows_f32", "argmax_rows", logits, cp.int64)


def top1_prob_rows(logits) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.reductions.top1_prob_rows`: [..., V] -> [...] f32."""
    return _reduce_rows("top1_prob_rows_f32", "top1_prob_rows", logits, cp.float32)


def entropy_rows(logits) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.reductions.entropy_rows`: [..., V] -> [...] f32."""
    return _reduce_rows("entropy_rows_f32", "entropy_rows", logits, cp.float32)


def count_nonfinite_rows(logits) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.reductions.count_nonfinite_rows`: [..., V] -> [...] int64."""
    return _reduce_rows("count_nonfinite_rows_f32", "count_nonfinite_rows", logits, cp.int64)
