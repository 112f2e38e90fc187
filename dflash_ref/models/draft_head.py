"""The drafter's head: the target's full head, borrowed (:class:`FullHead`), or a reduced draft
vocabulary of the drafter's own (:class:`ReducedHead`: Vd rows and the map ``d2t``; docs/drafter.md,
"A reduced draft vocabulary"). Shapes: n block rows, H hidden, V the target's vocabulary, Vd
the draft vocabulary; ``cap(x) = c tanh(x / c)`` with the drafter's softcap, else the target's.

    full:     l = cap(z E_out^T * m)                               [n, V]
    reduced:  r = cap(z W_d^T * m)                                 [n, Vd]  the draft rows
              l[:, d2t[i]] = r[:, i];  every other id: FILL        [n, V]   scattered
              greedy   d_j = d2t[argmax_i r_j]                     over the Vd rows, mapped
              sampled  d_j = d2t[i], i ~ q_j = sampling_probs(r_j)  q on candidates d2t

``d2t[i]`` is the absolute target id of draft row i (io/draft_vocab.py converts the directory's
offsets). The drafts are chosen over the Vd rows only: ``argmax`` and ``sample`` gather the d2t
columns of the scattered rows, so no [n, V] row is reduced, and a sampled draft's law q is
zero outside d2t, which the rejection rule reads from the proposal's ``candidates``
(spec_decode/verify.py, ``rejection_core``). The scattered row is what every reader of a
drafter's logits gets (observers, DDTree, the sampled tree, explain).

**FILL** is float32's lowest finite value, not llama.cpp's -inf (src/models/dflash.cpp fills
with -INFINITY): the non-finite checks of the draft rows stay on, softmax gives those ids
exactly 0 at any temperature (``exp`` of about -3.4e38 / T underflows), an argmax over the full
row picks a d2t id, and a sort puts them last. :meth:`ReducedHead.scatter` takes
``fill=-np.inf`` for a row to compare with llama.cpp's.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.io.draft_vocab import absolute_ids, check_d2t
from dflash_ref.ops.reductions import argmax_rows_checked
from dflash_ref.ops.sampling import DraftProposal, SamplingParams, sample_rows

FILL = float(np.finfo(np.float32).min)
"""The logit of a target id outside d2t in a scattered row (module docstring)."""


class FullHead:
    """The target's head, borrowed: the drafter's logits are over the target's V rows."""

    def __init__(self, config, target):
        self.config, self.target, self.be = config, target, target.be
        cap = config.final_logit_softcapping
        self.cap = cap if cap is not None else target.config.final_logit_softcapping

    def capped(self, logits):
        """``cap(logits * m)`` (m: ``output_multiplier``, if stated; docs/drafter.md, "Head")."""
        xp = self.be.xp
        if self.config.output_multiplier is not None:
            logits = logits * xp.float32(self.config.output_multiplier)
        if self.cap:
            logits = xp.float32(self.cap) * xp.tanh(logits / xp.float32(self.cap))
        return logits

    def logits(self, z):
        """Final-normed rows z [n, H] -> logits [n, V] through the target's head."""
        cfg = self.config
        if cfg.output_multiplier is None and cfg.final_logit_softcapping is None:
            return self.target.lm_head(z)
        return self.capped(self.be.ops.linear(z, self.target.lm_head_weight))

    def argmax(self, logits, first_row: int = 0) -> np.ndarray:
        """The greedy drafts of rows ``logits`` [R, V]: target ids, host int64 [R]; a
        non-finite row raises (rows named from ``first_row``)."""
        return argmax_rows_checked(self.be, logits, role="draft", first_row=first_row)

    def sample(self, logits, law: SamplingParams, rng) -> DraftProposal:
        """One draw per row of ``logits`` [R, V] with its law q [R, V]."""
        return sample_rows(self.be, logits, law, rng)

    def probs_of(self, logits, tokens, top_k: int) -> np.ndarray:
        """:func:`draft_probs` of rows ``logits`` [R, V] at target ids ``tokens`` [R] over
        each row's ``top_k`` best: host float64 [R] (syncs)."""
        return draft_probs(self.be, logits, np.asarray(tokens, np.int64), top_k)


