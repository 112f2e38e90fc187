"""DFlash 2: a DFlash drafter that drafts a path through a candidate selector.

Public source: the authors' release, PyPI ``dflash`` 0.1.0, ``dflash/model.py``
(``DFlash2DraftModel``, ``CandidateSelector``); docs/drafter.md, "DFlash 2". A DFlash 2 drafter
is a DFlash drafter (same encoder, same block decoder, with two grouped dynamic causal
convolutions per layer: :mod:`dflash_ref.models.dflash2_conv`) that proposes differently:
:class:`DFlash2Drafter` overrides :meth:`~dflash_ref.models.drafter.DFlashDrafter.propose`.

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

Sampled (the release's rule at T > 0): row i's candidate is drawn from ``q_i = softmax(score_i /
T)`` over its k candidates, one uniform per row in order, and the proposal carries the q_i with
the candidates they are defined on (no top-p / top-k there). Everything is written against the
backend (``xp``): the selector loops over the block's positions, nothing over the vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dflash_ref.backend import Backend
from dflash_ref.config import DrafterConfig
from dflash_ref.errors import ConfigError
from dflash_ref.models.dflash2_conv import conv_finish, conv_prepare
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.ops.sampling import DraftProposal, SamplingParams, sample_from_probs, target_probs

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


class DFlash2Drafter(DFlashDrafter):
    """A DFlash 2 drafter (``DFlash2DraftModel``): drafts the selector's path (module docstring).

    ``DFlashDrafter.from_pretrained`` / ``from_gguf`` return one for a DFlash 2 config. Its
    checkpoint may store the codebooks without ``.weight`` (:func:`map_zlab_selector_keys`).
    """

    kind = "dflash2"

    def __init__(self, config: DrafterConfig, weights: dict, target: TargetModel):
        weights = map_zlab_selector_keys(weights)
        super().__init__(config, weights, target)
        xp = self.be.xp
        selector = {k: xp.asarray(v, dtype=xp.float32) for k, v in weights.items()
                    if k.startswith(SELECTOR_PREFIX)}
        self.selector = CandidateSelector(self.be, selector, self.config.dflash2["selector_top_k"])

    def fixed_cache(self, capacity: int, window=None, run_step=None):
        """Refused: the convolutions' kernel projections are products cuBLAS runs, which a
        recorded fixed-row draft step cannot hold yet."""
        raise ConfigError("a DFlash 2 drafter's convolutions cannot run in a fixed-row draft "
                          "step yet: make the target state without a recorded step runner "
                          "(new_state's default), or draft with drafter.new_cache()")

    def attention(self, i: int, u, *args):
        """The drafter's attention between the halves of its convolution pair (:meth:`around`)."""
        return self.around(i, "attention_conv", u, super().attention, *args)

    def mlp(self, i: int, u):
        """The drafter's MLP between the halves of its convolution pair (:meth:`around`)."""
        return self.around(i, "mlp_conv", u, super().mlp)

    def around(self, i: int, name: str, u, block, *args):
        """``conv(block(conv(u, D[:, 0], base[0])), D[:, 1], base[1])``: the block between the
        two halves of its convolution pair, ``D = (u P^T)`` (module docstring)."""
        w, xp, gs = self.layers[i], self.be.xp, self.config.dflash2["conv_group_size"]
        u, dyn = conv_prepare(xp, w, name, u, gs)
        return conv_finish(xp, w, name, block(i, u, *args), dyn, gs)

    def propose(self, hidden, logits, anchor_token: int, law: SamplingParams | None = None,
                rng=None) -> DraftProposal:
        """The selector's path over rows 1..n-1: the argmax path for ``law`` None (or greedy),
        else sampled, ``c_i ~ q_i = softmax(score_i / T)`` (one uniform per row, in order).

        Args:
            hidden, logits: :meth:`forward_block` with ``with_hidden=True`` ([n, H], [n, V]).
            anchor_token: the token before row 1 (the path's predecessor of row 1).
            law: the sampling parameters (only T is used), or None.
            rng: ``np.random.Generator`` for the draws.
        Returns:
            :class:`~dflash_ref.ops.sampling.DraftProposal`: tokens [n-1]; sampled, q [n-1, k]
            on candidates [n-1, k].
        """
        if law is None or law.greedy:
            return DraftProposal(self.selector.select(hidden[1:], logits[1:], anchor_token).tokens)
        q_rows = []

        def choose(i, scores):  # the selector's row i, given the path so far
            q_i = target_probs("numpy", scores, law.temperature)  # softmax(score / T)
            q_rows.append(q_i)
            return int(sample_from_probs(q_i, rng.random()))

        path = self.selector.select(hidden[1:], logits[1:], anchor_token, choose)
        return DraftProposal(path.tokens, np.stack(q_rows), path.candidates)
