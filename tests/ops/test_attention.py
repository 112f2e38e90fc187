"""attention: hand-checked values, float64 direct oracle, mask properties, NumPy vs CuPy.

Reading order: dflash_ref/ops/masks.py and dflash_ref/ops/attention.py (the spec) ->
kernels_cupy/attention.py and kernels_cupy/cuda/attention.cu (the twin) -> this file.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.ops.attention import attention, attention_online
from dflash_ref.ops.masks import (
    MaskSpec,
    causal_mask,
    committed_prefix_mask,
    drafter_mask,
    full_mask,
    tree_mask,
    visible,
)
from dflash_ref.testing import assert_close
from tests.gpu import check_twin
from tests.ops.attention_rule import SCALE as RULE_SCALE
from tests.ops.attention_rule import cases as rule_cases
from tests.ops.attention_rule import check_rule
from tests.ops.test_masks import mask_specs

# ---------------------------------------------------------------- the float64 direct oracle


def direct_attention(q, k, v, vis, scale=None, softcap=None) -> np.ndarray:
    """Loops over (row, head, visible key) with math.exp / math.fsum in float64.

    Written from the equations only: kv head of query head h is h // (nh // nkv); a row with no
    visible key is zero.
    """
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    Tq, nh, d = q.shape
    Tk, nkv, _ = k.shape
    g = nh // nkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = np.zeros((Tq, nh, d))
    for i in range(Tq):
        for h in range(nh):
            kh = h // g
            keys = [j for j in range(Tk) if vis[i, j]]
            if not keys:
                continue
            s = []
            for j in keys:
                x = scale * math.fsum(q[i, h, t] * k[j, kh, t] for t in range(d))
                s.append(softcap * math.tanh(x / softcap) if softcap else x)
            mx = max(s)
            e = [math.exp(x - mx) for x in s]
            z = math.fsum(e)
            for t in range(d):
                out[i, h, t] = math.fsum(e[n] * v[j, kh, t] for n, j in enumerate(keys)) / z
    return out


def qkv(rng, tq, nh, tk, nkv, d, dtype=np.float32, scale=1.0):
    q = (scale * rng.standard_normal((tq, nh, d))).astype(dtype)
    k = (scale * rng.standard_normal((tk, nkv, d))).astype(dtype)
    v = rng.standard_normal((tk, nkv, d)).astype(dtype)
    return q, k, v


# ---------------------------------------------------------------- unit: hand-checked values


def test_two_keys_by_hand():
    # q = [1, 0], k0 = [1, 0], k1 = [0, 0], scale 1: scores [1, 0],
    # p = [e / (e + 1), 1 / (e + 1)], out = p0 [1, 2] + p1 [3, 4].
    q = np.array([[[1.0, 0.0]]])
    k = np.array([[[1.0, 0.0]], [[0.0, 0.0]]])
    v = np.array([[[1.0, 2.0]], [[3.0, 4.0]]])
    p0 = math.e / (math.e + 1)
    expected = [[[p0 * 1 + (1 - p0) * 3, p0 * 2 + (1 - p0) * 4]]]
    assert_close(attention(q, k, v, scale=1.0), expected, "float64", op="attention")
    # Masking key 0 away leaves v1 exactly.
    only1 = full_mask([0], [-1, 5])
    assert_close(attention(q, k, v, only1, scale=1.0), [[[3.0, 4.0]]], "float64", op="attention")


def test_softcap_applies_to_scaled_scores_before_the_mask():
    # scale 0.5: raw q.k = [20, 0] -> s = [10, 0]; cap 5: [5 tanh(2), 0].
    q = np.array([[[2.0, 0.0]]])
    k = np.array([[[10.0, 0.0]], [[0.0, 0.0]]])
    v = np.array([[[1.0, 0.0]], [[0.0, 1.0]]])
    s0 = 5 * math.tanh(2.0)
    p0 = math.exp(s0) / (math.exp(s0) + 1)
    assert_close(attention(q, k, v, scale=0.5, softcap=5.0), [[[p0, 1 - p0]]], "float64",
                 op="attention", case="softcap")
    # The cap changes the weights: without it p0 = e^10 / (e^10 + 1).
    p0_raw = math.exp(10) / (math.exp(10) + 1)
    assert_close(attention(q, k, v, scale=0.5), [[[p0_raw, 1 - p0_raw]]], "float64",
                 op="attention", case="no softcap")


def test_default_scale_is_inverse_sqrt_head_dim(rng):
    q, k, v = qkv(rng, 3, 2, 5, 1, 16, np.float64)
    assert_close(attention(q, k, v), attention(q, k, v, scale=0.25), "float64", op="attention")


def test_gqa_grouped_mapping():
    # nh 4, nkv 2: query heads 0, 1 read kv head 0 (v = 1); heads 2, 3 read kv head 1 (v = 2).
    # (An interleaved i % nkv mapping would give 1, 2, 1, 2.)
    q = np.zeros((1, 4, 3))
    k = np.zeros((2, 2, 3))
    v = np.stack([np.ones((2, 3)), 2 * np.ones((2, 3))], axis=1)  # [Tk, nkv, d]
    out = attention(q, k, v)
    assert_close(out[0, :, 0], [1.0, 1.0, 2.0, 2.0], "float64", op="attention", case="GQA")


def test_rows_without_visible_keys_are_zero_without_warnings(rng):
    q, k, v = qkv(rng, 3, 2, 4, 2, 8)
    spec = MaskSpec([0, 5, 9], [-1, 7, 8, -1], causal=True)  # row q=0 sees nothing; q=5 too
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = attention(q, k, v, spec)
        online = attention_online(q, k, v, spec, key_tile=2, n_splits=2)
        empty = attention(q, k[:0], v[:0], MaskSpec([0, 1, 2], np.zeros(0, np.int64)))
    assert np.all(out[:2] == 0) and np.all(online[:2] == 0)
    assert np.all(np.isfinite(out)) and np.abs(out[2]).sum() > 0
    assert empty.shape == (3, 2, 8) and np.all(empty == 0)


@pytest.mark.parametrize("name", [c[0] for c in rule_cases(np.random.default_rng(0))])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_nonfinite_rule(name, dtype):
    # docs/conventions.md, "Non-finite attention", against its row-by-row float64 statement
    # (tests/ops/attention_rule.py). Catches: p @ v multiplying a V that only another row sees
    # (0 * NaN, case nonfinite_v_partly_visible); e^(-inf + inf) for a row of -inf scores
    # (neg_inf_scores); NaN dropped by a NaN-blind max (nan_scores_whole_tile).
    case = next(c for c in rule_cases(np.random.default_rng(1)) if c[0] == name)
    _, q, k, v, spec = case
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    with np.errstate(all="ignore"):
        check_rule(attention(q, k, v, spec, scale=RULE_SCALE), case, what="attention")
        for n_splits in (1, 3):  # the kernel's algorithm, and its split combine
            check_rule(attention_online(q, k, v, spec, scale=RULE_SCALE, n_splits=n_splits),
                       case, what=f"attention_online n_splits={n_splits}")


def test_dtypes_follow_the_compute_rule(rng):
    q, k, v = qkv(rng, 2, 2, 3, 1, 4)
    assert attention(q, k, v).dtype == np.float32
    assert attention(q.astype(np.float16), k, v).dtype == np.float32
    assert attention(q.astype(np.float64), k, v).dtype == np.float64


def test_bad_arguments_are_explained(rng):
    q, k, v = qkv(rng, 2, 3, 4, 2, 8)
    with pytest.raises(ValueError, match="grouped"):
        attention(q, k, v)
    q, k, v = qkv(rng, 2, 4, 4, 2, 8)
    with pytest.raises(ValueError, match=r"\[Tq, Tk\]"):
        attention(q, k, v, causal_mask(np.arange(3)))
    with pytest.raises(TypeError, match="MaskSpec"):
        attention(q, k, v, np.zeros((2, 4)))
    with pytest.raises(ValueError, match="softcap"):
        attention(q, k, v, softcap=0.0)
    with pytest.raises(ValueError, match="head dim"):
        attention(q, k[..., :4], v[..., :4])


# ---------------------------------------------------------------- property tests


@st.composite
def attention_cases(draw):
    spec = draw(mask_specs(max_q=5, max_k=24))
    tq, tk = spec.shape
    nkv = draw(st.sampled_from([1, 2]))
    g = draw(st.sampled_from([1, 2, 3]))
    d = draw(st.sampled_from([1, 3, 8, 17]))
    softcap = draw(st.sampled_from([None, 2.0, 30.0]))
    seed = draw(st.integers(0, 2**31))
    return spec, (tq, nkv * g, tk, nkv, d), softcap, seed


@given(attention_cases())
def test_reference_matches_float64_direct_oracle(case):
    spec, shape, softcap, seed = case
    rng = np.random.default_rng(seed)
    q, k, v = qkv(rng, *shape, dtype=np.float64, scale=1.5)
    vis = visible(spec)
    expected = direct_attention(q, k, v, vis, softcap=softcap)
    assert_close(attention(q, k, v, spec, softcap=softcap), expected, "float64",
                 op="attention", case="float64")
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    assert_close(attention(q32, k32, v32, spec, softcap=softcap), expected, "float32_attention",
                 op="attention", case="float32 vs float64 oracle")


@given(attention_cases(), st.sampled_from([1, 3, 8, 32]), st.integers(1, 4))
def test_inline_tiled_evaluation_matches_materialised(case, key_tile, n_splits):
    # attention_online evaluates the MaskSpec per key tile (never a Tq x Tk mask), skips empty
    # tiles, runs the online softmax and a split combine: the CuPy kernel's algorithm.
    spec, shape, softcap, seed = case
    q, k, v = qkv(np.random.default_rng(seed), *shape, dtype=np.float64, scale=1.5)
    assert_close(attention_online(q, k, v, spec, softcap=softcap, key_tile=key_tile,
                                  n_splits=n_splits),
                 attention(q, k, v, spec, softcap=softcap), "float64", op="attention_online",
                 case=f"tile {key_tile}, splits {n_splits}")


@given(attention_cases(), st.randoms(use_true_random=False))
def test_permuting_key_slots_with_their_positions_changes_nothing(case, rnd):
    # The pager relies on this: a key is identified by its position, not by its slot.
    spec, shape, softcap, seed = case
    q, k, v = qkv(np.random.default_rng(seed), *shape, dtype=np.float64)
    perm = list(range(spec.shape[1]))
    rnd.shuffle(perm)
    perm = np.array(perm, dtype=np.int64)
    anc = None if spec.ancestors is None else spec.ancestors[:, perm]
    moved = MaskSpec(spec.q_pos, spec.k_pos[perm], spec.causal, spec.window, spec.window_mode,
                     spec.base_pos, anc)
    assert_close(attention(q, k[perm], v[perm], moved, softcap=softcap),
                 attention(q, k, v, spec, softcap=softcap), "float64", op="attention",
                 case="slot permutation")


@given(st.integers(1, 40), st.integers(1, 6), st.integers(0, 5), st.integers(0, 2**31),
       st.randoms(use_true_random=False))
def test_committed_prefix_equals_causal_over_committed_plus_batch(base, n, n_stale, seed, rnd):
    # A paged pool: committed keys 0..base-1 and the batch base..base+n-1 in shuffled slots,
    # plus stale slots (k_pos -1) holding garbage. The committed-prefix rule over the pool must
    # equal plain causal attention over the contiguous cache [committed, batch].
    rng = np.random.default_rng(seed)
    tk = base + n
    q, k, v = qkv(rng, n, 4, tk, 2, 8, np.float64)
    q_pos = base + np.arange(n)
    expected = attention(q, k, v, causal_mask(q_pos, np.arange(tk)))
    garbage = 1e3 * rng.standard_normal((n_stale, 2, 8))
    garbage[::2, 0, 0] = np.nan  # unwritten pool memory: must not leak
    garbage[1::2, 1, 1] = np.inf
    pool_k = np.concatenate([k, garbage])
    pool_v = np.concatenate([v, garbage])
    pool_pos = np.concatenate([np.arange(tk), -np.ones(n_stale, np.int64)])
    perm = list(range(tk + n_stale))
    rnd.shuffle(perm)
    spec = committed_prefix_mask(q_pos, pool_pos[perm], base)
    assert_close(attention(q, pool_k[perm], pool_v[perm], spec), expected, "float64",
                 op="attention", case="committed prefix == causal")


@given(st.lists(st.integers(0, 90), min_size=1, max_size=8), st.integers(1, 16),
       st.integers(0, 2**31))
def test_swa_equals_causal_when_every_distance_is_below_the_window(q_list, extra, seed):
    q_pos = np.array(q_list)
    k_pos = np.arange(int(q_pos.max()) + 1)
    w = int(q_pos.max()) + extra  # every q - k <= max(q) < w
    q, k, v = qkv(np.random.default_rng(seed), len(q_list), 2, len(k_pos), 1, 8)
    assert_close(attention(q, k, v, causal_mask(q_pos, k_pos, window=w)),
                 attention(q, k, v, causal_mask(q_pos, k_pos)), "exact", op="attention",
                 case="SWA == causal")


def test_swa_differs_from_causal_once_context_passes_the_window(rng):
    # The silent bug (docs/conventions.md): an SWA layer run as full attention. Same inputs,
    # context 12 > window 4.
    q, k, v = qkv(rng, 1, 2, 12, 1, 8)
    swa = attention(q, k, v, causal_mask([11], np.arange(12), window=4))
    full = attention(q, k, v, causal_mask([11], np.arange(12)))
    assert np.abs(swa - full).max() > 1e-3
    # and SWA equals causal attention over the last 4 keys only
    assert_close(swa, attention(q, k[8:], v[8:]), "float32_attention", op="attention")


@given(st.integers(0, 30), st.integers(1, 16), st.integers(0, 2**31))
def test_drafter_mask_equals_no_mask(n_ctx, b, seed):
    # docs/drafter.md: every noise query sees every context key and every noise key.
    q, k, v = qkv(np.random.default_rng(seed), b, 4, n_ctx + b, 2, 8, np.float64)
    spec = drafter_mask(np.arange(n_ctx), n_ctx + np.arange(b))
    assert_close(attention(q, k, v, spec), attention(q, k, v), "exact", op="attention",
                 case="drafter == unmasked")


def test_tree_chain_attention_equals_verify_attention(rng):
    base, n = 7, 5
    chain = tree_mask([-1, 0, 1, 2, 3], base)
    q, k, v = qkv(rng, n, 4, base + n, 2, 8, np.float64)
    assert_close(attention(q, k, v, chain),
                 attention(q, k, v, causal_mask(base + np.arange(n), np.arange(base + n))),
                 "float64", op="attention", case="chain tree == causal verify")


# ---------------------------------------------------------------- NumPy vs CuPy (gpu)

# (name, Tq, nh, nkv, d, mask builder (Tq, Tk) -> MaskSpec | None, Tk, softcap)
GPU_CASES = [
    ("unmasked-d1", 3, 2, 1, 1, None, 5, None),
    ("prefill-causal-d64", 63, 8, 2, 64, "causal", 63, None),
    ("prefill-swa-d128", 300, 4, 4, 128, "swa", 300, None),
    ("decode-long-d128", 1, 32, 8, 128, "causal", 20000, None),
    ("decode-swa-long-d256", 1, 16, 8, 256, "swa", 30001, None),
    ("drafter-d128", 16, 32, 8, 128, "drafter", 1000, None),
    ("drafter-bidir-d200", 16, 4, 1, 200, "drafter-bidir", 777, 30.0),
    ("verify-prefix-d7", 16, 6, 3, 7, "prefix", 517, 50.0),
    ("tree-d96", 9, 8, 2, 96, "tree", None, None),
    ("pool-permuted-d256", 5, 8, 1, 256, "pool", 2000, None),
    ("empty-rows-d33", 4, 2, 2, 33, "empty", 100, None),
]


def build_gpu_mask(kind, tq, tk, rng):
    if kind is None:
        return None, tk
    if kind == "causal":
        return causal_mask(tk - tq + np.arange(tq), np.arange(tk)), tk
    if kind == "swa":
        return causal_mask(tk - tq + np.arange(tq), np.arange(tk), window=257), tk
    if kind == "drafter":
        return drafter_mask(np.arange(tk - tq), tk - tq + np.arange(tq)), tk
    if kind == "drafter-bidir":
        return drafter_mask(np.arange(tk - tq), tk - tq + np.arange(tq), window=100,
                            window_mode="bidirectional"), tk
    if kind == "prefix":
        pos = np.arange(tk)
        pos[rng.random(tk) < 0.2] = -1  # free slots
        return committed_prefix_mask(tk - tq + np.arange(tq), rng.permutation(pos), tk - tq), tk
    if kind == "tree":
        spec = tree_mask([-1, 0, 0, 1, 1, 2, 3, -1, 7], base_pos=50, window=40)
        return spec, spec.shape[1]
    if kind == "pool":
        pos = rng.permutation(np.where(rng.random(tk) < 0.3, -1, np.arange(tk)))
        return committed_prefix_mask(tk + np.arange(tq), pos, tk, window=1500), tk
    if kind == "empty":  # rows 0 and 2 see nothing; rows 1 and 3 see a few keys
        return MaskSpec([0, 60, 1, 99], np.arange(100) + 2, causal=True, window=3), tk
    raise ValueError(kind)


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_attention_twin(rng, case):
    name, tq, nh, nkv, d, kind, tk, softcap = case
    mask, tk = build_gpu_mask(kind, tq, tk, rng)
    q, k, v = qkv(rng, tq, nh, tk, nkv, d)
    if mask is not None:  # invalid slots hold NaN, as unwritten pool memory may
        k[mask.k_pos < 0] = np.nan
        v[mask.k_pos < 0] = np.nan
    check_twin("attention", (q, k, v), {"mask": mask, "softcap": softcap},
               "float32_attention", case=name)


@pytest.mark.gpu
def test_twin_writes_every_output_and_zeroes_empty_rows(rng, monkeypatch):
    # Fill every buffer the wrapper allocates with NaN: an unwritten element fails loudly.
    import cupy as cp

    import kernels_cupy.attention as twin

    real_empty = cp.empty

    def nan_empty(*args, **kwargs):
        a = real_empty(*args, **kwargs)
        a.fill(np.nan)
        return a

    monkeypatch.setattr(twin.cp, "empty", nan_empty)
    for kind, tq, tk in (("empty", 4, 100), ("causal", 1, 20000), ("prefix", 16, 3000)):
        mask, tk = build_gpu_mask(kind, tq, tk, rng)
        q, k, v = qkv(rng, tq, 8, tk, 2, 64)
        out = twin.attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), mask).get()
        assert np.all(np.isfinite(out)), kind
        empty_rows = ~visible(mask).any(axis=1)
        assert np.all(out[empty_rows] == 0.0), kind


@pytest.mark.gpu
def test_inline_kernel_matches_materialised_cupy(rng):
    # The kernel never materialises the mask; a dense CuPy computation with the materialised
    # additive mask (kernels_cupy.masks.materialize) must agree.
    import cupy as cp

    from kernels_cupy.attention import attention as kernel_attention
    from kernels_cupy.masks import materialize as cp_materialize

    tq, tk, nh, nkv, d = 16, 2500, 8, 2, 128
    mask, _ = build_gpu_mask("prefix", tq, tk, rng)
    q, k, v = (cp.asarray(a) for a in qkv(rng, tq, nh, tk, nkv, d))
    g = nh // nkv
    s = cp.einsum("ihd,jhd->hij", q, cp.repeat(k, g, axis=1)) * np.float32(d ** -0.5)
    s = s + cp_materialize(mask)[None]  # [nh, Tq, Tk]
    p = cp.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    dense = cp.einsum("hij,jhd->ihd", p, cp.repeat(v, g, axis=1))
    assert_close(kernel_attention(q, k, v, mask), dense, "float32_attention",
                 op="attention", case="inline vs materialised (CuPy)")
