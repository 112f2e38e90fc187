"""Several sequences in one target forward: ragged positions, per-sequence stores and masks.

A server decodes many requests at once. Each sequence keeps its own
:class:`~dflash_ref.models.state.TargetState` (KV, GDN states, features, rollback); one forward
runs all their new tokens together. The decoder layer does not change: it sees one
:class:`RaggedBatch` whose KV and GDN stores fan out to the sequences' own stores::

    rows:  [seq 0 tokens | seq 1 tokens | ...]            projections, MLP, lm_head: one matmul
    keys:  [seq 0 keys   | seq 1 keys   | ...]            one attention call
    mask:  block diagonal: a query sees keys of its own sequence only, by that sequence's rule

GDN layers run each sequence's recurrence from its own state (a loop over sequences in the
reference). Features never leak between sequences: each sequence's rows go to its own buffer
(``end_batch``), and its drafter reads only those.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.models.batch_arrays import BatchArrays
from dflash_ref.models.output import TargetOutput
from dflash_ref.models.state import Batch, TargetState
from dflash_ref.ops.masks import MaskSpec, visible


class RaggedKV:
    """The KV store of one layer for a ragged batch: each sequence's store, masks joined.

    The sequences' masks are shared by the layers of a window kind (each sequence's
    BatchArrays), so the joined mask is built once per kind and batch (``joined``, shared)."""

    def __init__(self, stores, splits, be, joined: dict):
        self.stores, self.splits, self.be, self.joined = stores, splits, be, joined

    def update(self, k, v):
        xp = self.be.xp
        keys, values, masks = [], [], []
        for store, (a, b) in zip(self.stores, self.splits):
            ki, vi, mi = store.update(k[a:b], v[a:b])
            keys.append(ki)
            values.append(vi)
            masks.append(mi)
        key = tuple(id(m) for m in masks)
        if key not in self.joined:  # the value keeps the masks alive, so ids stay unique
            self.joined[key] = (masks, _block_diagonal(masks, self.be))
        self.last = (xp.concatenate(keys, axis=0), xp.concatenate(values, axis=0),
                     self.joined[key][1])
        return self.last

    def read(self):
        """What the last ``update`` returned (a KV-sharing layer reads its source's)."""
        return self.last


def _block_diagonal(masks: list[MaskSpec], be) -> MaskSpec:
    """One mask over the joined keys: each sequence's visibility on its diagonal block."""
    shapes = [m.shape for m in masks]
    Tq, Tk = sum(s[0] for s in shapes), sum(s[1] for s in shapes)
    anc = np.zeros((Tq, Tk), dtype=bool)  # [sum Tq, sum Tk]
    r = c = 0
    for m, (tq, tk) in zip(masks, shapes):
        anc[r:r + tq, c:c + tk] = be.to_numpy(visible(m, xp=be.xp))  # the sequence's own rule
        r, c = r + tq, c + tk
    q_pos = np.concatenate([be.to_numpy(m.q_pos).astype(np.int64) for m in masks])
    k_pos = np.concatenate([be.to_numpy(m.k_pos).astype(np.int64) for m in masks])
    k_pos = np.maximum(k_pos, 0)  # validity is already in anc; positions only need to be legal
    return MaskSpec(q_pos=q_pos, k_pos=k_pos, ancestors=anc)



class RaggedGDN:
    """The GDN store of one layer for a ragged batch: each sequence from its own state."""

    def __init__(self, stores, splits, be):
        self.stores, self.splits, self.be = stores, splits, be

    def run(self, mixer, u):
        return self.be.xp.concatenate(
            [store.run(mixer, u[a:b]) for store, (a, b) in zip(self.stores, self.splits)], axis=0)


class RaggedBatch:
    """What the decoder layers see: joined ids and positions (``arrays``, one upload) and the
    fanned-out stores."""

    def __init__(self, batches: list[Batch], be):
        sizes = [b.positions.shape[0] for b in batches]
        ends = np.cumsum(sizes)
        self.splits = list(zip(ends - sizes, ends))
        self.batches = batches
        self.positions = np.concatenate([b.positions for b in batches])  # [sum T]
        ids = np.concatenate([b.ids for b in batches])  # [sum T]
        self.arrays = BatchArrays(be, ids, self.positions, start=0)  # ids and RoPE positions
        self.tap = batches[0].tap
        joined: dict = {}
        self.kv = {i: RaggedKV([b.kv[i] for b in batches], self.splits, be, joined)
                   for i in batches[0].kv}
        self.gdn = {i: RaggedGDN([b.gdn[i] for b in batches], self.splits, be)
                    for i in batches[0].gdn}


def forward_batch(model, ids_list, states: list[TargetState], tap=None) -> list:
    """Run ``ids_list[j]`` on ``states[j]`` for every j in one forward; one output per sequence.

    Each sequence's tokens sit at its own positions ``states[j].length ..``; the outputs equal
    those of ``model.forward(ids_list[j], states[j])`` run one by one (to float32
    reassociation of the joined matrix products), and each state is left exactly as that call
    leaves it (so ``rollback`` works per sequence).
    """
    if len(ids_list) != len(states) or not states:
        raise ValueError(f"forward_batch: {len(ids_list)} id lists for {len(states)} states")
    if len({id(s) for s in states}) != len(states):
        raise ValueError("forward_batch: a state appears twice; each sequence needs its own")
    ids_list = [model._check_ids(ids) for ids in ids_list]
    batches = [s.begin_batch(ids, tap=tap) for ids, s in zip(ids_list, states)]
    ragged = RaggedBatch(batches, model.be)
    normed, features = model.hidden_states(ragged.arrays.ids, ragged)  # [sum T, H], final-normed
    logits = model.lm_head(normed)  # [sum T, V]
    outs = []
    for (a, b), batch, state in zip(ragged.splits, batches, states):
        feats = None if features is None else features[a:b]  # this sequence's rows only
        state.end_batch(batch, feats)
        outs.append(TargetOutput(logits=logits[a:b], features=feats))
    return outs
