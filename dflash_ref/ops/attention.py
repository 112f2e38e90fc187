"""Scaled dot-product attention under a :class:`~dflash_ref.ops.masks.MaskSpec`, with GQA
(docs/attention.md). Query head h reads kv head ``h // g``, ``g = nh // nkv`` (HF ``repeat_kv``)::

    s_ij = scale * q[i, h] . k[j, h // g]            scale defaults to d^-0.5
    s_ij = cap * tanh(s_ij / cap)                    only with softcap=cap (before the mask)
    p_i  = softmax_j( s_ij + M_ij )                  M = materialize(mask): 0 / -inf; float32
    out[i, h] = sum_j p_ij v[j, h // g]

Non-finite values follow one rule (docs/conventions.md, "Non-finite attention"): a masked key
contributes nothing, whatever its K and V hold (its probability is exactly 0 and its V is never
multiplied); a visible NaN or +inf score makes the row NaN; a -inf score is a probability of 0;
a visible V holding NaN or inf makes that column of the row non-finite, even where p = 0; a row
with no visible key (or only -inf scores) outputs zeros. :func:`attention_online` is the CuPy
kernel's algorithm on a CPU.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.ops._dtypes import in_compute_dtype
from dflash_ref.ops.masks import MaskSpec, materialize, visible


def check_attention_args(q, k, v, mask, softcap, op: str = "attention") -> tuple[int, ...]:
    """Validate shapes; return (Tq, nh, d, Tk, nkv). Shared by the reference and the twin."""
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise ValueError(
            f"{op}: q, k, v must be [T, heads, d]; got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    Tq, nh, d = q.shape
    Tk, nkv, dk = k.shape
    if dk != d or tuple(v.shape) != tuple(k.shape):
        raise ValueError(
            f"{op}: k and v must be [Tk, nkv, d={d}] like q's head dim; got k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    if nkv == 0 or nh % nkv:
        raise ValueError(
            f"{op}: {nh} query heads cannot be grouped over {nkv} kv heads (GQA needs nh % nkv "
            f"== 0; query head i uses kv head i // (nh // nkv))"
        )
    if mask is not None:
        if not isinstance(mask, MaskSpec):
            raise TypeError(
                f"{op}: mask must be a MaskSpec (dflash_ref.ops.masks) or None, got "
                f"{type(mask).__name__}; build one with causal_mask / drafter_mask / ..."
            )
        if mask.shape != (Tq, Tk):
            raise ValueError(
                f"{op}: mask is for [Tq, Tk] = {mask.shape} but q has Tq={Tq} rows and k has "
                f"Tk={Tk} slots"
            )
    if softcap is not None and not softcap > 0:
        raise ValueError(f"{op}: softcap must be > 0 or None, got {softcap!r}")
    return Tq, nh, d, Tk, nkv


def _scores(q, k, scale, softcap, dt):
    """[nkv, g, Tq, Tk] scaled (and soft-capped) scores; q [Tq, nh, d], k [Tk', nkv, d]."""
    Tq, nh, d = q.shape
    nkv = k.shape[1]
    g = nh // nkv
    qg = q.reshape(Tq, nkv, g, d).transpose(1, 2, 0, 3)  # [Tq, nh, d] -> [nkv, g, Tq, d]
    kt = k.transpose(1, 2, 0)[:, None]  # [Tk, nkv, d] -> [nkv, 1, d, Tk]
    s = (qg @ kt) * dt.type(scale)  # [nkv, g, Tq, Tk]
    if softcap is not None:
        s = dt.type(softcap) * np.tanh(s / dt.type(softcap))
    return s


def _weighted_values(p, v, vis):
    """sum_j p_ij v_j over the keys row i sees, never touching another row's keys:
    p [nkv, g, Tq, Tk], v [Tk, nkv, d], vis [Tq, Tk] bool or None (all visible).
    -> [nkv, g, Tq, d].

    A plain ``p @ v`` would compute 0 * NaN = NaN for a key masked for row i (p_ij = 0) whose V
    holds NaN or inf because another row sees it. The product runs on V with its non-finite
    entries zeroed; each key holding one then adds p_ij * v_j to the rows that see it only.
    """
    vt = v.transpose(1, 0, 2)[:, None]  # [Tk, nkv, d] -> [nkv, 1, Tk, d]
    finite = np.isfinite(vt)
    if vis is None or finite.all():
        return p @ vt
    o = p @ np.where(finite, vt, vt.dtype.type(0.0))  # [nkv, g, Tq, d]
    for j in np.flatnonzero(~finite.all(axis=(0, 1, 3))):  # keys with a non-finite V entry
        bad = np.where(finite[:, :, j, None], vt.dtype.type(0.0), vt[:, :, j, None])  # [.., 1, d]
        o = o + np.where(vis[:, j, None], p[..., j, None] * bad, vt.dtype.type(0.0))
    return o


def attention(q, k, v, mask=None, scale=None, softcap=None) -> np.ndarray:
    """Masked GQA attention (the module's equations): q [Tq, nh, d], k and v [Tk, nkv, d] in any
    slot order, mask for [Tq, Tk] or None (all visible). [Tq, nh, d] in the compute dtype.
    """
    q, k, v = in_compute_dtype(q, k, v)
    dt = q.dtype
    Tq, nh, d, Tk, nkv = check_attention_args(q, k, v, mask, softcap)
    scale = d ** -0.5 if scale is None else scale
    if mask is not None:
        M = materialize(mask, dt)  # [Tq, Tk]: 0 visible, -inf not
        vis = M == 0
        used = vis.any(axis=0)  # [Tk] slots some query sees
        # A slot nobody sees may hold anything (a free pool slot): zero its k / v so that NaN or
        # inf there cannot leak through 0 * NaN in the products below.
        k = np.where(used[:, None, None], k, dt.type(0.0))
        v = np.where(used[:, None, None], v, dt.type(0.0))
    s = _scores(q, k, scale, softcap, dt)  # [nkv, g, Tq, Tk]
    if mask is not None:
        s = np.where(vis, s + M, dt.type(-np.inf))  # s + M, immune to inf - inf
    m = np.max(s, axis=-1, keepdims=True, initial=-np.inf)  # [nkv, g, Tq, 1]
    m = np.where(np.isfinite(m), m, dt.type(0.0))  # empty rows: any finite shift
    p = np.exp(s - m)  # 0 where masked
    denom = np.sum(p, axis=-1, keepdims=True)  # [nkv, g, Tq, 1]
    o = _weighted_values(p, v, None if mask is None else vis)  # [nkv, g, Tq, d]
    o = o / np.where(denom > 0, denom, dt.type(1.0))  # empty rows 0
    return o.transpose(2, 0, 1, 3).reshape(Tq, nh, d)  # -> [Tq, nkv, g, d] -> [Tq, nh, d]


def attention_online(q, k, v, mask=None, scale=None, softcap=None, key_tile: int = 32,
                     n_splits: int = 1) -> np.ndarray:
    """The CuPy kernel's algorithm in NumPy: tiled, inline mask, online softmax, split-K.

    Same result as :func:`attention` (to float32 rounding). Keys are cut into ``n_splits``
    contiguous ranges of whole tiles of ``key_tile`` slots. For each range, running state per
    (row, head): max m, normaliser l, unnormalised output acc. For each tile::

        vis    = visible(mask, all rows, tile)         # inline: [Tq, tile], never [Tq, Tk]
        skip the tile if no entry of vis is True
        s      = scores of the tile, -inf where not vis
        m_new  = max(m, max_j s);  c = exp(m - m_new)
        p      = exp(s - m_new)
        l      = c * l + sum_j p;  acc = c * acc + p @ v_tile;  m = m_new

    then the ranges combine: M = max over ranges with l != 0, L = sum l_r exp(m_r - M),
    out = sum acc_r exp(m_r - M) / L, and 0 where L == 0.
    """
    q, k, v = in_compute_dtype(q, k, v)
    dt = q.dtype
    Tq, nh, d, Tk, nkv = check_attention_args(q, k, v, mask, softcap, "attention_online")
    g = nh // nkv
    scale = d ** -0.5 if scale is None else scale
    n_tiles = -(-Tk // key_tile)
    tiles_per_split = max(1, -(-n_tiles // max(n_splits, 1)))
    parts = []  # (m, l, acc) per split
    for t_begin in range(0, n_tiles, tiles_per_split):
        m = np.full((nkv, g, Tq, 1), -np.inf, dt)
        l = np.zeros((nkv, g, Tq, 1), dt)
        acc = np.zeros((nkv, g, Tq, d), dt)
        for t in range(t_begin, min(t_begin + tiles_per_split, n_tiles)):
            cols = slice(t * key_tile, min((t + 1) * key_tile, Tk))
            vis = np.ones((Tq, cols.stop - cols.start), bool) if mask is None else np.asarray(
                visible(mask, cols=cols)
            )  # [Tq, tile]
            if not vis.any():
                continue  # the kernel's tile skip
            used = vis.any(axis=0)[:, None, None]  # [tile, 1, 1]
            k_t = np.where(used, k[cols], dt.type(0.0))  # garbage in unseen slots stays out
            v_t = np.where(used, v[cols], dt.type(0.0))
            s = _scores(q, k_t, scale, softcap, dt)  # [nkv, g, Tq, tile]
            s = np.where(vis, s, dt.type(-np.inf))
            m_new = np.maximum(m, np.max(s, axis=-1, keepdims=True))  # [nkv, g, Tq, 1]
            # Rows with nothing visible so far keep m = -inf; shift them by 0 (their l, acc
            # are 0, and exp(-inf - 0) = 0 keeps them so).
            shift = np.where(np.isfinite(m_new), m_new, dt.type(0.0))
            c = np.exp(m - shift)  # rescales the old state; 0 when m was -inf
            p = np.exp(s - shift)  # 0 where masked
            l = c * l + np.sum(p, axis=-1, keepdims=True)
            acc = c * acc + _weighted_values(p, v_t, vis)  # [nkv, g, Tq, d]
            m = m_new
        parts.append((m, l, acc))
    if not parts:  # Tk == 0
        return np.zeros((Tq, nh, d), dt)
    ms = np.stack([p[0] for p in parts])  # [S, nkv, g, Tq, 1]
    ls = np.stack([p[1] for p in parts])
    accs = np.stack([p[2] for p in parts])  # [S, nkv, g, Tq, d]
    full = ls != 0  # a split with mass (NaN counts: it must reach L)
    M = np.max(np.where(full, ms, -np.inf), axis=0)  # [nkv, g, Tq, 1]
    M = np.where(np.isfinite(M), M, dt.type(0.0))
    w = np.where(full, np.exp(np.where(full, ms, 0) - M), dt.type(0.0))  # [S, ..., 1]
    L = np.sum(w * ls, axis=0)
    o = np.sum(w * accs, axis=0) / np.where(L > 0, L, dt.type(1.0))  # [nkv, g, Tq, d]
    return o.transpose(2, 0, 1, 3).reshape(Tq, nh, d)
