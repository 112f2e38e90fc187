"""MaskSpec, its builders, materialize and layer_windows: drawn examples, properties, twin.

Expected masks below are drawn by hand from the rules in docs/attention.md (1 = visible), never
produced by the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.errors import ConfigError
from dflash_ref.ops.masks import (
    MaskSpec,
    causal_mask,
    committed_prefix_mask,
    drafter_mask,
    full_mask,
    layer_windows,
    materialize,
    tree_depths,
    tree_mask,
    visible,
)
from tests.gpu import check_twin


def drawn(rows: str) -> np.ndarray:
    """'1000 1100' -> bool [[1,0,0,0],[1,1,0,0]]; '|' separators are ignored."""
    return np.array([[c == "1" for c in r if c in "01"] for r in rows.split()], dtype=bool)


def assert_mask(spec: MaskSpec, rows: str) -> None:
    expected = drawn(rows)
    got = visible(spec)
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_array_equal(got.astype(int), expected.astype(int))
    add = materialize(spec)
    assert add.dtype == np.float32
    np.testing.assert_array_equal(add, np.where(expected, 0.0, -np.inf).astype(np.float32))


# ---------------------------------------------------------------- unit: drawn masks


def test_causal_drawn():
    assert_mask(causal_mask(np.arange(4)), "1000 1100 1110 1111")


def test_sliding_window_hf_convention_includes_current_token():
    # W = 2: q - k < 2, so each query sees itself and one key before it.
    assert_mask(causal_mask(np.arange(4), np.arange(4), window=2), "1000 1100 0110 0011")
    # W = 1: only the current token.
    assert_mask(causal_mask(np.arange(3), window=1), "100 010 001")


def test_decode_query_over_cache_with_invalid_slots():
    # One decode query at position 4; the cache holds positions 0..4 in slots out of order,
    # with two free slots (-1).
    spec = causal_mask([4], [3, -1, 0, 4, 1, -1, 2])
    assert_mask(spec, "1011101")
    assert_mask(causal_mask([4], [3, -1, 0, 4, 1, -1, 2], window=3), "1001001")  # k in {2,3,4}


def test_committed_prefix_drawn():
    # base_pos 3: keys 0, 1, 2 committed; batch at 3, 4; one invalid slot.
    spec = committed_prefix_mask([3, 4], [0, 1, 2, -1, 3, 4], base_pos=3)
    assert_mask(spec, "111010 111011")
    # A query below base_pos still sees the whole committed prefix (plain causal would not).
    assert_mask(committed_prefix_mask([1], [0, 1, 2], base_pos=3), "111")
    assert_mask(causal_mask([1], [0, 1, 2]), "110")
    # With a window of 2 the old committed keys drop out.
    assert_mask(committed_prefix_mask([3, 4], [0, 1, 2, -1, 3, 4], 3, window=2),
                "001010 000011")


def test_drafter_mask_drawn():
    # Context positions 0, 1, 2 FIRST, then the noise block 3, 4, 5: all visible (docs/drafter.md).
    assert_mask(drafter_mask([0, 1, 2], [3, 4, 5]), "111|111 111|111 111|111")
    # vLLM / lucebox SWA convention: causal noise block, window 3 (q - k < 3).
    assert_mask(drafter_mask([0, 1, 2], [3, 4, 5], window=3, causal=True),
                "011|100 001|110 000|111")
    # HF ref with flash-attn: non-causal, left window 3.
    assert_mask(drafter_mask([0, 1, 2], [3, 4, 5], window=3), "011|111 001|111 000|111")
    # HF DFlash assistant: bidirectional |q - k| <= 1.
    assert_mask(drafter_mask([0, 1, 2], [3, 4, 5], window=1, window_mode="bidirectional"),
                "001|110 000|111 000|011")


def test_tree_mask_drawn():
    # Tree: 0 is the root (position 2); 1 and 2 are children of 0; 3 is a child of 1.
    spec = tree_mask([-1, 0, 0, 1], base_pos=2)
    np.testing.assert_array_equal(spec.q_pos, [2, 3, 3, 4])
    np.testing.assert_array_equal(spec.k_pos, [0, 1, 2, 3, 3, 4])
    assert_mask(spec, "11|1000 11|1100 11|1010 11|1101")
    np.testing.assert_array_equal(tree_depths([-1, 0, 0, 1, -1]), [0, 1, 1, 2, 0])


def test_tree_mask_ignores_stale_slots_and_follows_node_slots():
    # Nodes live in slots 4 and 1 of a pool; slot 3 holds a stale position-3 entry.
    k_pos = [0, 3, 1, 3, 2]
    spec = tree_mask([-1, 0], base_pos=2, k_pos=k_pos, node_slots=[4, 1])
    assert_mask(spec, "10101 11101")
    with pytest.raises(ValueError, match="node positions"):
        tree_mask([-1, 0], base_pos=2, k_pos=k_pos, node_slots=[4, 0])
    with pytest.raises(ValueError, match="topologically"):
        tree_mask([1, -1], base_pos=0)


def test_full_mask_and_mask_validation():
    assert_mask(full_mask([0, 1], [-1, 0, 1, 7]), "0111 0111")
    with pytest.raises(ValueError, match="integer"):
        MaskSpec([0.5], [0])
    with pytest.raises(ValueError, match="1-D"):
        MaskSpec([[0]], [0])
    with pytest.raises(ValueError, match="window"):
        MaskSpec([0], [0], window=-2)
    with pytest.raises(ValueError, match="window_mode"):
        MaskSpec([0], [0], window=2, window_mode="right")
    with pytest.raises(ValueError, match="k_pos values"):
        MaskSpec([0], [-2])
    with pytest.raises(ValueError, match="q_pos values"):
        MaskSpec([-1], [0])
    with pytest.raises(ValueError, match="ancestors has shape"):
        MaskSpec([0], [0, 1], ancestors=np.ones((1, 1), bool))
    with pytest.raises(ValueError, match="causal=False"):
        MaskSpec([0], [0], causal=True, ancestors=np.ones((1, 1), bool))
    assert MaskSpec([0], [0], window=0).window is None  # 0 means no window


def test_layer_windows():
    # gemma-4-31B drafter GGUF: sliding_window_pattern [T, T, T, T, F], window 2048 (seed 001).
    assert layer_windows(5, 2048, sliding_window_pattern=[True] * 4 + [False]) == [2048] * 4 + [
        None
    ]
    # Gemma 3 HF int pattern 6: every 6th layer is full.
    assert layer_windows(7, 1024, sliding_window_pattern=6) == [1024] * 5 + [None, 1024]
    types = ["sliding_attention", "full_attention", "linear_attention"]
    assert layer_windows(3, 512, layer_types=types) == [512, None, None]
    assert layer_windows(2, None) == [None, None]  # Qwen3 drafters: all full
    with pytest.raises(ConfigError, match="sliding_window"):
        layer_windows(2, None, layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(ConfigError, match="entries"):
        layer_windows(3, 8, layer_types=types[:2])
    with pytest.raises(ConfigError, match="unknown"):
        layer_windows(1, 8, layer_types=["chunky"])


# ---------------------------------------------------------------- property tests


@st.composite
def mask_specs(draw, max_q: int = 6, max_k: int = 40):
    """Any MaskSpec kind over random positions, invalid slots and (for trees) ancestors."""
    kind = draw(st.sampled_from(["causal", "full", "prefix", "tree", "drafter"]))
    window = draw(st.one_of(st.none(), st.integers(1, 12)))
    mode = draw(st.sampled_from(["left", "bidirectional"]))
    if kind == "tree":
        n = draw(st.integers(1, max_q))
        parents = [-1] + [draw(st.integers(-1, i - 1)) for i in range(1, n)]
        base = draw(st.integers(0, 20))
        return tree_mask(parents, base, window=window)
    tq = draw(st.integers(1, max_q))
    tk = draw(st.integers(0, max_k))
    q_pos = np.array(draw(st.lists(st.integers(0, 30), min_size=tq, max_size=tq)))
    k_pos = np.array(draw(st.lists(st.integers(-1, 30), min_size=tk, max_size=tk)), np.int64)
    if kind == "causal":
        return causal_mask(q_pos, k_pos, window=window)
    if kind == "prefix":
        return committed_prefix_mask(q_pos, k_pos, draw(st.integers(0, 30)), window=window)
    if kind == "drafter":
        return drafter_mask(k_pos, q_pos, window=window, causal=draw(st.booleans()),
                            window_mode=mode)
    return full_mask(q_pos, k_pos, window=window, window_mode=mode)


def key_visible(spec: MaskSpec, i: int, j: int) -> bool:
    """The predicate for one (query row, key slot), written as the kernel evaluates it.

    A scalar twin of :func:`~dflash_ref.ops.masks.visible`, a line-by-line transcription of
    ``att_key_visible`` in kernels_cupy/cuda/attention_mask.cuh: the test below checks that the
    vectorised form, the tiled form and this one agree everywhere.
    """
    q, k = int(spec.q_pos[i]), int(spec.k_pos[j])
    if k < 0:
        return False
    if spec.base_pos is not None and k < spec.base_pos:
        ok = True
    elif spec.ancestors is not None:
        ok = bool(spec.ancestors[i, j])
    elif spec.causal:
        ok = k <= q
    else:
        ok = True
    if ok and spec.window is not None:
        ok = (q - k < spec.window) if spec.window_mode == "left" else abs(q - k) <= spec.window
    return ok


@given(mask_specs())
def test_vectorised_and_scalar_predicates_agree(spec):
    # materialize (vectorised), the per-tile evaluation and key_visible (the kernel's scalar
    # form) must agree on every (row, slot).
    tq, tk = spec.shape
    full = visible(spec)
    scalar = np.array([[key_visible(spec, i, j) for j in range(tk)] for i in range(tq)],
                      dtype=bool).reshape(tq, tk)
    np.testing.assert_array_equal(full, scalar)
    for start in range(0, tk, 7):  # tiles of 7 slots, evaluated inline
        np.testing.assert_array_equal(visible(spec, cols=slice(start, start + 7)),
                                      full[:, start:start + 7])
    np.testing.assert_array_equal(np.isfinite(materialize(spec)), full)


@given(st.lists(st.integers(0, 60), min_size=1, max_size=6),
       st.lists(st.integers(-1, 60), max_size=40), st.data())
def test_swa_equals_causal_when_every_distance_is_below_the_window(q, k, data):
    q, k = np.array(q), np.array(k, np.int64)
    valid = k[k >= 0]
    span = int(max(q.max() - valid.min(), 0)) if valid.size else 0
    w = data.draw(st.integers(span + 1, span + 10))
    np.testing.assert_array_equal(visible(causal_mask(q, k, window=w)), visible(causal_mask(q, k)))


@given(mask_specs(), st.randoms(use_true_random=False))
def test_permuting_key_slots_permutes_mask_columns(spec, rnd):
    perm = list(range(spec.shape[1]))
    rnd.shuffle(perm)
    perm = np.array(perm, dtype=np.int64)
    anc = None if spec.ancestors is None else spec.ancestors[:, perm]
    moved = MaskSpec(spec.q_pos, spec.k_pos[perm], spec.causal, spec.window, spec.window_mode,
                     spec.base_pos, anc)
    np.testing.assert_array_equal(visible(moved), visible(spec)[:, perm])


@given(st.integers(0, 30), st.integers(1, 8), st.one_of(st.none(), st.integers(1, 10)))
def test_chain_tree_equals_committed_prefix(base, n, window):
    chain = tree_mask([-1] + list(range(n - 1)), base, window=window)
    q = base + np.arange(n)
    np.testing.assert_array_equal(chain.q_pos, q)
    prefix = committed_prefix_mask(q, chain.k_pos, base, window=window)
    np.testing.assert_array_equal(visible(chain), visible(prefix))
    # ... and for these queries (all >= base) the committed-prefix rule is plain causal.
    np.testing.assert_array_equal(visible(prefix), visible(causal_mask(q, chain.k_pos, window)))


@given(st.lists(st.integers(-1, 100), max_size=30), st.integers(0, 100), st.integers(1, 16))
def test_drafter_noise_sees_every_context_and_noise_key(ctx, s, b):
    ctx = np.array(ctx, np.int64)
    spec = drafter_mask(ctx, s + np.arange(b))
    expected = np.concatenate([ctx >= 0, np.ones(b, bool)])  # every valid slot
    np.testing.assert_array_equal(visible(spec), np.broadcast_to(expected, (b, ctx.size + b)))


# ---------------------------------------------------------------- NumPy vs CuPy (gpu)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", [
    causal_mask(np.arange(5), window=3),
    committed_prefix_mask([3, 4], [0, 1, 2, -1, 3, 4], 3),
    drafter_mask([0, 1, 2, -1], [4, 5, 6], window=2, window_mode="bidirectional"),
    tree_mask([-1, 0, 0, 1], base_pos=2),
], ids=["swa", "prefix", "drafter-bidir", "tree"])
def test_materialize_twin(spec):
    check_twin("materialize", (spec,), tol="exact")
