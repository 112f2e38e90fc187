"""DFlash 2's grouped dynamic causal convolutions, around the attention and the MLP.

Public source: the authors' release, PyPI ``dflash`` 0.1.0, ``dflash/model.py``
(``GroupedDynamicCausalConv``); docs/drafter.md, "DFlash 2".

Every decoder layer of a DFlash 2 drafter has two, ``attention_conv`` and ``mlp_conv``, each with
a fixed base kernel ``base [2, K, H]`` and a kernel projection ``P [2*K*G, H]`` (K =
conv_kernel_size, G = H / conv_group_size groups of channels). Around the attention (and likewise
around the MLP), with ``u = RMSNorm_in(h)`` the block's normed rows [B, H]:

    D = (u P^T).reshape(B, 2, K, G)                          per-token kernels, from u
    u1 = conv(u, D[:, 0], base[0])                           before the attention
    o  = attention(u1 ...)  (the MLP: mlp(u1))
    o1 = conv(o, D[:, 1], base[1])                           after it, before the residual add
    h  = h + o1

    conv(x, D, base)[t, c] = sum_{j=0}^{K-1} (base[j, c] + D[t, j, c // group_size]) * x[t - j, c]

with ``x[t - j] = 0`` for ``t - j < 0``: causal along the block only (row 0, the anchor, sees
itself), never across the context. The per-token kernel of output row t scales every channel of a
group alike. The context rows are not convolved, so a draft cache holds exactly what it holds for
DFlash (cached == stateless). Written against ``xp``: the loop runs over the K kernel taps only.
"""

from __future__ import annotations


def grouped_dynamic_causal_conv(xp, x, dynamic, base, group_size: int):
    """``y[t, c] = sum_{j<K} (base[j, c] + dynamic[t, j, c // group_size]) * x[t - j, c]``.

    Causal along the rows (``x[t - j] = 0`` for ``t < j``). The release sums, per tap j, the base
    term then the dynamic term (``_grouped_dynamic_convolve``); this sums their kernel first,
    which differs only by rounding.

    Args:
        x: [T, H] rows along the block.
        dynamic: [T, K, G] per-output-row kernels, G = H / group_size.
        base: [K, H] the fixed kernel.
    Returns:
        [T, H], dtype of x.
    """
    T, H = x.shape
    K, G = base.shape[0], H // group_size
    xg = x.reshape(T, G, group_size)
    y = xp.zeros_like(xg)
    for j in range(min(K, T)):  # kernel taps; row t reads row t - j
        kernel = base[j].reshape(1, G, group_size) + dynamic[j:, j, :, None]  # [T-j, G, gs]
        y[j:] += kernel * xg[: T - j]
    return y.reshape(T, H)


def conv_prepare(xp, w: dict, name: str, u, group_size: int):
    """The first half of one DFlash 2 convolution pair (``name`` = "attention_conv" | "mlp_conv").

    ``D = (u P^T).reshape(T, 2, K, G)``; returns ``(conv(u, D[:, 0], base[0]), D[:, 1])``.
    """
    base = w[name + ".base_kernel"]  # [2, K, H]
    T, K = u.shape[0], base.shape[1]
    dyn = (u @ w[name + ".kernel_projection.weight"].T).reshape(T, 2, K, -1)  # [T, 2, K, G]
    return grouped_dynamic_causal_conv(xp, u, dyn[:, 0], base[0], group_size), dyn[:, 1]


def conv_finish(xp, w: dict, name: str, o, dyn1, group_size: int):
    """The second half: ``conv(o, D[:, 1], base[1])`` on the attention (or MLP) output."""
    return grouped_dynamic_causal_conv(xp, o, dyn1, w[name + ".base_kernel"][1], group_size)
