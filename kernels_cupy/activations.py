"""CuPy twins of :mod:`dflash_ref.ops.activations` (kernels in cuda/activations.cu)."""

from __future__ import annotations

import cupy as cp

from kernels_cupy._launch import f32, i32, i64, launch_elementwise, launch_rows


def swiglu(gate, up) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.activations.swiglu`: silu(gate) * up, [..., F]."""
    gate, up = f32(gate, "swiglu", "gate"), f32(up, "swiglu", "up")
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate {gate.shape} and up {up.shape} must have the same shape")
    y = cp.empty_like(gate)
    launch_elementwise("activations", "swiglu_f32", gate.size, (gate, up, y, i64(gate.size)))
    return y


def _row_op(kernel: str, op: str, x, axis: int) -> cp.ndarray:
    """Run a row kernel along ``axis`` by moving that axis last and back."""
    x = f32(x, op, "x")
    moved = cp.ascontiguousarray(cp.moveaxis(x, axis, -1))  # [..., n]
    y = cp.empty_like(moved)
    n = moved.shape[-1]
    launch_rows("activations", kernel, moved.size // max(n, 1), (moved, y, i32(n)))
    return cp.moveaxis(y, -1, axis)


def softmax(x, axis: int = -1) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.activations.softmax`."""
    return _row_op("softmax_rows_f32", "softmax", x, axis)


def log_softmax(x, axis: int = -1) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.activations.log_softmax`."""
    return _row_op("log_softmax_rows_f32", "log_softmax", x, axis)
