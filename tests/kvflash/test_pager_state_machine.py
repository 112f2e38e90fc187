"""The pager's invariants (docs/kvflash.md) over random op sequences (hypothesis stateful).

The machine drives one small pager (chunks of 1-4 tokens, two pooled layers of one head of width
2) through random appends, rewrites, span allocations, manual page-outs and page-ins, reselects
under random scores, and resets, and keeps a plain dict model ``position -> rows last written``.
After every step it checks, against that model and against rules restated here from the docs:

1. resident chunks -> blocks is injective; free + used = all blocks, disjoint;
   fill_slot_pos / slot_positions invert the mapping; cur_chunk never decreases (reset aside) and a
   failed slot_for leaves it where it was (the PR#487 rollback);
2. an eviction by slot_for or reselect never takes a sink (c < sink) or a tail chunk
   (c > cur - 1 - tail); slot_for evicts exactly the minimum (score or last_use, chunk) among
   those candidates, with the append head moved first; reselect keeps the best-scoring
   unprotected chunks;
3. every valid slot holds exactly the last rows written at its position (zeros if never
   written): paging round trips are bit-exact under any block order; freed blocks read zero;
4. with a pool at or above the floor slot_for never fails; below it (drawn on purpose, the
   constructor's check turned off) failures happen and roll back cleanly;
5. stats add up: moved bytes = (page-outs + page-ins) x chunk bytes, host bytes = chunks with a
   host copy x chunk bytes.
"""

from __future__ import annotations

import numpy as np
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dflash_ref.errors import PagerError
from dflash_ref.kvflash import KVFlashPager
from dflash_ref.kvflash.scorers import hook_from_scores

LAYERS = (0, 3)  # model layer ids of the two pooled layers
SCORES = st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0])  # few values: ties on purpose


