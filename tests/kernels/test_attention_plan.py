"""The CuPy attention kernel's launch plan, checked on CPU (no GPU needed).

kernels_cupy.attention.plan_launch decides rows per block, the key split and the shared memory;
a wrong plan would only show on a GPU, so its invariants are checked here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernels_cupy import _build
from kernels_cupy.attention import (
    KEY_TILE,
    MAX_HEAD_DIM,
    MAX_RPW,
    SHARED_LIMIT,
    WARPS,
    plan_launch,
)

CASES = [
    # (Tq, nh, nkv, d, Tk): decode, drafter, verify, prefill, awkward
    (1, 32, 8, 128, 32768), (16, 32, 8, 128, 4096), (16, 32, 8, 256, 40000),
    (4096, 32, 8, 128, 4096), (63, 7, 7, 1, 1), (5, 64, 2, 200, 777), (1, 1, 1, 256, 100000),
    (300, 12, 4, 96, 0),
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("sm_count", [1, 108, 132])
def test_plan_covers_every_row_and_key_within_limits(case, sm_count):
    Tq, nh, nkv, d, Tk = case
    p = plan_launch(Tq, nh, nkv, d, Tk, sm_count)
    gx, gy, gz = p["grid"]
    assert 1 <= p["rpw"] <= MAX_RPW and p["R"] == WARPS * p["rpw"]
    assert gx * p["R"] >= Tq * (nh // nkv) > (gx - 1) * p["R"]  # every row, no empty block
    assert gy == nkv and gz == p["n_splits"] >= 1
    kps = p["keys_per_split"]
    assert kps % KEY_TILE == 0  # the kernel's tiles never straddle two splits
    assert gz * kps >= Tk and (gz - 1) * kps < max(Tk, 1)  # every key, no empty split
    # sQ [R, d] + nbuf x (K, V) [KEY_TILE, ld]; ld = d + 4 (float4 rows) or d + 1 (scalar)
    assert p["ld"] == (d + 4 if d % 4 == 0 else d + 1) and p["vec4"] == (d % 4 == 0)
    assert p["nbuf"] in (1, 2)
    assert p["shared_mem"] == (p["R"] * d + p["nbuf"] * 2 * KEY_TILE * p["ld"]) * 4
    assert p["shared_mem"] <= SHARED_LIMIT
    assert gx < 2**31 and gz <= 65535


def test_plan_splits_long_decode_but_not_prefill():
    decode = plan_launch(1, 32, 8, 128, 32768, sm_count=132)
    assert decode["n_splits"] > 1  # 8 blocks alone would leave 124 SMs idle
    prefill = plan_launch(4096, 32, 8, 128, 4096, sm_count=132)
    assert prefill["n_splits"] == 1


def test_worst_case_shared_memory_fits_the_limit():
    # SHARED_LIMIT (96 KiB) is within the opt-in maximum of sm_80, sm_86, sm_89 and sm_90.
    assert SHARED_LIMIT <= 99 * 1024
    for d in range(1, MAX_HEAD_DIM + 1):
        p = plan_launch(64, 32, 8, d, 1000, 132)
        assert p["shared_mem"] <= SHARED_LIMIT, d


def test_constants_match_the_cuda_source():
    src = (_build.CUDA_DIR / "attention.cu").read_text()
    for name, value in (("ATT_WARPS", WARPS), ("ATT_KT", KEY_TILE), ("ATT_MAX_RPW", MAX_RPW)):
        assert f"#define {name} {value}" in src, name
    assert f"#define ATT_MAX_DC {math.ceil(MAX_HEAD_DIM / 32)}" in src


# ---------------------------------------------------------------- float4 and the barrier count


def test_double_buffering_where_it_fits_the_default_limit():
    # d <= 128 (Qwen3 / Llama heads): two K/V buffers, one barrier per key tile.
    for d in (64, 96, 128):
        assert plan_launch(1, 32, 8, d, 32768, 132)["nbuf"] == 2, d
        assert plan_launch(4096, 32, 8, d, 4096, 132)["nbuf"] == 2, d
    # d = 256 (Qwen3-Next / Gemma full attention): one buffer (two barriers) within 96 KiB.
    p = plan_launch(1, 16, 2, 256, 32768, 132)
    assert p["nbuf"] == 1 and p["shared_mem"] <= SHARED_LIMIT
    # On a device with only the default 48 KiB, d = 128 decode still fits with one buffer.
    p = plan_launch(1, 32, 8, 128, 32768, 132, shared_limit=48 * 1024)
    assert p["nbuf"] == 1 and p["shared_mem"] <= 48 * 1024


def test_too_little_shared_memory_is_an_error_not_a_bad_launch():
    with pytest.raises(ValueError, match="shared memory"):
        plan_launch(1, 16, 2, 256, 100, 132, shared_limit=32 * 1024)


def test_vec4_needs_a_multiple_of_four_and_aligned_arrays():
    from kernels_cupy.attention import can_use_vec4

    assert can_use_vec4(128, 0, 256, 4096)
    assert not can_use_vec4(128, 0, 4, 4096)  # a view one float into a buffer
    assert not can_use_vec4(66, 0, 256, 4096)
    assert plan_launch(1, 4, 2, 66, 100, 132)["vec4"] is False
    assert plan_launch(1, 4, 2, 128, 100, 132, vec4=False)["ld"] == 129
    with pytest.raises(ValueError, match="d % 4"):
        plan_launch(1, 4, 2, 66, 100, 132, vec4=True)


def _emulate_tile_load_vec4(d: int, ld: int, n_threads: int = WARPS * 32):
    """The vec4 branch of att_load_tile: thread t handles idx = t, t + n_threads, ... < KT*d/4;
    returns {shared float index: (tile row, source float index within the row)}."""
    d4 = d // 4
    written = {}
    for tid in range(n_threads):
        for idx in range(tid, KEY_TILE * d4, n_threads):
            jj, c4 = divmod(idx, d4)
            for e in range(4):
                assert jj * ld + 4 * c4 + e not in written
                written[jj * ld + 4 * c4 + e] = (jj, 4 * c4 + e)
    return written


@pytest.mark.parametrize("d", [4, 64, 96, 128, 200, 256])
def test_vec4_tile_load_covers_every_element_once_and_stays_aligned(d):
    ld = plan_launch(1, 8, 8, d, 100, 132)["ld"]
    written = _emulate_tile_load_vec4(d, ld)
    assert sorted(written.values()) == [(j, c) for j in range(KEY_TILE) for c in range(d)]
    assert all(written[j * ld + c] == (j, c) for j in range(KEY_TILE) for c in range(d))
    assert ld % 4 == 0 and d % 4 == 0  # every float4 row start is 16-byte aligned
    R = plan_launch(1, 8, 8, d, 100, 132)["R"]
    assert (R * d) % 4 == 0  # the K/V buffers start 16-byte aligned after sQ


@pytest.mark.parametrize("d", [64, 128, 256])
def test_vec4_shared_reads_of_a_quarter_warp_hit_distinct_banks(d):
    # A float4 shared load is served per quarter warp (8 lanes x 16 bytes); lane j reads row j at
    # word lane * ld + 4 c: the 8 lanes' 4-word groups must cover 32 distinct banks.
    ld = d + 4
    for quarter in range(4):
        banks = {(lane * ld + w) % 32 for lane in range(8 * quarter, 8 * quarter + 8)
                 for w in range(4)}
        assert len(banks) == 32, (d, quarter)


# ---------------------------------------------------------------- the pipelined tile loop


def _emulate_forward(q, k, v, spec, scale, sm_count, shared_limit=SHARED_LIMIT):
    """attention_fwd_*'s control flow in NumPy: per block and split, the mask of tile t + 1 is
    evaluated before tile t's barrier and decides whether tile t + 1 is loaded; K/V come from
    the buffer loaded for this tile; then attention_combine_f32. Returns (out, barriers per
    loaded tile). The predicate is tests/ops/test_masks.py's transcription of att_key_visible."""
    from tests.ops.test_masks import key_visible

    Tq, nh, d = q.shape
    Tk, nkv, _ = k.shape
    g = nh // nkv
    p = plan_launch(Tq, nh, nkv, d, Tk, sm_count, shared_limit=shared_limit)
    kps, nbuf = p["keys_per_split"], p["nbuf"]
    parts = np.zeros((p["n_splits"], Tq, nh, d)), np.full((p["n_splits"], Tq, nh), -np.inf)
    ls = np.zeros((p["n_splits"], Tq, nh))
    barriers = loaded = tiles = 0
    for kvh in range(nkv):
        for split in range(p["n_splits"]):
            rows = [(i, kvh * g + r) for i in range(Tq) for r in range(g)]  # all blocks at once
            j0, j1 = split * kps, min(Tk, (split + 1) * kps)

            def tile_bits(t0, rows=rows, j1=j1):
                return np.array([[t0 + j < j1 and key_visible(spec, i, t0 + j)
                                  for j in range(KEY_TILE)] for i, _ in rows])

            bits = tile_bits(j0)
            vis = bits.any()
            buffers = [None] * nbuf
            buf = 0
            for t0 in range(j0, j1, KEY_TILE):
                tiles += 1
                if vis:
                    idx = [t0 + j for j in range(KEY_TILE)]
                    buffers[buf] = [np.array([x[j, kvh] if j < j1 else np.zeros(d) for j in idx])
                                    for x in (k, v)]
                    loaded += 1
                next_bits = tile_bits(t0 + KEY_TILE)
                next_vis = next_bits.any()
                barriers += 1
                if vis:
                    kt, vt = buffers[buf]
                    for r, (i, h) in enumerate(rows):
                        if not bits[r].any():
                            continue
                        s = np.where(bits[r], kt @ q[i, h] * scale, -np.inf)
                        # fmaxf drops NaN; att_softmax_shift: 0 while the max is -inf
                        m_new = np.fmax(parts[1][split, i, h], np.fmax.reduce(s, initial=-np.inf))
                        sh = 0.0 if m_new == -np.inf else m_new
                        corr = np.exp(parts[1][split, i, h] - sh)
                        pr = np.where(bits[r], np.exp(s - sh), 0.0)
                        ls[split, i, h] = ls[split, i, h] * corr + pr.sum()
                        seen = bits[r]  # a row accumulates only the V rows it sees
                        parts[0][split, i, h] = (parts[0][split, i, h] * corr
                                                 + pr[seen] @ vt[seen])
                        parts[1][split, i, h] = m_new
                if nbuf == 1 and next_vis:
                    barriers += 1
                buf = buf ^ 1 if nbuf == 2 else 0
                vis, bits = next_vis, next_bits
    acc, m = parts  # attention_combine_f32: l != 0 is mass (a NaN l counts)
    M = np.fmax.reduce(np.where(ls != 0, m, -np.inf), axis=0)
    M = np.where(M == -np.inf, 0.0, M)  # att_softmax_shift
    w = np.where(ls != 0, np.exp(np.where(ls != 0, m, 0.0) - M), 0.0)
    L = (ls * w).sum(axis=0)
    inv = np.where(L != 0, 1 / np.where(L != 0, L, 1.0), 0.0)
    out = (acc * w[..., None]).sum(axis=0) * inv[..., None]  # every split's acc, even at w = 0
    return out, barriers, tiles, loaded


