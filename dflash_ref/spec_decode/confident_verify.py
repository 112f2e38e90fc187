"""Chain verify of the drafts the drafter is sure of: the block cut at the first draft whose
probability falls below ``p_min`` (llama.cpp's DFlash ``--spec-draft-p-min``).

The drafter proposes d_1 .. d_{n-1} in one forward, whatever their number; the target pays for
every row it verifies. On a CPU, where a row of the target costs a good part of a plain token
(docs/training.md), rows the accepted prefix never reaches are waste, and the drafter's own
probabilities say which rows those are likely to be. With p_j the drafter's probability of d_j
renormalised over its row's ``top_k`` best (llama.cpp's draft sampler keeps 10)::

    k     = the number of leading drafts with p_j >= p_min      (0 <= k <= n-1)
    k     = 0 if k < n_min                                       (--spec-draft-n-min)
    block = [t_s, d_1 .. d_k]                                    k + 1 rows verified

and the chain rule verifies that block as any other, in one forward of its k + 1 rows: the cut
has already left out the rows the drafter doubts, and on NumPy a forward of a few rows costs
little more than one (the few-row products of ``dflash_ref/ops/linear.py``), less than a forward
per group of :class:`~dflash_ref.spec_decode.lazy_verify.LazyChainVerifier` (``head_groups``
and ``layers_later`` still choose). Lossless whatever p_min is:
every token is still the target's greedy choice; p_min moves only the work per step and the
tokens per step. p_min = 0 keeps every draft (LazyChainVerifier's block); p_min > 1 verifies
the anchor alone, a plain step with a wasted draft. What it saves on Gemma 3 270M is measured in
docs/spec_decode.md ("Verify that costs what it must").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash_ref.errors import ConfigError
from dflash_ref.spec_decode.drafting import DraftingContext
from dflash_ref.spec_decode.lazy_verify import LazyChainBlock, LazyChainVerifier

LLAMA_CPP_TOP_K = 10
"""The candidates llama.cpp's draft sampler keeps (common/speculative.cpp: top_k = 10), over
which its p is renormalised."""


def confident_prefix(p_draft, p_min: float, n_min: int = 0) -> int:
    """k: the number of leading entries of ``p_draft`` [m] that are >= ``p_min``, or 0 when that
    is fewer than ``n_min``."""
    below = np.flatnonzero(~(np.asarray(p_draft, np.float64) >= p_min))  # NaN counts as below
    k = int(below[0]) if below.size else int(np.size(p_draft))
    return k if k >= n_min else 0


@dataclass(frozen=True)
class ConfidentChainVerifier(LazyChainVerifier):
    """Greedy chain verify of ``[t_s, d_1 .. d_k]``, k from :func:`confident_prefix` (module
    docstring), its rows read as :class:`LazyChainVerifier` reads them: by default all at once
    (``head_groups=()``, ``layers_later=False``); ``head_groups=(1, 1)``, ``layers_later=True``:
    row 0, row 1, then the rest, each group a forward of its own."""

    head_groups: tuple[int, ...] = ()
    layers_later: bool = False
    p_min: float = 0.5
    n_min: int = 0
    top_k: int = LLAMA_CPP_TOP_K

    def __post_init__(self):
        super().__post_init__()
        if not (np.isfinite(self.p_min) and self.p_min >= 0) or self.n_min < 0 or self.top_k < 1:
            raise ConfigError(f"ConfidentChainVerifier needs p_min >= 0, n_min >= 0 and "
                              f"top_k >= 1; got p_min={self.p_min}, n_min={self.n_min}, "
                              f"top_k={self.top_k}")

    def draft(self, ctx: DraftingContext) -> LazyChainBlock:
        """2b. ``[anchor, d_1 .. d_k]``: the drafts up to the first the drafter doubts."""
        block_size = self.drafted_rows(ctx)
        proposal = ctx.propose(block_size, None, scored=self.top_k)
        drafts = proposal.tokens[: block_size - 1]  # [n-1]
        k = confident_prefix(proposal.p_draft[: block_size - 1], self.p_min, self.n_min)
        tokens = np.concatenate([[ctx.anchor], drafts[:k]]).astype(np.int64)  # [k+1]
        return LazyChainBlock(tokens, proposal, self.layers_later)
