"""CuPy twins of :mod:`dflash_ref.ops.activations` (kernels in cuda/activations.cu)."""

from __future__ import annotations

import cupy as cp

from kernels_cupy._launch import f32, f32_strided, i32, i64, launch_elementwise, launch_rows


def _rows(x, op: str, arg: str) -> tuple[cp.ndarray, int]:
    """x [..., F] -> (x, its row stride in elements): a 2-D array whose rows are contiguous is
    read in place (a column slice of the stacked gate/up product), anything else made
    contiguous (row stride F)."""
    if getattr(x, "ndim", 0) == 2:
        x, strides = f32_strided(x, op, arg)
        return x, strides[0]
    x = f32(x, op, arg)
    return x, x.shape[-1] if x.ndim else 1


def _gated(kernel: str, op: str, gate, up) -> cp.ndarray:
    """``act(gate) * up`` [..., F] from one launch of ``kernel`` (swiglu_f32 / geglu_f32)."""
    (gate, gs), (up, us) = _rows(gate, op, "gate"), _rows(up, op, "up")
    if gate.shape != up.shape:
        raise ValueError(f"{op}: gate {gate.shape} and up {up.shape} must have the same shape")
    y = cp.empty(gate.shape, cp.float32)
    F = gate.shape[-1] if gate.ndim else 1
    launch_elementwise("activations", kernel, y.size,
                       (gate, up, y, i64(y.size), i64(F), i64(gs), i64(us)))
    return y


def swiglu(gate, up) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.activations.swiglu`: silu(gate) * up, [..., F] -> [..., F]
    contiguous; 2-D gate and up are read in place when their rows are contiguous."""
    return _gated("swiglu_f32", "swiglu", gate, up)


def geglu(gate, up) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.activations.geglu`: gelu_tanh(gate) * up, [..., F] ->
    [..., F] contiguous, one launch; 2-D inputs read in place as :func:`swiglu`'s."""
    return _gated("geglu_f32", "geglu", gate, up)


def sigmoid_gate(x, gate) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.activations.sigmoid_gate`: x * sigmoid(gate), [..., n] ->
    [..., n] contiguous, one launch; 2-D and 3-D inputs with contiguous channels are read in
    place (rows and heads strided), others made contiguous first."""
    views = []
    for arr, name in ((x, "x"), (gate, "gate")):
        if getattr(arr, "ndim", 0) in (2, 3):
            arr, st = f32_strided(arr, "sigmoid_gate", name)
        else:
            arr = f32(arr, "sigmoid_gate", name)
            st = (arr.shape[-1] if arr.ndim else 1,) * 2
        views.append((arr, st if len(st) == 3 else (st[0], 0, st[-1])))
    (x, xs), (gate, gs) = views
    if x.shape != gate.shape:
        raise ValueError(f"sigmoid_gate: x {x.shape} and gate {gate.shape} must have the same "
                         f"shape")
    n = x.shape[-1] if x.ndim else 1
    H = x.shape[-2] if x.ndim == 3 else 1  # [R, H, n]: rows, heads, channels
    y = cp.empty(x.shape, cp.float32)
    launch_elementwise("activations", "sigmoid_gate_f32", y.size,
                       (x, gate, y, i64(y.size), i64(H), i64(n), i64(xs[0]), i64(xs[1]),
                        i64(gs[0]), i64(gs[1])))
    return y


def gdn_gates(b, a, A, dt_bias):
    """Twin of :func:`dflash_ref.ops.activations.gdn_gates`: b, a [T, HV], A, dt_bias [HV] ->
    (beta, g) contiguous [T, HV] each, one launch; b and a are read in place when their rows
    are contiguous (the column slices of the stacked input projection)."""
    (b, bs), (a, as_) = f32_strided(b, "gdn_gates", "b"), f32_strided(a, "gdn_gates", "a")
    A, dt_bias = f32(A, "gdn_gates", "A"), f32(dt_bias, "gdn_gates", "dt_bias")
    if b.ndim != 2 or a.shape != b.shape or A.shape != (b.shape[1],) or A.shape != dt_bias.shape:
        raise ValueError(f"gdn_gates: expected b, a [T, HV] and A, dt_bias [HV]; got b "
                         f"{b.shape}, a {a.shape}, A {A.shape}, dt_bias {dt_bias.shape}")
    beta, g = cp.empty(b.shape, cp.float32), cp.empty(b.shape, cp.float32)
    launch_elementwise("activations", "gdn_gates_f32", b.size,
                       (b, a, A, dt_bias, beta, g, i64(b.size), i32(b.shape[1]), i64(bs[0]),
                        i64(as_[0])))
    return beta, g


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
