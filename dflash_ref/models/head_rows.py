"""A target forward whose lm_head runs later, only on the rows a verifier asks for.

A chain verify of B rows needs row j's logits only if drafts 1..j were all accepted; on a CPU the
head of a large vocabulary costs as much as the layers (Gemma 3 270M: 262 144 x 640). So
``forward_head_later`` runs the layers as ``TargetModel.forward`` does and hands back, as the
output's ``logits``, a :class:`HeadRows` over the final-normed rows::

    out = target.forward_head_later(ids, state)   # state updated, features captured: [T, C*H]
    out.logits[0:1]                               # lm_head(normed[0:1]) [1, V], kept
    out.logits[1:8]                               # one product for rows 1..7 [7, V]
    np.asarray(out.logits)                        # every row not yet computed, in one product

With ``layers_later=True`` the layers wait too: a :class:`RowsOnDemand` runs nothing until a row
is asked for, then one forward from the last row run through that row's group (appended to the
state like any chain forward), so rows never asked for never reach the state. Each row's logits
equal ``forward``'s row (the layers and ``lm_head`` act row by row, causally); which rows are
computed, and grouped how, is the caller's (spec_decode/lazy_verify.py).
"""

from __future__ import annotations

import numpy as np

from dflash_ref.models.output import TargetOutput

# The ``rows`` a lazy step hands the state's runner (one whose ``lazy_rows`` is True).
HEAD_LATER = "head later"


class HeadRows:
    """Logits rows [T, V] computed on demand from final-normed rows ``normed`` [T, H] by
    ``head`` ([r, H] -> [r, V]): ``rows[lo:hi]`` (a slice with step 1) puts the rows not yet
    computed through the head in one product and keeps them; ``np.asarray(rows)`` is every row."""

    def __init__(self, be, head, normed, vocab: int):
        self.be, self.head, self.normed = be, head, normed
        self.shape = (int(normed.shape[0]), int(vocab))
        self.done: dict[int, object] = {}  # row -> its logits [V] (a view of a computed block)
        self.blocks: dict[tuple[int, int], object] = {}  # (lo, hi) -> a product's [hi-lo, V]

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: slice):
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError(f"HeadRows takes a slice of consecutive rows, got {key!r}")
        lo, hi, _ = key.indices(self.shape[0])
        if hi <= lo:
            raise IndexError(f"HeadRows: rows {key!r} of {self.shape[0]} is empty")
        for a, b in missing_runs(self.done, lo, hi):
            self.compute(a, b)
        if (lo, hi) in self.blocks:
            return self.blocks[lo, hi]  # [hi-lo, V], as computed
        return self.be.xp.stack([self.done[r] for r in range(lo, hi)])  # [hi-lo, V]

    def compute(self, lo: int, hi: int) -> None:
        """Rows lo..hi-1 (none computed yet) go through the head in one product."""
        block = self.blocks[lo, hi] = self.head(self.normed[lo:hi])  # [hi-lo, V]
        for r in range(lo, hi):
            self.done.setdefault(r, block[r - lo])

    def __array__(self, dtype=None, copy=None):
        rows = self[0: self.shape[0]]  # [T, V]
        return np.asarray(rows, dtype=dtype)

    @classmethod
    def ready(cls, be, logits) -> HeadRows:
        """Every row already computed (``logits`` [T, V]): a forward that could not wait."""
        rows = cls(be, None, logits, logits.shape[1])
        rows.done = {r: logits[r] for r in range(logits.shape[0])}
        rows.blocks = {(0, logits.shape[0]): logits}
        return rows


def missing_runs(done, lo: int, hi: int) -> list[tuple[int, int]]:
    """The runs ``(a, b)`` of consecutive rows in lo..hi-1 not in ``done``:
    ``missing_runs({2}, 0, 5) == [(0, 2), (3, 5)]``."""
    runs = []
    for r in range(lo, hi):
        if r in done:
            continue
        if runs and runs[-1][1] == r:
            runs[-1] = (runs[-1][0], r + 1)
        else:
            runs.append((r, r + 1))
    return runs


class RowsOnDemand(HeadRows):
    """:class:`HeadRows` whose layers run on demand too: asking for row r first runs the
    tokens ``ids`` [T] up to r through the target's layers over ``state`` (one forward from the
    last row run, appended to the state, features captured), then the head. Rows never asked
    for never reach the state."""

    def __init__(self, target, ids, state, tap=None):
        empty = target.be.xp.zeros((0, target.config.hidden_size), target.be.xp.float32)
        super().__init__(target.be, target.lm_head, empty, target.config.vocab_size)
        self.shape = (int(ids.shape[0]), int(target.config.vocab_size))
        self.target, self.ids, self.state, self.tap = target, ids, state, tap

    def compute(self, lo: int, hi: int) -> None:
        ran = self.normed.shape[0]
        if hi > ran:  # rows ran..hi-1 through the layers, in one forward
            more = run_layers(self.target, self.ids[ran:hi], self.state, self.tap)[0]
            self.normed = self.be.xp.concatenate([self.normed, more])  # [hi, H]
        super().compute(lo, hi)


def run_layers(target, ids, state, tap=None):
    """``ids`` [T] through the target's layers over ``state`` (appended, features captured),
    as ``TargetModel.forward`` runs them: ``(final-normed rows [T, H], features)``."""
    batch = state.begin_batch(ids, tap=tap)
    normed, features = state.runner.run(batch, HEAD_LATER,
                                        lambda: target.hidden_states(batch.arrays.ids, batch))
    state.end_batch(batch, features)
    return normed, features


def forward_head_later(target, ids, state, tap=None, layers_later: bool = False) -> TargetOutput:
    """``target.forward(ids, state, tap)``, its ``logits`` a :class:`HeadRows` (module
    docstring); with ``layers_later`` a :class:`RowsOnDemand` (nothing runs until a row is
    asked for; ``features`` None). A state whose runner replays recorded steps
    (``runner.lazy_rows`` False) and a span longer than a KVFlash chunk run as ``forward`` does
    (every row's logits, computed now)."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)  # [T]
    pager = state.pager
    if not state.runner.lazy_rows or (pager is not None and ids.size > pager.chunk_tokens):
        out = target.forward(ids, state, tap)
        return TargetOutput(HeadRows.ready(target.be, out.logits), out.features)
    if layers_later:
        return TargetOutput(RowsOnDemand(target, ids, state, tap), None)
    normed, features = run_layers(target, ids, state, tap)
    return TargetOutput(HeadRows(target.be, target.lm_head, normed, target.config.vocab_size),
                        features)
