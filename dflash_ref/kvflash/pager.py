"""KVFlash pager: a fixed pool of KV slots for the full-attention layers, paged by 64-token chunks.

Reproduces lucebox's ``KvFlashPager`` (Luce-Org/lucebox ``server/src/common/kvflash_pager.h``,
with its rollback fix; the revision: docs/conventions.md, "Where things came from");
docs/kvflash.md draws the data model (position p -> chunk p // T -> block -> slot) and walks
through every rule. This module is the policy: the
free list, ``slot_for`` (the one allocating call), eviction, page_out / page_in to a host store,
reselect under a relevance scorer, and the calls the target and ``generate`` make
(``alloc_span``, ``maybe_reselect``; docs/kvflash.md, "Integration with the target and
generate"). The storage it runs on is in pool.py: :class:`~dflash_ref.kvflash.pool.PooledKV`
(the device pool ``[L, 2, P, H, D]``) and :class:`~dflash_ref.kvflash.pool.ChunkTable` (the
chunk table, and the pool's rows by position: ``attach``, ``write``, ``read``, ``kv``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from dflash_ref.backend import Backend, as_backend
from dflash_ref.errors import PagerError
from dflash_ref.kvflash.pool import ChunkTable, PooledKV

ScoreHook = Callable[[np.ndarray], np.ndarray]
"""``hook(chunks [n] int64) -> [n] float``: higher means keep (scorers.hook_from_scores)."""


def min_pool_tokens(chunk_tokens: int = 64, sink_chunks: int = 1,
                    tail_window_chunks: int = 4) -> int:
    """Smallest pool that can always evict: ``(sink + tail + 2) * T`` (448 by default).

    The +2 is one evictable victim plus the partially filled append head.
    """
    return (sink_chunks + tail_window_chunks + 2) * chunk_tokens


@dataclass
class PagerStats:
    """Counters of a pager. All are cumulative across :meth:`KVFlashPager.reset` except
    ``host_bytes``, the host memory currently held (reset frees it).

    ``page_outs`` / ``page_ins`` count chunk copies (device->host / host->device recalls),
    ``moved_bytes`` their bytes; ``evictions`` the page-outs made by slot_for to free a block;
    ``reselects`` / ``reselect_events`` the reselect calls with a hook and their page events;
    ``rescores`` the scorer calls made by :meth:`KVFlashPager.maybe_reselect` (a rescore that
    returns no scores is counted but triggers no reselect).
    """

    page_outs: int = 0
    page_ins: int = 0
    evictions: int = 0
    moved_bytes: int = 0
    host_bytes: int = 0
    reselects: int = 0
    reselect_events: int = 0
    rescores: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class KVFlashPager(ChunkTable):
    """Position -> chunk -> block -> slot mapping of a fixed KV pool, with paging.

    Args:
        pool_tokens: P, slots in the pool: a positive multiple of ``chunk_tokens`` and at least
            :func:`min_pool_tokens` (else :class:`PagerError`).
        chunk_tokens: T, tokens per chunk (64 upstream).
        sink_chunks: leading chunks never evicted (1: the first 64 tokens).
        tail_window_chunks: chunks before the append head never evicted (4; the protected tail is
            ``cur_chunk - tail .. cur_chunk``, tail + 1 chunks).
        backend: where the pool lives (a Backend or a name).
        layers, n_kv_heads, head_dim, dtype: the pooled layers (see :class:`PooledKV`). With no
            layers the pager keeps the mapping only (no device pool; chunk_bytes is 0).
        score_hook: ``hook(chunks) -> scores`` (higher = keep) for eviction and reselect; None
            means LRU eviction and no reselect. May be replaced at any time.
        scorer: a relevance scorer, ``scorer.chunk_scores(history_ids, chunk_tokens) -> [n]
            scores or None`` (e.g. :class:`~dflash_ref.kvflash.scorers.ModelTailScorer`); the
            decode loop calls :meth:`maybe_reselect` after each step, which rescores on the
            cadence ``max(tau, history // 45)`` and re-pages the pool. None: LRU only.
        tau: the cadence's minimum interval in generated tokens (DFLASH_KVFLASH_TAU, 64).
        enforce_min_pool: refuse pools below the minimum (True). False exists for tests that need
            to reach the allocation failure and its rollback, which a legal pool never hits.
    """

    def __init__(self, pool_tokens: int, chunk_tokens: int = 64, sink_chunks: int = 1,
                 tail_window_chunks: int = 4, *, backend: Backend | str = "numpy",
                 layers: int | Sequence[int] = (), n_kv_heads: int = 0, head_dim: int = 0,
                 dtype="float32", score_hook: ScoreHook | None = None,
                 scorer=None, tau: int = 64, enforce_min_pool: bool = True):
        if chunk_tokens <= 0 or sink_chunks < 0 or tail_window_chunks < 0:
            raise PagerError(
                f"KVFlashPager: chunk_tokens must be > 0 and sink_chunks, tail_window_chunks >= 0; "
                f"got {chunk_tokens}, {sink_chunks}, {tail_window_chunks}"
            )
        if pool_tokens <= 0 or pool_tokens % chunk_tokens:
            raise PagerError(
                f"KVFlashPager: pool_tokens={pool_tokens} must be a positive multiple of "
                f"chunk_tokens={chunk_tokens}; round it up to "
                f"{max(1, -(-pool_tokens // chunk_tokens)) * chunk_tokens}"
            )
        floor = min_pool_tokens(chunk_tokens, sink_chunks, tail_window_chunks)
        if enforce_min_pool and pool_tokens < floor:
            raise PagerError(
                f"KVFlashPager: pool_tokens={pool_tokens} is below the minimum {floor} = "
                f"(sink_chunks {sink_chunks} + tail_window_chunks {tail_window_chunks} + 2) x "
                f"chunk_tokens {chunk_tokens}: the sinks and the tail window would leave no "
                f"evictable block and slot_for would fail once the pool fills. Use "
                f"pool_tokens >= {floor} (the public sizing rounds the floor up to a multiple of "
                f"256: {-(-floor // 256) * 256})"
            )
        be = as_backend(backend)
        self.sink_chunks, self.tail_window_chunks = sink_chunks, tail_window_chunks
        self.n_blocks = pool_tokens // chunk_tokens
        self.score_hook = score_hook
        if tau < 1:
            raise PagerError(f"KVFlashPager: tau must be >= 1 generated tokens, got {tau}")
        self.scorer, self.tau = scorer, int(tau)
        self._scorer_hook = None  # the hook maybe_reselect installed last (reset drops it)
        has_pool = bool(layers) if not isinstance(layers, int) else layers > 0
        self.pool = (PooledKV(be, pool_tokens, n_kv_heads, head_dim, layers, dtype)
                   if has_pool else None)
        self.chunk_bytes = self.pool.chunk_bytes(chunk_tokens) if self.pool is not None else 0
        self.stats = PagerStats()
        self.clock = 0  # LRU clock: ticks on every slot_for call, only there
        super().__init__(chunk_tokens, pool_tokens, be)  # then _clear: free list, append head

    # ------------------------------------------------------------------ state

    def _clear(self) -> None:
        """Empty chunk table, default free list, append head 0 (construction and reset)."""
        super()._clear()
        # A stack pushed n_blocks-1 down to 0: pop() hands out 0, 1, 2, ...
        self._free: list[int] = list(range(self.n_blocks - 1, -1, -1))
        self.cur_chunk = 0  # the append head: the largest chunk slot_for allocated; only grows

    @property
    def min_pool_tokens(self) -> int:
        """``(sink + tail + 2) * T`` for this pager's configuration."""
        return min_pool_tokens(self.chunk_tokens, self.sink_chunks, self.tail_window_chunks)

    @property
    def free_blocks(self) -> list[int]:
        """The free list as a stack: the *last* element is handed out next."""
        return list(self._free)

    def set_block_order(self, order: Sequence[int]) -> None:
        """Hand blocks out in ``order`` (a permutation of 0..n_blocks-1) instead of 0, 1, 2, ...

        Only on an empty pool (after construction or reset); reset restores the default order.
        """
        order = [int(b) for b in order]
        if sorted(order) != list(range(self.n_blocks)):
            raise PagerError(f"set_block_order: expected a permutation of 0..{self.n_blocks - 1}, "
                             f"got {order}")
        if len(self._free) != self.n_blocks:
            raise PagerError("set_block_order: blocks are in use; call it on a fresh pager or "
                             "right after reset()")
        self._free = order[::-1]  # pop() returns order[0] first

    # ------------------------------------------------------------------ allocation

    def eviction_candidates(self) -> np.ndarray:
        """Resident chunks ``sink <= c <= cur_chunk - 1 - tail``, ascending (docs/kvflash.md,
        "Allocation and eviction")."""
        c = np.arange(self._n)
        hi = self.cur_chunk - 1 - self.tail_window_chunks
        ok = (self._block[: self._n] >= 0) & (c >= self.sink_chunks) & (c <= hi)
        return c[ok]

    def _scores(self, chunks: np.ndarray) -> np.ndarray:
        """The score hook on ``chunks``, checked: one finite-or-infinite float per chunk."""
        scores = np.asarray(self.score_hook(chunks), dtype=np.float64).reshape(-1)
        if scores.shape != chunks.shape:
            raise PagerError(f"score_hook returned {scores.shape[0]} scores for "
                             f"{chunks.shape[0]} chunks")
        if np.isnan(scores).any():
            raise PagerError(f"score_hook returned NaN for chunks {chunks[np.isnan(scores)]}")
        return scores

    def _pick_victim(self) -> int:
        """Minimum score (hook) or minimum last_use (LRU) among the candidates; -1 if none.

        ``argmin`` returns the first minimum, and candidates are ascending, so ties go to the
        lowest chunk index, as the public scan with a strict ``<`` does.
        """
        cand = self.eviction_candidates()
        if cand.size == 0:
            return -1
        key = self._scores(cand) if self.score_hook is not None else self._last_use[cand]
        return int(cand[np.argmin(key)])

    def _ensure_free_block(self) -> bool:
        """A free block exists, if need be by paging out one victim; False when none can go."""
        if self._free:
            return True
        victim = self._pick_victim()
        if victim < 0:
            return False
        self.page_out(victim)
        self.stats.evictions += 1
        return True

    def slot_for(self, pos: int) -> int:
        """Allocate (or look up) the slot of position ``pos``; -1 if no block can be freed.

        Steps (docs/kvflash.md, "Allocation and eviction"): ``c = pos // T``; the append head
        moves to c *before* eviction; if c is not resident, free a block (evicting one victim if
        needed; on failure roll the head back and return -1), pop it, and recall the host copy if
        there is one; then ``last_use[c] = ++clock``. Returns ``block * T + pos % T``.
        """
        pos = int(pos)
        if pos < 0:
            raise PagerError(f"slot_for({pos}): positions are >= 0")
        T = self.chunk_tokens
        c = pos // T
        prev = self.cur_chunk
        if c > self.cur_chunk:
            self.cur_chunk = c  # before eviction, so the victim search protects the new tail
        self._grow(c + 1)
        if self._block[c] < 0:
            if not self._ensure_free_block():
                self.cur_chunk = prev  # the chunk never materialised (lucebox's rollback fix)
                return -1
            b = self._free.pop()
            self._block[c] = b
            self.epoch += 1
            if self._on_host[c]:
                self._recall(c, b)
        self.clock += 1
        self._last_use[c] = self.clock
        return int(self._block[c]) * T + pos % T

    def alloc_span(self, start: int, n: int) -> np.ndarray:
        """``slot_for`` for positions start .. start+n-1 in order; returns the [n] int64 slots.

        Raises :class:`PagerError` at the first position that gets no slot (upstream returns
        false there). Chunks allocated earlier in the span are not undone; only ``cur_chunk`` is
        rolled back, inside slot_for.

        A span must fit the protected tail: once its chunks are allocated they must all still be
        resident, or the writes that follow would land in blocks already reused. Only
        ``tail_window_chunks + 1`` chunks are protected, so a longer span (a prompt larger than
        the pool) evicts its own first chunks; that raises :class:`PagerError` here (a check the
        public code does not make: its pooled prefill simply runs one chunk per forward).
        """
        slots = np.empty(n, dtype=np.int64)
        for i in range(n):
            s = self.slot_for(start + i)
            if s < 0:
                raise PagerError(
                    f"kvflash: no evictable pool block for position {start + i} (pool "
                    f"{self.pool_tokens} tokens = {self.n_blocks} blocks, sinks "
                    f"{self.sink_chunks}, tail window {self.tail_window_chunks}); positions "
                    f"{start}..{start + i - 1} of the span stay allocated"
                )
            slots[i] = s
        if n and np.any(self.slots_of(np.arange(start, start + n)) != slots):
            raise PagerError(
                f"alloc_span({start}, {n}): the span evicted its own first chunks (only the "
                f"sinks and the last {self.tail_window_chunks + 1} chunks are protected); split "
                f"the forward into pieces of at most one chunk ({self.chunk_tokens} tokens), as "
                f"the pooled prefill does"
            )
        return slots

    # ------------------------------------------------------------------ paging

    def page_out(self, chunk: int) -> None:
        """Copy a resident chunk to the host store and free its block (docs/kvflash.md, "Paging").

        The first page-out of a chunk allocates its host buffer (host_bytes grows); the freed
        block is zeroed and pushed on the free list (reused first).
        """
        b = self.block_of(chunk)
        if b < 0:
            raise PagerError(f"page_out({chunk}): chunk {chunk} is not resident")
        if self.pool is not None:
            if chunk not in self._host:
                self._host[chunk] = self.pool.host_empty(self.chunk_tokens)
            self.pool.save_block(b, self.chunk_tokens, self._host[chunk])  # then zeroes block b
        if not self._on_host[chunk]:
            self.stats.host_bytes += self.chunk_bytes
        self._on_host[chunk] = True
        self._free.append(b)
        self._block[chunk] = -1
        self.epoch += 1
        self.stats.page_outs += 1
        self.stats.moved_bytes += self.chunk_bytes

    def _recall(self, chunk: int, block: int) -> None:
        """Host -> device copy of ``chunk`` into ``block`` (inside slot_for)."""
        if self.pool is not None:
            self.pool.load_block(block, self.chunk_tokens, self._host[chunk])
        self.stats.page_ins += 1
        self.stats.moved_bytes += self.chunk_bytes

    def page_in(self, chunk: int) -> int:
        """Recall a host-only chunk through ``slot_for(chunk * T)``; returns its new block.

        The append head does not move (chunk < cur_chunk) but last_use is bumped, and the host
        copy is kept. With a full pool this evicts a victim like any allocation.
        """
        if not self.is_on_host(chunk) or self.block_of(chunk) >= 0:
            raise PagerError(f"page_in({chunk}): needs a chunk held only by the host store "
                             f"(on_host={self.is_on_host(chunk)}, block={self.block_of(chunk)})")
        if self.slot_for(chunk * self.chunk_tokens) < 0:
            raise PagerError(f"page_in({chunk}): no evictable pool block")
        return self.block_of(chunk)

    def reselect(self) -> int:
        """Re-page the pool to hold the best chunks under the score hook; returns page events.

        No-op (0) without a hook (docs/kvflash.md, "Reselect"). Candidates are the materialised
        chunks; protected ones (``c < sink`` or ``c > cur - 1 - tail``) rank first, the rest by
        descending score; the top n_blocks are wanted. Resident unwanted chunks are paged out in
        ascending order, then wanted host-only chunks are recalled in ascending order (the outs
        free the blocks the recalls need). Upstream's sort is unstable; the reference breaks
        ties by ascending chunk index.
        """
        if self.score_hook is None:
            return 0
        mat = self.materialised_chunks()
        if mat.size == 0:
            return 0
        protected = (mat < self.sink_chunks) | (mat > self.cur_chunk - 1 - self.tail_window_chunks)
        scores = self._scores(mat)
        order = np.lexsort((mat, -scores, ~protected))  # protected first, score desc, c asc
        wanted = np.zeros(mat.size, dtype=bool)
        wanted[order[: self.n_blocks]] = True
        events = 0
        for c, want in zip(mat.tolist(), wanted.tolist()):
            if not want and self.block_of(c) >= 0:
                self.page_out(c)
                events += 1
        for c, want in zip(mat.tolist(), wanted.tolist()):
            if want and self.block_of(c) < 0:
                self.page_in(c)
                events += 1
        self.stats.reselects += 1
        self.stats.reselect_events += events
        return events

    def maybe_reselect(self, history_ids, generated: int, n_new: int = 1) -> int:
        """The decode loop's relevance step: rescore and reselect when due.

        ``generate`` calls this after every step. Due when the step passed a generated count g
        with ``g % max(tau, history_at_g // 45) == 0`` (docs/kvflash.md, "The cadence";
        :func:`~dflash_ref.kvflash.scorers.reselect_due_in`). Then ``scorer.chunk_scores(
        history_ids, T)`` scores every chunk of the history, the hook becomes those scores
        (:func:`~dflash_ref.kvflash.scorers.hook_from_scores`: newer chunks score 1e30 and are
        kept) and :meth:`reselect` re-pages the pool. A rescore returning None leaves the current
        hook (LRU if none yet).

        Args:
            history_ids: [S] prompt + generated ids so far (the text the scorer reads).
            generated: tokens generated in this request so far.
            n_new: how many of them the last step emitted (1 plain, 1..B speculative).
        Returns:
            the page events of the reselect (0 when not due or without a scorer).
        """
        from dflash_ref.kvflash.scorers import hook_from_scores, reselect_due_in

        if self.scorer is None:
            return 0
        history = np.asarray(history_ids).reshape(-1)
        if not reselect_due_in(generated, n_new, self.tau, history.size):
            return 0
        self.stats.rescores += 1
        scores = self.scorer.chunk_scores(history, self.chunk_tokens)
        if scores is None:
            return 0
        self.score_hook = self._scorer_hook = hook_from_scores(scores)
        return self.reselect()

    def reset(self) -> None:
        """Per request: drop every mapping and host copy, default free list, cur_chunk = 0.

        host_bytes returns to 0; the other stats are kept; the epoch is bumped. The pool's
        contents are not cleared (call :meth:`zero_free_blocks` for maskless consumers). A hook
        installed by :meth:`maybe_reselect` is dropped (a hook given by the caller is kept).
        """
        self._clear()
        self.stats.host_bytes = 0
        self.epoch += 1
        if self.score_hook is not None and self.score_hook is self._scorer_hook:
            self.score_hook = None  # the last request's scores mean nothing for the next one

    def zero_free_blocks(self) -> None:
        """Zero every free block of the pool (maskless consumers read the whole pool)."""
        if self.pool is not None:
            for b in self._free:
                self.pool.zero_block(b, self.chunk_tokens)

    def __repr__(self) -> str:
        return (f"KVFlashPager(pool_tokens={self.pool_tokens}, chunk_tokens={self.chunk_tokens}, "
                f"sink={self.sink_chunks}, tail={self.tail_window_chunks}, resident="
                f"{self.resident_chunks().size}/{self.n_blocks}, host_only="
                f"{self.host_only_chunks().size}, cur_chunk={self.cur_chunk}, "
                f"backend={self.be.name})")
