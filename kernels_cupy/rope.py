"""CuPy twin of :mod:`dflash_ref.ops.rope` (kernel in cuda/rope.cu)."""

from __future__ import annotations

import cupy as cp

from dflash_ref.ops.rope import rope_inv_freq
from kernels_cupy._launch import f32, i32, i64, launch_elementwise


def rope(x, positions, theta: float, rotary_dim: int | None = None,
         factor: float = 1.0) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.rope.rope`: x [T, H, d], positions [T] -> [T, H, d] f32.

    The inverse-frequency table comes from the reference's ``rope_inv_freq`` so both backends
    form the same float32 angle.
    """
    x = f32(x, "rope", "x")
    if x.ndim != 3:
        raise ValueError(f"rope expects x of shape [T, H, d], got {x.shape}")
    T, H, d = x.shape
    rd = d if rotary_dim is None else int(rotary_dim)
    if rd > d:
        raise ValueError(f"rotary_dim {rd} exceeds head_dim {d}")
    pos = cp.ascontiguousarray(cp.asarray(positions), dtype=cp.int32)
    if pos.shape != (T,):
        raise ValueError(f"positions must have shape [{T}], got {pos.shape}")
    inv_freq = cp.asarray(rope_inv_freq(theta, rd, factor))  # [rd/2] f32
    y = cp.empty_like(x)
    launch_elementwise(
        "rope", "rope_neox_f32", x.size, (x, pos, inv_freq, y, i64(x.size), i32(H), i32(d), i32(rd))
    )
    return y
