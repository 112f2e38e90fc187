"""CuPy twins of :mod:`dflash_ref.ops.norm` (kernels in cuda/norm.cu)."""

from __future__ import annotations

import cupy as cp

from dflash_ref.ops.norm import L2_NORM_MODES
from kernels_cupy._launch import check_last_dim, f32, f32_strided, fp32, i32, i64, launch_rows


def rms_norm(x, weight, eps: float, offset: float = 0.0) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.norm.rms_norm`: x [..., n], weight [n] -> [..., n] f32."""
    x, w = f32(x, "rms_norm", "x"), f32(weight, "rms_norm", "weight")
    check_last_dim(x, w, "rms_norm")
    y = cp.empty_like(x)
    n = x.shape[-1]
    args = (x, w, y, i32(n), fp32(eps), fp32(offset))
    launch_rows("norm", "rms_norm_f32", x.size // max(n, 1), args)
    return y


def add_rms_norm(x, residual, weight, eps: float, offset: float = 0.0):
    """Twin of :func:`dflash_ref.ops.norm.add_rms_norm`: x, residual [..., n], weight [n] ->
    (h, normed), both [..., n] f32, from one launch that reads x and residual once."""
    x, r = f32(x, "add_rms_norm", "x"), f32(residual, "add_rms_norm", "residual")
    w = f32(weight, "add_rms_norm", "weight")
    if r.shape != x.shape:
        raise ValueError(f"add_rms_norm: residual has shape {r.shape}, expected x's shape "
                         f"{x.shape}")
    check_last_dim(x, w, "add_rms_norm")
    h, y = cp.empty_like(x), cp.empty_like(x)
    n = x.shape[-1]
    args = (x, r, w, h, y, i32(n), fp32(eps), fp32(offset))
    launch_rows("norm", "add_rms_norm_f32", x.size // max(n, 1), args)
    return h, y


def norm_add_rms_norm(x, residual, weight, next_weight, eps: float, offset: float = 0.0):
    """Twin of :func:`dflash_ref.ops.norm.norm_add_rms_norm`: x, residual [..., n], weight,
    next_weight [n] -> (m, h, normed), each [..., n] f32, from one launch (one block per row)."""
    op = "norm_add_rms_norm"
    x, r = f32(x, op, "x"), f32(residual, op, "residual")
    w, w2 = f32(weight, op, "weight"), f32(next_weight, op, "next_weight")
    if r.shape != x.shape:
        raise ValueError(f"{op}: residual has shape {r.shape}, expected x's shape {x.shape}")
    check_last_dim(x, w, op)
    check_last_dim(x, w2, op)
    m, h, y = cp.empty_like(x), cp.empty_like(x), cp.empty_like(x)
    n = x.shape[-1]
    args = (x, r, w, w2, m, h, y, i32(n), fp32(eps), fp32(offset))
    launch_rows("norm", "norm_add_rms_norm_f32", x.size // max(n, 1), args)
    return m, h, y


def l2_norm(x, eps: float, mode: str = "sqrt_eps") -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.norm.l2_norm`: x [..., n] -> [..., n] f32 contiguous; a 3-D
    x with contiguous channels is read in place (a GDN layer's q and k heads, column slices of
    its conv output)."""
    if mode not in L2_NORM_MODES:
        raise ValueError(f"l2_norm mode {mode!r} is unknown; expected one of {L2_NORM_MODES}")
    if getattr(x, "ndim", 0) == 3:  # [R, H, n] read in place: rows and heads may be strided
        x, (rs, hs, _) = f32_strided(x, "l2_norm", "x")
    else:
        x = f32(x, "l2_norm", "x")
        rs = hs = x.shape[-1] if x.ndim else 1
    H = x.shape[1] if x.ndim == 3 else 1
    y = cp.empty(x.shape, cp.float32)
    n = x.shape[-1] if x.ndim else 1
    mode_id = L2_NORM_MODES.index(mode)  # 0 = sqrt_eps, 1 = floor (matches norm.cu)
    launch_rows("norm", "l2_norm_f32", x.size // max(n, 1),
                (x, y, i32(n), fp32(eps), i32(mode_id), i32(H), i64(rs), i64(hs)))
    return y


def gated_rms_norm(x, z, weight, eps: float) -> cp.ndarray:
    """Twin of :func:`dflash_ref.ops.norm.gated_rms_norm`: x, z [..., n], weight [n]."""
    x, z = f32(x, "gated_rms_norm", "x"), f32(z, "gated_rms_norm", "z")
    w = f32(weight, "gated_rms_norm", "weight")
    if z.shape != x.shape:
        raise ValueError(f"gated_rms_norm: z has shape {z.shape}, expected x's shape {x.shape}")
    check_last_dim(x, w, "gated_rms_norm")
    y = cp.empty_like(x)
    n = x.shape[-1]
    launch_rows("norm", "gated_rms_norm_f32", x.size // max(n, 1), (x, z, w, y, i32(n), fp32(eps)))
    return y
