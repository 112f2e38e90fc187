"""A target forward through the KVFlash pager's pool, in chunk-aligned pieces.

A span longer than a chunk may evict its own first chunks once the pool is full, so
``TargetModel.forward`` runs it one piece at a time, as the public pooled prefill does.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.models.output import TargetOutput


def forward_pieces(model, ids, state, tap, rows=None) -> TargetOutput:
    """Forward ``ids`` in chunk-aligned pieces through the pager; outputs concatenated.

    ``rows``: None, a slice or an index array (``forward``'s checked ``logits_rows``)."""
    xp, T = model.be.xp, state.pager.chunk_tokens
    if isinstance(rows, slice):  # each piece computes its own rows: as indices
        rows = np.arange(ids.size)[rows]
    cuts = [0]
    while cuts[-1] < ids.size:
        pos = state.length + cuts[-1]
        cuts.append(min(ids.size, cuts[-1] + T - pos % T))
    need = None if rows is None else np.unique(rows)  # sorted; each piece computes its own
    outs = [model._run(state.begin_batch(ids[a:b], tap=tap), state,
                       None if need is None else need[(need >= a) & (need < b)] - a)
            for a, b in zip(cuts, cuts[1:])]
    feats = (None if outs[0].features is None
             else xp.concatenate([o.features for o in outs], axis=0))
    logits = xp.concatenate([o.logits for o in outs], axis=0)
    if need is not None:  # back to the caller's order (and repeats)
        logits = logits[xp.asarray(np.searchsorted(need, rows))]
    return TargetOutput(logits=logits, features=feats)
