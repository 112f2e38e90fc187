"""Tree verify (DDTree) over the KVFlash pool (docs/kvflash.md, "Tree verify on the pool").

Tree nodes at one depth share a position, so they wait beside the pool and only the accepted
path is written into the slots of its positions. Properties: with a pool that holds the context,
pooled tree verify == unpooled tree verify (logits within float32 reassociation, tokens and
acceptance lengths exactly); with a smaller pool the device pool stays bounded.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_ref.kvflash.pager import KVFlashPager
from dflash_ref.spec_decode.loop import generate
from dflash_ref.testing import assert_close
from tests.kvflash.pagers import CHUNK, POOLED, random_ids, tiny_targets
from tests.spec_decode.drafters import ScriptedDrafter


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    return tiny_targets(tmp_path_factory.mktemp("ptree"), seed=51)


@pytest.mark.parametrize("fam", ["qwen3", "qwen3_5", "gemma3"])
def test_pooled_tree_forward_and_commit_equal_the_plain_cache(targets, fam):
    # Teacher forced: prefill, a tree whose branches share positions, commit a path, decode on.
    target = targets[fam]
    ids, tree = random_ids(40), random_ids(7, 1)
    parents = [-1, 0, 0, 1, 1, 2, 3]  # depths 0,1,1,2,2,2,3: three nodes at position base+2
    path = [0, 1, 3, 6]
    outs = []
    for pager in (None, KVFlashPager(64, **CHUNK)):
        state = target.new_state(pager=pager)
        # the prefill in the pager's chunk-aligned pieces for both, so GDN layers reduce alike
        a = np.concatenate([target.forward(ids[i:min(i + 8, 30)], state).logits
                            for i in range(0, 30, 8)])
        t = target.forward_tree(tree, parents, state)
        state.commit_path(path)
        b = target.forward(ids[30:40], state)
        outs.append((np.concatenate([a, t.logits, b.logits]), t.features,
                     target.be.to_numpy(state.features.rows()), state.tokens))
    (la, fa, ra, ta), (lb, fb, rb, tb) = outs
    assert_close(lb, la, POOLED, op="pooled tree", tensor="logits", case=fam)
    assert_close(fb, fa, POOLED, op="pooled tree", tensor="node features", case=fam)
    assert_close(rb, ra, POOLED, op="pooled tree", tensor="committed features", case=fam)
    assert tb.tolist() == ta.tolist() == [*ids[:30], *tree[path], *ids[30:40]]


@pytest.mark.parametrize("fam", ["qwen3", "qwen3_5", "gemma3"])
@settings(max_examples=4)
@given(data=st.data())
def test_generate_tree_on_a_pool_equals_unpooled(targets, fam, data):
    target = targets[fam]
    prompt = random_ids(data.draw(st.integers(2, 24)), data.draw(st.integers(0, 99)))
    n = data.draw(st.integers(4, 30))
    truth = np.concatenate([prompt, generate(target, None, prompt, n + 20).tokens])
    err = data.draw(st.sampled_from([0.0, 0.3, 0.7]))

    def run(pager):
        d = ScriptedDrafter(target, truth, 6, error_rate=err, seed=3)
        return generate(target, d, prompt, n, verify="tree", pager=pager)

    plain, pooled = run(None), run(KVFlashPager(96, **CHUNK))  # 96 >= prompt + n + tree depth
    assert pooled.tokens == plain.tokens == truth[len(prompt):len(prompt) + n].tolist()
    assert pooled.acceptance_lengths == plain.acceptance_lengths


def test_pooled_tree_stays_bounded_when_the_pool_is_smaller(targets):
    target = targets["qwen3"]
    prompt, n = random_ids(20, 2), 50
    truth = np.concatenate([prompt, generate(target, None, prompt, n + 20).tokens])
    pager = KVFlashPager(32, **CHUNK)
    res = generate(target, ScriptedDrafter(target, truth, 6, error_rate=0.3, seed=4), prompt, n,
                   verify="tree", pager=pager)
    assert len(res.tokens) == n
    assert pager.n_chunks >= (20 + n) // 8  # the context outgrew the pool ...
    assert pager.resident_chunks().size <= 32 // 8  # ... which held at most 4 chunks
    assert pager.stats.evictions > 0
    assert pager.pool.data.shape[2] == 32  # the device pool never grows
    # Until a commit reaches position 32 nothing is evicted: those tokens equal plain greedy.
    s, n_exact = 20, 1
    for a in res.acceptance_lengths:
        if s + a > 32:
            break
        s, n_exact = s + a, n_exact + a
    assert n_exact >= 2 and res.tokens[:n_exact] == truth[20:20 + n_exact].tolist()