@pytest.mark.parametrize(("Tq", "nh", "nkv", "d", "Tk", "kind", "limit"), [
    (1, 4, 2, 8, 700, "causal", SHARED_LIMIT),  # decode, split over keys
    (3, 2, 1, 8, 300, "window", SHARED_LIMIT),  # sliding window: skipped tiles
    (5, 2, 2, 4, 97, "tree", SHARED_LIMIT),  # ancestors
    (2, 2, 1, 256, 130, "causal", SHARED_LIMIT),  # one buffer: two barriers per tile
    (2, 2, 1, 64, 200, "causal", 24 * 1024),  # a small shared limit: one buffer
    (1, 2, 1, 8, 200, "empty", SHARED_LIMIT),  # no visible key at all -> zeros
])
def test_pipelined_tile_loop_matches_the_reference(rng, Tq, nh, nkv, d, Tk, kind, limit):
    from dflash_ref.ops.attention import attention
    from dflash_ref.ops.masks import MaskSpec

    q = rng.standard_normal((Tq, nh, d))
    k = rng.standard_normal((Tk, nkv, d))
    v = rng.standard_normal((Tk, nkv, d))
    k_pos = np.arange(Tk)
    k_pos[rng.random(Tk) < 0.1] = -1
    q_pos = np.arange(Tk - Tq, Tk)
    spec = {
        "causal": MaskSpec(q_pos, k_pos, causal=True),
        "window": MaskSpec(q_pos, k_pos, causal=True, window=40),
        "tree": MaskSpec(q_pos, k_pos, causal=False, base_pos=Tk - Tq,
                         ancestors=rng.random((Tq, Tk)) < 0.5),
        "empty": MaskSpec(q_pos, np.full(Tk, -1), causal=True),
    }[kind]
    out, barriers, tiles, loaded = _emulate_forward(q, k, v, spec, 0.3, sm_count=64,
                                              shared_limit=limit)
    expected = attention(q, k, v, spec, scale=0.3)  # the reference (two-pass softmax), float64
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)
    nbuf = plan_launch(Tq, nh, nkv, d, Tk, 64, shared_limit=limit)["nbuf"]
    # One barrier per key tile with two buffers (a skipped tile costs its barrier, no loads);
    # one more per loaded tile with one buffer. Prologue barrier not counted.
    assert barriers == tiles if nbuf == 2 else tiles <= barriers <= tiles + loaded
    assert (loaded == 0) == (kind == "empty") and loaded <= tiles
