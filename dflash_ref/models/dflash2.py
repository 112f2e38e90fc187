"""DFlash 2: the grouped dynamic causal convolutions and the candidate selector.

Public source: the authors' release, PyPI ``dflash`` 0.1.0, ``dflash/model.py``
(``DFlash2DraftModel``, ``GroupedDynamicCausalConv``, ``CandidateSelector``); docs/drafter.md,
"DFlash 2". A DFlash 2 drafter is a DFlash drafter (same encoder, same block decoder) plus:

**Convolutions.** Every decoder layer has two, ``attention_conv`` and ``mlp_conv``, each with a
fixed base kernel ``base [2, K, H]`` and a kernel projection ``P [2*K*G, H]`` (K =
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
DFlash (cached == stateless).

**Candidate selector.** Instead of an argmax per row, DFlash 2 drafts a *path*. With z [L, H] the
final-normed rows 1..B-1 and ``l = head(z)`` their logits:

    unary[i], cand[i] = top-k of l[i]  (k = selector_top_k)          [L, k] each
    g = z Wh^T                                                       [L, r]  (r = selector_rank)
    prev = anchor
    for i in 0..L-1:
        score[i, c] = unary[i, c] + sum_r Pred[prev, r] g[i, r] Succ[cand[i, c], r]
        pick c* = argmax_c score[i, c]   (sampled: c* ~ softmax(score[i] / T))
        path[i] = prev = cand[i, c*]

``Pred``, ``Succ`` [V, r] are the predecessor and successor codebooks. The published checkpoints
store them without the ``.weight`` suffix; the release's loader maps
``candidate_selector.{predecessor,successor}_codebook`` to ``...codebook.weight``
(:func:`map_zlab_selector_keys` does the same).

Everything is written against the backend (``xp``): the convolution loops over the K kernel taps,
the selector over the block's positions, nothing over tokens of the context or the vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dflash_ref.backend import Backend

SELECTOR_PREFIX = "candidate_selector."
CODEBOOKS = ("predecessor_codebook", "successor_codebook")


def map_zlab_selector_keys(weights: dict) -> dict:
    """The release loader's key mapping: ``candidate_selector.<codebook>`` -> ``<codebook>.weight``.

    Published DFlash 2 checkpoints store the two codebooks without the ``.weight`` suffix
    (``DFlash2DraftModel.from_pretrained`` passes a ``key_mapping`` for them); checkpoints saved
    by ``save_pretrained`` have it. Both load.
    """
    out = dict(weights)
    for name in CODEBOOKS:
        bare = SELECTOR_PREFIX + name
        if bare in out:
            if bare + ".weight" in out:
                raise ValueError(f"the checkpoint holds both {bare} and {bare}.weight")
            out[bare + ".weight"] = out.pop(bare)
    return out


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


@dataclass(frozen=True)
class SelectorPath:
    """One selector pass over L block rows (host arrays).

    Attributes:
        tokens: [L] int64, the drafted path.
        candidates: [L, k] int64, the top-k candidate ids per row (descending logit).
        scores: [L, k] float64, the rescored candidates (row i given the path's token i - 1).
        index: [L] int64, which candidate each row picked.
    """

    tokens: np.ndarray
    candidates: np.ndarray
    scores: np.ndarray
    index: np.ndarray


class CandidateSelector:
    """The DFlash 2 selector (module docstring): top-k candidates, rescored along the path."""

    def __init__(self, be: Backend, weights: dict, top_k: int):
        self.be, self.top_k = be, int(top_k)
        self.pred = weights[SELECTOR_PREFIX + "predecessor_codebook.weight"]  # [V, r]
        self.succ = weights[SELECTOR_PREFIX + "successor_codebook.weight"]  # [V, r]
        self.proj = weights[SELECTOR_PREFIX + "hidden_projection.weight"]  # [r, H]

    def candidates(self, logits):
        """Top-k per row: (unary [L, k], ids [L, k]) by descending logit, ties to the lower id.

        The release calls ``torch.topk(sorted=False)``; the order of the candidates changes no
        path and no distribution, only which of two exactly tied candidates an argmax keeps.
        """
        xp = self.be.xp
        order = (np.argsort(-logits, axis=-1, kind="stable") if xp is np
                 else xp.argsort(-logits, axis=-1))  # CuPy's sort is stable
        ids = order[:, : self.top_k]
        return xp.take_along_axis(logits, ids, axis=-1), ids

    def select(self, hidden, logits, anchor: int,
               choose: Callable[[int, np.ndarray], int] | None = None) -> SelectorPath:
        """Draft the path for rows ``hidden`` [L, H] (final-normed) with draft logits [L, V].

        ``choose(i, scores_i)`` picks the candidate index of row i from its host float64 scores
        [k] (sampling); None is the argmax (first maximum).
        """
        xp = self.be.xp
        unary, cand = self.candidates(logits)  # [L, k]
        g = hidden @ self.proj.T  # [L, r]
        cand_h = self.be.to_numpy(cand).astype(np.int64)
        L = cand_h.shape[0]
        tokens, index = np.zeros(L, np.int64), np.zeros(L, np.int64)
        scores = np.zeros(cand_h.shape, np.float64)
        prev = int(anchor)
        for i in range(L):  # sequential along the block: row i depends on the token of row i-1
            row = unary[i] + self.succ[cand[i]] @ (self.pred[prev] * g[i])  # [k]
            scores[i] = self.be.to_numpy(row)
            if choose is None:
                index[i] = int(self.be.to_numpy(xp.argmax(row)))
            else:
                index[i] = int(choose(i, scores[i]))
            prev = tokens[i] = int(cand_h[i, index[i]])
        return SelectorPath(tokens=tokens, candidates=cand_h, scores=scores, index=index)