class ReducedHead(FullHead):
    """The drafter's own head rows ``weight`` [Vd, H] and the map ``ids`` = d2t [Vd] (absolute
    target ids, checked: distinct, inside the target's vocabulary)."""

    def __init__(self, config, target, weight, ids):
        super().__init__(config, target)
        V = target.config.vocab_size
        check_d2t(ids, config.draft_vocab_size, V, "the drafter's d2t")
        xp = self.be.xp
        self.weight = xp.asarray(weight, dtype=xp.float32)  # [Vd, H]
        self.ids = np.asarray(ids, dtype=np.int64)  # [Vd] host: drafts -> target ids
        self.ids_dev = xp.asarray(self.ids)  # [Vd] the same on the backend: scatter, gather
        self.sorted_order = np.argsort(self.ids)  # [Vd] target id -> draft row, by search
        self.sorted_ids = self.ids[self.sorted_order]
        self.vocab_size = V

    def draft_rows(self, z):
        """Final-normed rows z [n, H] -> the draft rows ``cap(z W_d^T * m)`` [n, Vd]."""
        return self.capped(self.be.ops.linear(z, self.weight))

    def logits(self, z):
        """The draft rows scattered over the target's vocabulary: [n, V]."""
        return self.scatter(self.draft_rows(z))

    def scatter(self, rows, fill: float = FILL):
        """Draft rows [n, Vd] -> [n, V]: column d2t[i] holds row i's entry i, the rest ``fill``."""
        xp = self.be.xp
        out = xp.full((rows.shape[0], self.vocab_size), fill, dtype=xp.float32)  # [n, V]
        out[:, self.ids_dev] = rows
        return out

    def gather(self, logits):
        """Scattered rows [R, V] -> the draft rows [R, Vd] (the d2t columns)."""
        return logits[:, self.ids_dev]

    def to_target(self, draft_ids) -> np.ndarray:
        """Draft ids [R] -> target ids [R] (host int64)."""
        return self.ids[np.asarray(draft_ids, dtype=np.int64)]

    def argmax(self, logits, first_row: int = 0) -> np.ndarray:
        """The argmax over the Vd draft rows of ``logits`` [R, V], mapped through d2t."""
        return self.to_target(super().argmax(self.gather(logits), first_row))

    def sample(self, logits, law: SamplingParams, rng) -> DraftProposal:
        """One draw per row over the Vd draft rows, mapped through d2t; q [R, Vd] on the
        candidates d2t (the same ids for every row)."""
        drawn = super().sample(self.gather(logits), law, rng)
        return DraftProposal(self.to_target(drawn.tokens), drawn.q,
                             np.broadcast_to(self.ids, drawn.q.shape))

    def probs_of(self, logits, tokens, top_k: int) -> np.ndarray:
        """:meth:`FullHead.probs_of` over the Vd draft rows (the scattered FILL columns hold
        exactly 0 of the mass): a target id outside d2t has probability 0."""
        t = np.asarray(tokens, np.int64)  # [R] target ids
        col = np.searchsorted(self.sorted_ids, t).clip(0, self.ids.size - 1)  # [R]
        inside = self.sorted_ids[col] == t
        p = draft_probs(self.be, self.gather(logits), self.sorted_order[col], top_k)  # [R]
        return np.where(inside, p, 0.0)


def draft_probs(be, rows, cols: np.ndarray, top_k: int) -> np.ndarray:
    """The probability of column ``cols_r`` in row r of ``rows`` [R, C] renormalised over the
    row's ``top_k`` largest entries (llama.cpp's draft sampler keeps the 10 best; top_k >= C:
    the whole softmax), a column outside them 0: host float64 [R] (one copy to the host)::

        p_r = exp(l_c - logsumexp(top_k(l)))    if l_c is among them
    """
    xp = be.xp
    x = xp.asarray(rows, dtype=xp.float32)  # [R, C]
    R, C = x.shape
    best = x if top_k >= C else xp.partition(x, C - top_k, axis=-1)[:, C - top_k:]  # [R, k]
    picked = x[xp.arange(R), xp.asarray(cols)]  # [R]
    host = be.to_numpy(xp.concatenate([best.reshape(-1), picked])).astype(np.float64)
    best, picked = host[:-R].reshape(R, -1), host[-R:]  # [R, k], [R]
    m = best.max(axis=1)  # [R]
    p = np.exp(picked - m) / np.exp(best - m[:, None]).sum(axis=1)
    return np.where(picked >= best.min(axis=1), p, 0.0)


def draft_head(config, weights: dict, target) -> FullHead:
    """The head a drafter ``config`` runs: :class:`ReducedHead` from ``weights``'
    ``lm_head.weight`` and ``d2t`` (the directory's offsets) when it has a
    ``draft_vocab_size``, else the target's :class:`FullHead`."""
    if config.draft_vocab_size is None:
        return FullHead(config, target)
    return ReducedHead(config, target, weights["lm_head.weight"], absolute_ids(weights["d2t"]))
