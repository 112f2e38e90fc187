"""Snapshot, restore and the three prompt-cache paths (docs/serving.md).

Properties (hypothesis): for random prompts, cache points and continuations, generating after a
restore emits exactly the tokens and acceptance lengths of a run that never went through the
cache, and the drafter reads bit-identical features. The reference for each path is the same
computation without the cache (the same prefill pieces), so equality is exact; against a run that
prefills the whole prompt in one piece the tokens are equal too (checked on fixed cases), but
features only to float32 reassociation (a longer batch sums its attention in another order).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_ref.errors import StateError
from dflash_ref.models.prompt_cache import (
    common_prefix,
    restore_checkpoint,
    restore_prefix,
    reuse_common_prefix,
)
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate
from tests.spec_decode.drafters import FAMILIES, ScriptedDrafter, tiny_pairs


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_pairs(tmp_path_factory.mktemp("cache"), 41, 42, block_size=8)


def _ids(n, seed):
    return np.random.default_rng(seed).integers(0, 256, size=n)


def _scripted(target, prompt, n):
    """A factory of scripted drafters (each run needs a fresh one: its error draws are random)."""
    truth = np.concatenate([prompt, generate(target, None, prompt, n + 10).tokens])
    return lambda: ScriptedDrafter(target, truth, 8, error_rate=0.3, seed=1)


def _run(target, drafter, prompt, n, state):
    drafter = drafter() if callable(drafter) else drafter
    res = generate(target, drafter, prompt, n, state=state)
    return res.tokens, res.acceptance_lengths, target.be.to_numpy(state.features.rows())


def _same(a, b):
    assert a[0] == b[0] and a[1] == b[1]
    np.testing.assert_array_equal(a[2], b[2])  # the drafter's features, bit for bit


@pytest.mark.parametrize("fam", list(FAMILIES))
@settings(max_examples=4)
@given(data=st.data())
def test_restore_prefix_equals_continuing_without_the_cache(models, fam, data):
    target, drafter = models[fam]
    N = data.draw(st.integers(2, 40))
    k = data.draw(st.integers(1, N - 1))
    m = data.draw(st.integers(1, 16))
    prompt = _ids(N, data.draw(st.integers(0, 99)))
    d = data.draw(st.sampled_from([drafter, _scripted(target, prompt, m)]))
    ref = target.new_state()
    target.forward(prompt[:k], ref)
    cached = target.new_state()
    target.forward(prompt[:k], cached)
    snap = cached.snapshot()
    target.forward(_ids(5, 7), cached)  # the live state moves on; the snapshot must not
    fresh = target.new_state()
    assert restore_prefix(fresh, snap, prompt) == k
    _same(_run(target, d, prompt, m, fresh), _run(target, d, prompt, m, ref))


@pytest.mark.parametrize("fam", ["qwen3", "gemma3"])
@settings(max_examples=4)
@given(data=st.data())
def test_reuse_common_prefix_equals_a_fresh_run(models, fam, data):
    target, _ = models[fam]
    A = _ids(data.draw(st.integers(2, 40)), data.draw(st.integers(0, 99)))
    n_common = data.draw(st.integers(1, len(A)))
    B = np.concatenate([A[:n_common], _ids(data.draw(st.integers(1, 20)), 5)])
    m = data.draw(st.integers(1, 12))
    d = _scripted(target, B, m)
    state = target.new_state()
    target.forward(A, state)
    generate(target, None, A, 5, state=None)  # another request in between changes nothing
    n = reuse_common_prefix(state, B)
    assert n == min(common_prefix(A, B), len(B) - 1)
    # Reference: the same prefix rows, computed as the cache computed them, without the cache.
    ref = target.new_state()
    target.forward(A, ref)
    ref.rollback(n)
    _same(_run(target, d, B, m, state), _run(target, d, B, m, ref))
    # And the tokens a run that never saw A emits.
    fresh = generate(target, d(), B, m)
    got = generate(target, d(), B, m, state=_reused(target, A, B))
    assert got.tokens == fresh.tokens and got.acceptance_lengths == fresh.acceptance_lengths


def _reused(target, A, B):
    state = target.new_state()
    target.forward(A, state)
    reuse_common_prefix(state, B)
    return state


@settings(max_examples=4)
@given(data=st.data())
def test_hybrid_checkpoints_restore_an_earlier_position(models, data):
    target, drafter = models["qwen3_5"]
    piece = data.draw(st.sampled_from([8, 16, 70]))  # 70 > the GDN trace limit of 64
    A = _ids(data.draw(st.integers(10, 150)), data.draw(st.integers(0, 99)))
    B = np.concatenate([A[: data.draw(st.integers(1, len(A)))], _ids(6, 3)])
    m = data.draw(st.integers(1, 12))
    cached, checkpoints = target.new_state(), []
    for a in range(0, len(A), piece):  # a server snapshots after every prefill piece
        target.forward(A[a:a + piece], cached)
        checkpoints.append(cached.snapshot())
    state = target.new_state()
    n = restore_checkpoint(state, checkpoints, B)
    assert n % piece == 0 and n <= common_prefix(A, B) and n < len(B)
    ref = target.new_state()
    for a in range(0, n, piece):
        target.forward(A[a:a + piece], ref)
    d = data.draw(st.sampled_from([drafter, _scripted(target, B, m)]))
    _same(_run(target, d, B, m, state), _run(target, d, B, m, ref))


def test_a_hybrid_state_cannot_be_truncated_before_its_last_batch(models):
    target, _ = models["qwen3_5"]
    state = target.new_state()
    target.forward(_ids(30, 1), state)
    target.forward(_ids(5, 2), state)
    with pytest.raises(StateError, match="checkpoint"):
        reuse_common_prefix(state, np.concatenate([_ids(30, 1)[:10], [1, 2]]))
    with pytest.raises(StateError, match="checkpoints while prefilling"):
        state.snapshot(upto=10)
    assert state.snapshot(upto=32).length == 32  # inside the last batch: rewound from its trace


def test_restore_without_features_is_refused_before_drafting(models):
    target, drafter = models["qwen3"]
    bare = TargetModel(target.config, _rebuild(target), target_layer_ids=None)
    src = bare.new_state()
    bare.forward(_ids(12, 4), src)
    snap = src.snapshot()  # no features: this model captured nothing
    state = target.new_state()  # captures for the drafter
    with pytest.raises(StateError, match="features"):
        restore_prefix(state, snap, _ids(20, 4))


def test_snapshot_outlives_its_state_and_checks_the_prompt(models):
    target, _ = models["gemma3"]
    state = target.new_state()
    target.forward(_ids(10, 6), state)
    snap = state.snapshot(upto=6)
    state.rollback(3)
    assert snap.length == 6 and snap.tokens.tolist() == _ids(10, 6)[:6].tolist()
    with pytest.raises(StateError, match="proper prefix"):
        restore_prefix(target.new_state(), snap, _ids(6, 6))  # covers the whole prompt
    with pytest.raises(StateError, match="proper prefix"):
        restore_prefix(target.new_state(), snap, _ids(12, 9))  # another prompt


def _rebuild(target):
    """The loaded weights by HF name, read back from the model's arrays (float32)."""
    p, be = target.config.weight_prefix, target.be
    w = {f"{p}embed_tokens.weight": be.to_numpy(target.embed_tokens),
         f"{p}norm.weight": be.to_numpy(target.final_norm)}
    if not target.config.tie_word_embeddings:
        w[target.config.lm_head_name] = be.to_numpy(target.lm_head_weight)
    for layer in target.layers:
        for k, v in layer.w.items():
            w[f"{p}layers.{layer.idx}.{k}"] = be.to_numpy(v)
    return w