class PagerMachine(RuleBasedStateMachine):
    @initialize(T=st.integers(1, 4), sink=st.integers(0, 2), tail=st.integers(0, 2),
                below_floor=st.booleans(), extra_blocks=st.integers(0, 2),
                seed=st.integers(0, 2**16))
    def setup(self, T, sink, tail, below_floor, extra_blocks, seed):
        floor_blocks = sink + tail + 2
        # Below the floor: 2 blocks short (appends fail once the pool is full) or 1 short (only
        # recalls fail), so allocations fail and must roll back.
        n_blocks = max(1, floor_blocks - 2 + extra_blocks // 2 if below_floor
                       else floor_blocks + extra_blocks)
        self.legal = n_blocks >= floor_blocks
        self.T, self.sink, self.tail, self.n_blocks = T, sink, tail, n_blocks
        self.pager = KVFlashPager(n_blocks * T, T, sink, tail, layers=LAYERS, n_kv_heads=1,
                                  head_dim=2, enforce_min_pool=self.legal)
        self.rng = np.random.default_rng(seed)
        self.model: dict[int, np.ndarray] = {}  # position -> [layer, K|V, 1, 2] last written
        self.next_pos = 0
        self.last_cur = 0

    # ------------------------------------------------------------ helpers

    def protected(self, c: int, cur: int) -> bool:
        return c < self.sink or c > cur - 1 - self.tail

    def resident(self) -> set[int]:
        return set(self.pager.resident_chunks().tolist())

    def expected_victim(self, cur: int):
        """The chunk an allocation must evict now (docs/kvflash.md, "Allocation and eviction"),
        None if a block is free, "fail" if no chunk may go: the minimum of (score or last_use,
        chunk) over the resident chunks with sink <= c <= cur - 1 - tail."""
        if self.pager.free_blocks:
            return None
        cands = sorted(c for c in self.resident() if not self.protected(c, cur))
        if not cands:
            return "fail"
        hook = self.pager.score_hook
        keys = (hook(np.array(cands)).tolist() if hook is not None
                else [self.pager.last_use(c) for c in cands])
        return min(zip(keys, cands))[1]

    def check_evictions(self, before: set[int], cur: int) -> None:
        """Chunks that left the pool during one allocation must have been candidates."""
        gone = before - self.resident()
        for c in gone:
            assert not self.protected(c, cur), (
                f"chunk {c} evicted but protected (sink {self.sink}, tail {self.tail}, cur {cur})")

    def allocate(self, pos: int) -> bool:
        """slot_for(pos) with the checks of "Allocation and eviction"; True if a slot was given."""
        pager, c = self.pager, pos // self.T
        before, prev_cur = self.resident(), pager.cur_chunk
        new_cur = max(prev_cur, c)
        victim = None if c in before else self.expected_victim(new_cur)
        slot = pager.slot_for(pos)
        assert (slot < 0) == (victim == "fail"), f"slot {slot}, expected victim {victim}"
        if slot < 0:
            event("slot_for failed (pool below the floor)")
            assert not self.legal, "slot_for failed with a pool at or above min_pool_tokens"
            assert pager.cur_chunk == prev_cur, "failed slot_for did not roll cur_chunk back"
            assert self.resident() == before and pager.block_of(c) == -1
            return False
        assert pager.cur_chunk == new_cur
        assert before - self.resident() == ({victim} if victim is not None else set()), (
            f"evicted {before - self.resident()}, expected {victim}")
        self.check_evictions(before, new_cur)
        assert slot == pager.block_of(c) * self.T + pos % self.T
        assert pager.last_use(c) == pager.clock
        return True

    def write(self, positions) -> None:
        rows = self.rng.standard_normal((len(positions), 2, 2, 1, 2)).astype(np.float32)
        for i, layer in enumerate(LAYERS):
            self.pager.write(layer, positions, rows[:, i, 0], rows[:, i, 1])
        for p, r in zip(positions, rows):
            self.model[p] = r

    # ------------------------------------------------------------ rules

    @rule(n=st.integers(1, 9))
    def append(self, n):
        """Decode-style appends: slot_for then write, one position at a time."""
        for _ in range(n):
            if not self.allocate(self.next_pos):
                break
            self.write([self.next_pos])
            self.next_pos += 1

    @precondition(lambda self: self.legal)
    @rule(n=st.integers(1, 4))
    def append_span(self, n):
        """A forward: alloc_span over at most one chunk's worth of tokens, then batched writes."""
        n = min(n, self.T)
        slots = self.pager.alloc_span(self.next_pos, n)
        positions = list(range(self.next_pos, self.next_pos + n))
        np.testing.assert_array_equal(self.pager.slots_of(positions), slots)
        self.write(positions)
        self.next_pos += n

    @precondition(lambda self: self.next_pos > 0)
    @rule(data=st.data())
    def rewrite(self, data):
        """Write an earlier position again (a replay over rejected drafts, or a recall)."""
        pos = data.draw(st.integers(0, self.next_pos - 1), label="pos")
        if self.allocate(pos):
            self.write([pos])

    @precondition(lambda self: self.pager.resident_chunks().size > 0)
    @rule(data=st.data())
    def page_out(self, data):
        c = data.draw(st.sampled_from(self.pager.resident_chunks().tolist()), label="chunk")
        b = self.pager.block_of(c)
        self.pager.page_out(c)
        assert self.pager.free_blocks[-1] == b, "a freed block is reused first (LIFO)"
        assert self.pager.is_on_host(c) and self.pager.block_of(c) == -1

    @precondition(lambda self: self.pager.host_only_chunks().size > 0)
    @rule(data=st.data())
    def page_in(self, data):
        c = data.draw(st.sampled_from(self.pager.host_only_chunks().tolist()), label="chunk")
        pager = self.pager
        before, cur = self.resident(), pager.cur_chunk
        victim = self.expected_victim(cur)
        try:
            pager.page_in(c)
        except PagerError:
            assert victim == "fail" and not self.legal, "page_in failed with a legal pool"
            assert pager.cur_chunk == cur and self.resident() == before
            return
        assert pager.cur_chunk == cur, "page_in moved the append head"
        assert pager.block_of(c) >= 0 and pager.is_on_host(c)
        assert before - self.resident() == ({victim} if victim is not None else set())
        self.check_evictions(before, cur)

    @rule(scores=st.lists(SCORES, max_size=12), keep_hook=st.booleans())
    def reselect(self, scores, keep_hook):
        pager = self.pager
        pager.score_hook = hook_from_scores(scores)
        before, cur = self.resident(), pager.cur_chunk
        mat = pager.materialised_chunks().tolist()
        try:
            events = pager.reselect()
        except PagerError:
            assert not self.legal
            pager.score_hook = None
            return
        after = self.resident()
        assert pager.cur_chunk == cur
        assert events == len(before - after) + len(after - before)
        assert after <= set(mat)
        if self.legal:
            self.check_evictions(before, cur)
            assert len(after) == min(self.n_blocks, len(mat))
            hook = pager.score_hook
            kept = [c for c in after if not self.protected(c, cur)]
            dropped = [c for c in mat if c not in after]
            assert all(not self.protected(c, cur) for c in dropped)
            if kept and dropped:
                assert hook(np.array(kept)).min() >= hook(np.array(dropped)).max()
        if not keep_hook:
            pager.score_hook = None

    @rule(data=st.data())
    def reset(self, data):
        pager = self.pager
        pager.reset()
        pager.zero_free_blocks()  # what the backend does per request for maskless consumers
        assert pager.cur_chunk == 0 and pager.free_blocks == list(range(self.n_blocks))[::-1]
        if data.draw(st.booleans(), label="shuffle"):
            pager.set_block_order(data.draw(st.permutations(range(self.n_blocks)), label="order"))
        self.model.clear()
        self.next_pos = 0
        self.last_cur = 0

    # ------------------------------------------------------------ invariants

    @invariant()
    def mapping_is_injective_and_blocks_are_conserved(self):
        table = self.pager.chunk_blocks()
        used = table[table >= 0].tolist()
        free = self.pager.free_blocks
        assert len(set(used)) == len(used), f"two chunks share a block: {table}"
        assert len(set(free)) == len(free), f"a block is free twice: {free}"
        assert not set(used) & set(free), "a block is both free and used"
        assert set(used) | set(free) == set(range(self.n_blocks))

    @invariant()
    def cur_chunk_never_decreases(self):
        cur = self.pager.cur_chunk
        assert cur >= self.last_cur, f"cur_chunk went from {self.last_cur} to {cur}"
        mat = self.pager.materialised_chunks()
        assert mat.size == 0 or mat.max() <= cur, "a chunk beyond the append head holds data"
        self.last_cur = cur

    @invariant()
    def slot_positions_invert_the_mapping(self):
        T = self.T
        expected = np.full(self.n_blocks * T, -1)
        for c, b in enumerate(self.pager.chunk_blocks()):
            if b >= 0:
                expected[b * T : (b + 1) * T] = c * T + np.arange(T)
        np.testing.assert_array_equal(self.pager.fill_slot_pos(), expected)
        np.testing.assert_array_equal(self.pager.slot_positions(), expected)
        for p in self.model:
            s = self.pager.slot_of(p)
            assert s == -1 or expected[s] == p

    @invariant()
    def pool_holds_exactly_what_was_written(self):
        data = self.pager.pool.data  # [layer, K|V, P, 1, 2]
        for s, p in enumerate(self.pager.fill_slot_pos().tolist()):
            got = data[:, :, s]
            if p in self.model:
                assert got.tobytes() == self.model[p].tobytes(), f"position {p} (slot {s})"
            else:
                assert not got.any(), f"slot {s} (position {p}) should read zeros"

    @invariant()
    def stats_add_up(self):
        st_, cb = self.pager.stats, self.pager.chunk_bytes
        assert st_.moved_bytes == (st_.page_outs + st_.page_ins) * cb
        n_host = sum(self.pager.is_on_host(c) for c in range(self.pager.n_chunks))
        assert st_.host_bytes == n_host * cb

    @invariant()
    def is_identity_matches_its_definition(self):
        table = self.pager.chunk_blocks()
        identity = all(b == c for c, b in enumerate(table) if b >= 0)
        identity = identity and self.pager.host_only_chunks().size == 0
        assert self.pager.is_identity() == identity


PagerMachine.TestCase.settings = settings(stateful_step_count=40)
TestPagerMachine = PagerMachine.TestCase
