"""CuPy twin of :mod:`dflash_ref.ops.rope` (kernel in cuda/rope.cu)."""

from __future__ import annotations

import functools

import cupy as cp

from dflash_ref.ops.rope import rope_inv_freq
from kernels_cupy._launch import f32, i32, i64, launch_elementwise


@functools.lru_cache(maxsize=64)
def _inv_freq_on_device(theta: float, rotary_dim: int, factor: float, device_id: int):
    """The reference's ``rope_inv_freq`` table [rd/2] f32, copied to ``device_id`` once.

    A model has one or two RoPE configurations and calls the op twice per layer and step; the
    table is a constant of (theta, rotary_dim, factor), so it is uploaded once per process rather
    than on every call. Kernels only read it.
    """
    with cp.cuda.Device(device_id):
        return cp.asarray(rope_inv_freq(theta, rotary_dim, factor))


def rope(x, positions, theta: float, rotary_dim: int | None = None,
         factor: float = 1.0) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.rope.rope`: x [T, H, d], positions [T] -> [T, H, d] f32.

    The inverse-frequency table comes from the reference's ``rope_inv_freq`` so both backends
    form the same float32 angle; it is kept on the device per configuration. ``positions`` may
    be host integers (copied on every call) or a device int32 array (read as it is: the target
    passes the batch's positions, uploaded once per forward).
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
    inv_freq = _inv_freq_on_device(float(theta), rd, float(factor), cp.cuda.Device().id)
    y = cp.empty_like(x)
    launch_elementwise(
        "rope", "rope_neox_f32", x.size, (x, pos, inv_freq, y, i64(x.size), i32(H), i32(d), i32(rd))
    )
    return y
