"""The target and generate() on a KVFlash pool: exact when the pool covers the context,
bounded when it does not, refused below the floor."""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.errors import PagerError
from dflash_ref.kvflash.pager import KVFlashPager
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate
from dflash_ref.testing import Tolerance, assert_close
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target
from tests.spec_decode.drafters import ScriptedDrafter

# Small chunks so a tiny context spans many of them: chunk 8, sink 1, tail 1 -> floor 32.
CHUNK = dict(chunk_tokens=8, sink_chunks=1, tail_window_chunks=1)
# The pooled attention sums the same visible keys in slot order with exp(-inf) = 0 for the
# others: equal to the plain cache up to float32 reassociation.
POOLED = Tolerance(1e-5, 2e-5, "same visible keys; masked slots add exact zeros")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("pooled")
    out = {}
    for fam in ("qwen3", "qwen3_5", "gemma3"):
        t = write_tiny_target(root / fam, fam, seed=31, tie_word_embeddings=False)
        d = write_tiny_drafter(root / (fam + "_d"), t, seed=32)
        target = TargetModel.from_pretrained(t)
        out[fam] = (target, DFlashDrafter.from_pretrained(d, target))
    return out


def _ids(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, size=n)


@pytest.mark.parametrize("fam", ["qwen3", "qwen3_5", "gemma3"])
def test_pool_at_least_the_context_gives_the_unpooled_logits(models, fam):
    # Teacher forced: prefill 50 tokens (pieces through the pool), then decode and a verify
    # batch with a rollback, against the plain KV cache.
    target, _ = models[fam]
    ids = _ids(70)
    runs = []
    for pager in (None, KVFlashPager(96, **CHUNK)):
        state = target.new_state(pager=pager)
        a = target.forward(ids[:50], state).logits
        b = target.forward(ids[50:51], state).logits
        c = target.forward(ids[51:59], state).logits  # a verify batch ...
        state.rollback(54)  # ... of which 3 rows are kept
        d = target.forward(ids[54:70], state).logits
        runs.append(np.concatenate([a, b, c, d]))
    assert_close(runs[1], runs[0], POOLED, op="pooled target", case=fam)


def test_shuffled_block_order_gives_the_same_outputs(models):
    target, _ = models["qwen3"]
    ids = _ids(60, seed=1)
    ref = target.forward(ids, target.new_state()).logits
    pager = KVFlashPager(96, **CHUNK)
    state = target.new_state(pager=pager)
    pager.set_block_order(np.random.default_rng(3).permutation(pager.n_blocks))
    got = target.forward(ids, state).logits
    assert not pager.is_identity()
    assert_close(got, ref, POOLED, op="pooled target", case="shuffled blocks")


@pytest.mark.parametrize("fam", ["qwen3", "qwen3_5"])
def test_generate_with_a_pager(models, fam):
    target, drafter = models[fam]
    prompt = _ids(20, seed=2)
    plain = generate(target, None, prompt, 40).tokens
    truth = np.concatenate([prompt, generate(target, None, prompt, 60).tokens])
    scripted = ScriptedDrafter(target, truth, 8, error_rate=0.3, seed=4)
    # Pool >= context: 20 prompt + 40 new + up to 8 verify rows beyond the last commit = 68
    # positions <= 72 slots. (A pool of 64 is exceeded by the last verify block: its writes
    # evict a chunk and the logits change, as they should.) Exactly the unpooled tokens, with
    # and without speculation.
    for d in (None, drafter, scripted):
        res = generate(target, d, prompt, 40, pager=KVFlashPager(72, **CHUNK))
        assert res.tokens == plain
    # Pool smaller than the context: 32 slots = 4 chunks of 8 (positions 0..31) for a context
    # of 60+ positions (8+ chunks). Bounded residency, evictions, page events.
    pager = KVFlashPager(32, **CHUNK)
    res = generate(target, scripted, prompt, 40, pager=pager)
    assert pager.n_chunks >= (20 + 40) // 8  # the context really outgrew the pool ...
    assert pager.resident_chunks().size <= 32 // 8  # ... which held at most 4 chunks
    assert pager.stats.evictions > 0 and pager.stats.page_outs > 0
    # Until a batch writes position 32 (chunk 4), nothing is evicted and attention sees every
    # key: the token from the prefill and those committed by verify blocks s..s+7 with
    # s + 7 <= 31 equal plain greedy.
    s, n_exact = 20, 1
    for n in res.acceptance_lengths:
        if s + 7 > 31:
            break
        s, n_exact = s + n, n_exact + n
    assert n_exact >= 2 and res.tokens[:n_exact] == plain[:n_exact]
    assert pager.pool.data.shape[2] == 32  # the device pool never grows


def test_pool_below_the_floor_is_refused_with_the_minimum(models):
    with pytest.raises(PagerError, match="minimum 32"):
        KVFlashPager(24, **CHUNK)
    # (tree verify on a pool used to be refused here; it runs now: test_pooled_tree.py)
