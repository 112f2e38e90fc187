"""CuPy twins of :mod:`dflash_ref.ops.rope` (kernels in cuda/rope.cu)."""

from __future__ import annotations

import functools

import cupy as cp

from dflash_ref.ops.rope import rope_inv_freq
from kernels_cupy._build import QK_THREADS, get_kernel
from kernels_cupy._launch import f32, f32_strided, fp32, i32, i64, launch_elementwise


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


def qk_norm_rope(q, k, positions, q_weight, k_weight, eps: float, offset: float, theta: float,
                 rotary_dim: int | None = None, factor: float = 1.0):
    """Twin of :func:`dflash_ref.ops.rope.qk_norm_rope`: q [T, nq, d], k [T, nk, d] ->
    (q', k') contiguous f32, from one launch of ``qk_norm_rope_f32`` (one block per head row of
    q and k). q and k are read in place when their channels are contiguous (rows and heads may
    be strided: the column slices of the stacked q/k/v product, a [q | gate] head); a weight of
    None skips that norm; q None: keys only. ``positions`` as :func:`rope`'s."""
    keys_only = q is None  # no queries: k alone (q' is None)
    (k, ks) = f32_strided(k, "qk_norm_rope", "k")
    (q, qs) = (k[:, :0], (0, 0, 1)) if keys_only else f32_strided(q, "qk_norm_rope", "q")
    if q.ndim != 3 or k.ndim != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"qk_norm_rope expects q [T, nq, d] (or None) and k [T, nk, d] with "
                         f"the same T and d, got shapes {q.shape} and {k.shape}")
    T, nq, d = q.shape
    nk = k.shape[1]
    rd = d if rotary_dim is None else int(rotary_dim)
    if rd > d:
        raise ValueError(f"rotary_dim {rd} exceeds head_dim {d}")
    pos = cp.ascontiguousarray(cp.asarray(positions), dtype=cp.int32)
    if pos.shape != (T,):
        raise ValueError(f"positions must have shape [{T}], got {pos.shape}")
    inv_freq = _inv_freq_on_device(float(theta), rd, float(factor), cp.cuda.Device().id)
    weights = []
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        w = inv_freq if w is None else f32(w, "qk_norm_rope", name)  # None: not read
        if w is not inv_freq and w.shape != (d,):
            raise ValueError(f"qk_norm_rope: {name} has shape {w.shape}, expected ({d},)")
        weights.append(w)
    yq, yk = cp.empty((T, nq, d), cp.float32), cp.empty((T, nk, d), cp.float32)
    rows = T * (nq + nk)
    if rows and d:
        get_kernel("rope", "qk_norm_rope_f32")((rows,), (QK_THREADS,), (
            q, k, pos, weights[0], weights[1], inv_freq, yq, yk, i32(nq), i32(nk), i32(d),
            i32(rd), i64(qs[0]), i64(qs[1]), i64(ks[0]), i64(ks[1]), i32(q_weight is not None),
            i32(k_weight is not None), fp32(eps), fp32(offset)))
    return (None if keys_only else yq), yk
