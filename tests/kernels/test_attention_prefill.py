"""The prefill attention kernels (``attention_prefill_*`` in kernels_cupy/cuda/attention.cu).

On CPU: the selection rule and the launch plan (kernels_cupy/attention_prefill.py), the K/V
traffic it saves, and a NumPy emulation of the kernel's tile loop (flat shared memory filled with
NaN, the kernel's index arithmetic, the order of the online-softmax updates, skipped tiles,
partial tiles, barrier counts) against the reference. On a GPU (``gpu``): the kernel against the
NumPy reference at prefill shapes, and against the decode kernel.

Expected values come from the NumPy reference ``dflash_ref.ops.attention.attention`` (two-pass
softmax over the materialised mask: an independent evaluation) or are counted by hand in the
comments.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import kernels_cupy.attention_prefill as kpf
from kernels_cupy import _build
from kernels_cupy.attention import SHARED_LIMIT, plan_launch
from kernels_cupy.attention_prefill import (
    KERNELS,
    KEY_TILE,
    MIN_QUERY_ROWS,
    PF_WARPS,
    choose_kernel,
    plan_prefill,
)

# ---------------------------------------------------------------- the selection rule


@pytest.mark.parametrize(("shape", "sm_count", "limit", "expected"), [
    ((1, 32, 8, 128, 32768), 132, SHARED_LIMIT, "decode"),  # decode: one query row
    ((16, 32, 8, 128, 4096), 132, SHARED_LIMIT, "decode"),  # 16-token verify / drafter block
    ((512, 32, 8, 128, 512), 132, SHARED_LIMIT, "prefill"),  # 8 tiles x 32 heads = 256 >= 132
    ((512, 16, 2, 256, 512), 132, SHARED_LIMIT, "prefill"),  # d = 256: 16 tiles x 16 heads
    ((63, 32, 8, 128, 63), 1, SHARED_LIMIT, "decode"),  # below one 64-row query tile
    # MIN_BLOCKS_PER_SM = 0.4 (measured on an H200): 0.4 x 132 SMs = 52.8 blocks
    ((64, 32, 8, 128, 4096), 132, SHARED_LIMIT, "decode"),  # 1 tile x 32 heads < 52.8
    ((64, 32, 8, 128, 4096), 80, SHARED_LIMIT, "prefill"),  # 32 >= 0.4 x 80 = 32
    ((65, 32, 8, 128, 4096), 132, SHARED_LIMIT, "prefill"),  # 2 x 32 = 64 (docs/attention.md)
    ((128, 16, 2, 128, 4096), 132, SHARED_LIMIT, "decode"),  # 2 x 16 = 32 < 52.8
    ((256, 32, 8, 128, 256), 132, SHARED_LIMIT, "prefill"),  # 4 x 32 = 128
    ((512, 32, 8, 128, 0), 132, SHARED_LIMIT, "decode"),  # no key: the wrapper returns zeros
    ((512, 32, 8, 128, 512), 132, 32 * 1024, "decode"),  # prefill needs 48.5 KiB at least
    ((512, 32, 8, 300, 512), 132, SHARED_LIMIT, "decode"),  # d > 256: the wrapper's error
])
def test_which_kernel_runs(shape, sm_count, limit, expected):
    assert choose_kernel(*shape, sm_count=sm_count, shared_limit=limit) == expected


def test_the_thresholds_are_plan_parameters(monkeypatch):
    # 16 query rows, 32 heads: one 64-row tile x 32 heads = 32 blocks.
    shape = (16, 32, 8, 128, 4096)
    assert choose_kernel(*shape, sm_count=32, shared_limit=SHARED_LIMIT) == "decode"  # < 64 rows
    assert choose_kernel(*shape, sm_count=32, shared_limit=SHARED_LIMIT,
                         min_query_rows=16) == "prefill"
    assert choose_kernel(*shape, sm_count=32, shared_limit=SHARED_LIMIT, min_query_rows=16,
                         min_blocks_per_sm=1.5) == "decode"  # 32 < 1.5 x 32 blocks
    assert choose_kernel(*shape, sm_count=64, shared_limit=SHARED_LIMIT, min_query_rows=16,
                         min_blocks_per_sm=0.5) == "prefill"  # 32 >= 0.5 x 64
    monkeypatch.setattr(kpf, "MIN_QUERY_ROWS", 16)  # the module defaults, read at call time
    assert choose_kernel(*shape, sm_count=32, shared_limit=SHARED_LIMIT) == "prefill"
    monkeypatch.setattr(kpf, "MIN_BLOCKS_PER_SM", 2.0)
    assert choose_kernel(*shape, sm_count=32, shared_limit=SHARED_LIMIT) == "decode"


# ---------------------------------------------------------------- the launch plan

CASES = [
    # (Tq, nh, nkv, d, Tk): Qwen3 / Llama prefill, Qwen3-Next / Gemma full layers, awkward
    (512, 32, 8, 128, 512), (2048, 16, 2, 256, 2048), (100, 4, 2, 8, 100), (65, 3, 1, 66, 90),
    (300, 8, 2, 97, 377), (1, 1, 1, 1, 1), (4096, 7, 7, 200, 5000), (64, 2, 1, 192, 64),
]


@pytest.mark.parametrize("case", CASES, ids=str)
# 66048 bytes: the least that d = 256 needs; d = 128 then takes one K/V buffer.
@pytest.mark.parametrize("limit", [SHARED_LIMIT, 66048])
def test_plan_covers_every_row_within_limits(case, limit):
    Tq, nh, nkv, d, Tk = case
    p = plan_prefill(Tq, nh, nkv, d, Tk, limit)
    gx, gy, gz = p["grid"]
    assert p["BQ"] == PF_WARPS * p["rpw"] and p["BQ"] in (32, 64)
    assert gx * p["BQ"] >= Tq > (gx - 1) * p["BQ"] or Tq == 0  # every row, no empty block
    assert gy == nh and gz == 1 and gx < 2**31 and gy <= 65535
    assert d <= 32 * p["dc"] and p["rpw"] * p["dc"] == 32  # acc registers per lane
    assert p["ld"] == (d + 4 if d % 4 == 0 else d + 1) and p["vec4"] == (d % 4 == 0)
    assert p["kv_bufs"] in (1, 2)
    assert p["shared_mem"] == (p["BQ"] * d + p["kv_bufs"] * KEY_TILE * p["ld"]) * 4
    assert p["shared_mem"] <= limit
    if p["vec4"]:  # sQ rows, sK and sV start on 16 bytes
        assert d % 4 == 0 and p["ld"] % 4 == 0 and (p["BQ"] * d) % 4 == 0
    assert p["kernel"] in _build.kernel_names("attention")


def test_every_head_dim_fits_96_kib():
    for d in range(1, 257):
        for vec4 in {False, d % 4 == 0}:
            p = plan_prefill(512, 8, 2, d, 512, SHARED_LIMIT, vec4=vec4)
            assert p["shared_mem"] <= SHARED_LIMIT, (d, vec4)
    # By hand: d = 128 (float4, ld 132): 64 x 128 x 4 + 2 x 32 x 132 x 4 = 32768 + 33792 bytes.
    p = plan_prefill(512, 32, 8, 128, 512, SHARED_LIMIT)
    assert (p["BQ"], p["kv_bufs"], p["shared_mem"]) == (64, 2, 66560)
    # d = 256: 32 x 256 x 4 + 32 x 260 x 4 = 32768 + 33280; with V's own buffer 99328 > 98304.
    p = plan_prefill(512, 16, 2, 256, 512, SHARED_LIMIT)
    assert (p["BQ"], p["kv_bufs"], p["shared_mem"]) == (32, 1, 66048)
    # Odd dims take the scalar kernel (ld = d + 1): d = 66 -> 64 x 66 x 4 + 2 x 32 x 67 x 4.
    p = plan_prefill(300, 8, 2, 66, 300, SHARED_LIMIT)
    assert (p["vec4"], p["ld"], p["shared_mem"]) == (False, 67, 16896 + 17152)


def test_too_little_shared_memory_is_an_error_not_a_bad_launch():
    with pytest.raises(ValueError, match="shared memory"):
        plan_prefill(512, 16, 2, 256, 512, shared_limit=32 * 1024)
    with pytest.raises(ValueError, match="d % 4"):
        plan_prefill(512, 16, 2, 66, 512, SHARED_LIMIT, vec4=True)
    with pytest.raises(ValueError, match="head dim 257"):
        plan_prefill(512, 16, 2, 257, 512, SHARED_LIMIT)


def test_constants_match_the_cuda_source():
    src = (_build.CUDA_DIR / "attention.cu").read_text()
    assert f"#define PF_WARPS {PF_WARPS}" in src and f"#define ATT_KT {KEY_TILE}" in src
    rows = {128: 8, 256: 4}  # VARIANTS, written out
    for (dmax, vec4), name in KERNELS.items():
        body = (rf'extern "C" __global__ void {name}\(PF_PARAMS\) {{\s*attention_prefill_body'
                rf'<{"true" if vec4 else "false"}, {rows[dmax]}, {dmax // 32}>\(PF_ARGS\);')
        assert re.search(body, src), name
    assert MIN_QUERY_ROWS == 64


# ---------------------------------------------------------------- K/V traffic


def _tile_visibility(spec, Tq, Tk):
    """[Tq, n_tiles]: does query i see any slot of key tile t (the materialised predicate)."""
    from dflash_ref.ops.masks import visible

    vis = np.asarray(visible(spec))  # [Tq, Tk]
    n_tiles = math.ceil(Tk / KEY_TILE)
    padded = np.zeros((Tq, n_tiles * KEY_TILE), bool)
    padded[:, :Tk] = vis
    return padded.reshape(Tq, n_tiles, KEY_TILE).any(axis=2)


@pytest.mark.parametrize(("nh", "nkv", "d"), [(32, 8, 128), (16, 2, 256)])
def test_prefill_reads_each_kv_tile_a_quarter_as_often_as_the_decode_kernel(nh, nkv, d):
    # Count the (block, key tile) pairs that load K/V: a block loads a tile iff one of its rows
    # sees one of its slots. Decode: blocks of R (query, head) rows of one kv head; prefill:
    # blocks of BQ query rows of one query head. Causal, T = 1024: R = 16 (d = 128) or 8 (d = 256)
    # against BQ = 64 or 32, so about a quarter of the loads.
    from dflash_ref.ops.masks import causal_mask

    T, g = 1024, nh // nkv
    tiles = _tile_visibility(causal_mask(np.arange(T)), T, T)  # [T, n_tiles]
    dec = plan_launch(T, nh, nkv, d, T, 132)
    assert dec["n_splits"] == 1
    rows = np.repeat(np.arange(T), g)  # flattened row rg = i * g + hh -> query i
    decode_loads = nkv * sum(tiles[rows[r0:r0 + dec["R"]]].any(axis=0).sum()
                             for r0 in range(0, T * g, dec["R"]))
    BQ = plan_prefill(T, nh, nkv, d, T, SHARED_LIMIT)["BQ"]
    prefill_loads = nh * sum(tiles[i0:i0 + BQ].any(axis=0).sum() for i0 in range(0, T, BQ))
    assert 3.5 <= decode_loads / prefill_loads <= 4.0


# ---------------------------------------------------------------- the tile loop, emulated


def _emulate_prefill(q, k, v, spec, scale, softcap, plan):
    """attention_prefill_body in NumPy (float64), block by block.

    Shared memory is one flat array per block, NaN-filled, addressed with the kernel's offsets
    (sQ at 0, sK at BQ * d, sV at sK + KT * ld or sK): reading a float no load wrote, or a layout
    that overlaps, shows as NaN or a wrong output. Returns (out, barriers, tiles, loaded).
    """
    from tests.ops.test_masks import key_visible  # att_key_visible, transcribed

    Tq, nh, d = q.shape
    Tk, nkv, _ = k.shape
    g = nh // nkv
    BQ, rpw, ld, kv_bufs = plan["BQ"], plan["rpw"], plan["ld"], plan["kv_bufs"]
    gx = plan["grid"][0]
    out = np.full((Tq, nh, d), np.nan)  # rows the kernel never writes stay NaN
    barriers = tiles = loaded = 0

    def load_tile(smem, base, src, t0, kvh):  # att_load_tile: rows past Tk are zero
        for jj in range(KEY_TILE):
            row = src[t0 + jj, kvh] if t0 + jj < Tk else np.zeros(d)
            smem[base + jj * ld: base + jj * ld + d] = row

    for bx in range(gx):
        for h in range(nh):
            kvh, i0 = h // g, (gx - 1 - bx) * BQ
            smem = np.full(plan["shared_mem"] // 4, np.nan)
            for r in range(BQ):  # the query tile; zero rows past Tq
                smem[r * d:(r + 1) * d] = q[i0 + r, h] if i0 + r < Tq else 0.0
            sK = BQ * d
            sV = sK + KEY_TILE * ld if kv_bufs == 2 else sK
            row_ok = [i0 + r < Tq for r in range(BQ)]
            m, l = np.full(BQ, -np.inf), np.zeros(BQ)
            acc = np.zeros((BQ, d))
            for t0 in range(0, Tk, KEY_TILE):
                tiles += 1
                bits = np.array([[row_ok[r] and t0 + j < Tk and key_visible(spec, i0 + r, t0 + j)
                                  for j in range(KEY_TILE)] for r in range(BQ)])
                barriers += 1  # (A)
                if not bits.any():
                    continue
                loaded += 1
                load_tile(smem, sK, k, t0, kvh)
                if kv_bufs == 2:
                    load_tile(smem, sV, v, t0, kvh)
                barriers += 1  # (B)
                Ks = smem[sK:sK + KEY_TILE * ld].reshape(KEY_TILE, ld)[:, :d]  # lane j: row j
                p = np.zeros((BQ, KEY_TILE))
                for w in range(PF_WARPS):
                    for r in range(w * rpw, (w + 1) * rpw):
                        if not bits[r].any():
                            continue
                        x = (Ks @ smem[r * d:(r + 1) * d]) * scale  # [KT]; NaN in unseen slots
                        if softcap:
                            x = softcap * np.tanh(x / softcap)
                        x = np.where(bits[r], x, -np.inf)
                        # fmaxf drops NaN; att_softmax_shift: 0 while the max is -inf
                        m_new = np.fmax(m[r], np.fmax.reduce(x, initial=-np.inf))
                        sh = 0.0 if m_new == -np.inf else m_new
                        corr = np.exp(m[r] - sh)
                        p[r] = np.where(bits[r], np.exp(x - sh), 0.0)
                        l[r] = l[r] * corr + p[r].sum()
                        acc[r] *= corr
                        m[r] = m_new
                if kv_bufs == 1:
                    barriers += 1  # (C)
                    load_tile(smem, sV, v, t0, kvh)
                    barriers += 1  # (D)
                for w in range(PF_WARPS):
                    rows = range(w * rpw, (w + 1) * rpw)
                    for jj in np.flatnonzero(bits[list(rows)].any(axis=0)):  # ascending
                        vrow = smem[sV + jj * ld: sV + jj * ld + d]
                        for r in rows:
                            if bits[r, jj]:
                                acc[r] += p[r, jj] * vrow
            for r in range(BQ):
                if row_ok[r]:  # inv = l > 0 ? 1 / l : 0; a NaN acc stays NaN
                    out[i0 + r, h] = acc[r] * (1 / l[r] if l[r] > 0 else 0.0)
    return out, barriers, tiles, loaded


def masked_case(rng, Tq, nh, nkv, d, Tk, kind):
    """float64 q [Tq, nh, d], k / v [Tk, nkv, d] and a MaskSpec of ``kind`` for the tile-loop
    emulations (v1 here, v2 in test_attention_prefill_v2.py): the queries are the last Tq
    positions, about 10% of the key slots are invalid (-1) and hold NaN, which must never reach
    the output; "none" makes every slot visible and real."""
    from dflash_ref.ops.masks import MaskSpec

    q = rng.standard_normal((Tq, nh, d))
    k = rng.standard_normal((Tk, nkv, d))
    v = rng.standard_normal((Tk, nkv, d))
    k_pos = np.arange(Tk)
    k_pos[rng.random(Tk) < 0.1] = -1  # invalid slots ...
    k[k_pos < 0], v[k_pos < 0] = np.nan, np.nan  # ... holding garbage, which must stay out
    q_pos = np.arange(Tk - Tq, Tk)
    spec = {
        "causal": MaskSpec(q_pos, k_pos, causal=True),
        "window": MaskSpec(q_pos, k_pos, causal=True, window=40),
        "tree": MaskSpec(q_pos, k_pos, causal=False, base_pos=Tk - Tq,
                         ancestors=rng.random((Tq, Tk)) < 0.5),
        "none": MaskSpec(q_pos, np.abs(k_pos), causal=False),
        "empty": MaskSpec(q_pos, np.full(Tk, -1), causal=True),
    }[kind]
    if kind == "none":  # every slot visible: real values everywhere
        k, v = rng.standard_normal((Tk, nkv, d)), rng.standard_normal((Tk, nkv, d))
    return q, k, v, spec


@pytest.mark.parametrize(("Tq", "nh", "nkv", "d", "Tk", "kind", "limit", "softcap"), [
    (100, 4, 2, 8, 100, "causal", SHARED_LIMIT, None),  # GQA, partial query and key tiles
    (70, 2, 1, 8, 300, "window", SHARED_LIMIT, None),  # a prefix, sliding window: skipped tiles
    (65, 2, 2, 4, 97, "tree", SHARED_LIMIT, None),  # ancestors over a committed prefix
    (40, 2, 1, 256, 130, "causal", SHARED_LIMIT, None),  # d = 256: BQ 32, V reuses K's buffer
    (64, 2, 1, 128, 100, "causal", 64 * 1024, None),  # d = 128 under 64 KiB: one buffer
    (70, 3, 1, 66, 90, "none", SHARED_LIMIT, None),  # scalar kernel (ld = d + 1), g = 3
    (80, 2, 1, 16, 120, "causal", SHARED_LIMIT, 5.0),  # softcap
    (64, 1, 1, 8, 64, "empty", SHARED_LIMIT, None),  # no visible key at all -> zeros
])
def test_tile_loop_matches_the_reference(rng, Tq, nh, nkv, d, Tk, kind, limit, softcap):
    from dflash_ref.ops.attention import attention

    q, k, v, spec = masked_case(rng, Tq, nh, nkv, d, Tk, kind)
    plan = plan_prefill(Tq, nh, nkv, d, Tk, limit)
    out, barriers, tiles, loaded = _emulate_prefill(q, k, v, spec, 0.3, softcap, plan)
    expected = attention(q, k, v, spec, scale=0.3, softcap=softcap)  # float64 reference
    np.testing.assert_allclose(out, expected, rtol=1e-10, atol=1e-12)
    # (A) per key tile; (B) per loaded tile; (C) and (D) as well with one K/V buffer.
    assert barriers == tiles + loaded * (1 if plan["kv_bufs"] == 2 else 3)
    assert (loaded == 0) == (kind == "empty") and loaded <= tiles
    if kind == "window":  # keys more than 40 positions before the first query are never loaded
        assert loaded < tiles


# ---------------------------------------------------------------- on a GPU


def _inputs(rng, Tq, nh, nkv, d, Tk, kind):
    from dflash_ref.ops.masks import MaskSpec

    q = rng.standard_normal((Tq, nh, d)).astype(np.float32)
    k = rng.standard_normal((Tk, nkv, d)).astype(np.float32)
    v = rng.standard_normal((Tk, nkv, d)).astype(np.float32)
    k_pos = np.arange(Tk)
    k_pos[rng.random(Tk) < 0.05] = -1  # invalid slots
    q_pos = np.arange(Tk - Tq, Tk)
    mask = {
        "none": None,
        "causal": MaskSpec(q_pos, k_pos, causal=True),
        "window": MaskSpec(q_pos, k_pos, causal=True, window=300),
        "tree": MaskSpec(q_pos, k_pos, causal=False, base_pos=Tk - Tq,
                         ancestors=np.tril(rng.random((Tq, Tk)) < 0.5, k=Tk - Tq)),
    }[kind]
    return q, k, v, mask


def _check_prefill(q, k, v, mask, case, **kw):
    import cupy as cp

    from dflash_ref.ops.attention import attention
    from dflash_ref.testing import assert_close
    from kernels_cupy.attention import attention_using

    expected = attention(q, k, v, mask, **kw)  # the NumPy reference
    got = attention_using("prefill", cp.asarray(q), cp.asarray(k), cp.asarray(v), mask, **kw)
    assert_close(got, expected, "float32_attention", op="attention (prefill kernel)", case=case)
    return got


PREFILL_CASES = [
    # Tq, nh, nkv, d, Tk, kind: Qwen3-shaped prefill (GQA 4), d = 256 (V reuses K's buffer),
    # sliding window, no mask, a prompt continued after a cached prefix
    (512, 32, 8, 128, 512, "causal"), (2048, 8, 2, 128, 2048, "causal"),
    (512, 16, 2, 256, 512, "causal"), (2048, 4, 1, 256, 2048, "window"),
    (2048, 8, 2, 128, 2048, "window"), (512, 8, 8, 128, 512, "none"),
    (512, 16, 4, 128, 1500, "causal"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("case", PREFILL_CASES, ids=str)
@pytest.mark.parametrize("scale", [None, 0.05])
def test_prefill_kernel_matches_the_reference(rng, case, scale):
    q, k, v, mask = _inputs(rng, *case)
    _check_prefill(q, k, v, mask, f"{case} scale={scale}", scale=scale)


@pytest.mark.gpu
@pytest.mark.parametrize(("case", "softcap"), [
    ((300, 8, 2, 66, 377, "causal"), None),  # scalar kernel, partial query and key tiles
    ((300, 4, 1, 97, 300, "window"), None),  # scalar, d = 97 (dead lanes in V's last chunk)
    ((100, 4, 2, 200, 163, "tree"), None),  # d = 200 with float4, ancestors
    ((130, 4, 2, 64, 130, "causal"), 30.0),  # softcap
    ((70, 2, 1, 1, 70, "causal"), None),  # d = 1
])
def test_prefill_kernel_awkward_shapes(rng, case, softcap):
    q, k, v, mask = _inputs(rng, *case)
    _check_prefill(q, k, v, mask, f"{case} softcap={softcap}", softcap=softcap)


@pytest.mark.gpu
def test_prefill_kernel_ignores_garbage_in_invalid_slots_and_unaligned_views(rng):
    import cupy as cp

    from dflash_ref.ops.attention import attention
    from dflash_ref.testing import assert_close
    from kernels_cupy.attention import attention_using

    q, k, v, mask = _inputs(rng, 200, 8, 2, 128, 260, "causal")
    k[mask.k_pos < 0], v[mask.k_pos < 0] = np.nan, np.inf  # free pool slots: never visible
    expected = attention(q, k, v, mask)
    buf = cp.zeros((2, k.size + 1), cp.float32)  # k, v one float into a buffer: scalar kernel
    buf[0, 1:], buf[1, 1:] = cp.asarray(k).ravel(), cp.asarray(v).ravel()
    dk, dv = buf[0, 1:].reshape(k.shape), buf[1, 1:].reshape(v.shape)
    assert dk.data.ptr % 16 != 0
    got = attention_using("prefill", cp.asarray(q), dk, dv, mask)
    assert_close(got, expected, "float32_attention", op="attention (prefill kernel)",
                 case="NaN / inf in invalid slots, unaligned k / v")


@pytest.mark.gpu
@pytest.mark.parametrize("d", [128, 256, 97])
def test_prefill_and_decode_kernels_agree_bit_for_bit(rng, d):
    # Each row sees the same float operations in the same order in both kernels when the
    # decode kernel does not split the keys (docs/attention.md, "The prefill kernel").
    import cupy as cp

    from kernels_cupy.attention import _sm_count, attention_using

    Tq, nh, nkv, Tk = 1024, 16, 4, 1024
    assert plan_launch(Tq, nh, nkv, d, Tk, _sm_count(cp.cuda.Device().id))["n_splits"] == 1
    q, k, v, mask = (cp.asarray(a) if isinstance(a, np.ndarray) else a
                     for a in _inputs(rng, Tq, nh, nkv, d, Tk, "causal"))
    a = attention_using("prefill", q, k, v, mask, scale=0.05)
    b = attention_using("decode", q, k, v, mask, scale=0.05)
    assert cp.array_equal(a, b), f"max |prefill - decode| = {float(cp.abs(a - b).max())}"


@pytest.mark.gpu
def test_attention_selects_the_prefill_kernel_for_a_prefill(monkeypatch, rng):
    import cupy as cp

    import kernels_cupy.attention as katt

    dev = cp.cuda.Device().id
    assert katt.choose_kernel(2048, 32, 8, 128, 2048, katt._sm_count(dev),
                              katt._shared_limit(dev)) == "prefill"
    assert katt.choose_kernel(16, 32, 8, 128, 2048, katt._sm_count(dev),
                              katt._shared_limit(dev)) == "decode"
    used = []
    for name in ("plan_prefill", "plan_prefill_v2", "plan_prefill_tc"):  # the plan that runs
        real = getattr(katt, name)
        monkeypatch.setattr(katt, name, lambda *a, real=real, name=name, **kw:
                            used.append(name) or real(*a, **kw))
    q, k, v, mask = _inputs(rng, 2048, 32, 8, 128, 2048, "causal")
    katt.attention(cp.asarray(q), cp.asarray(k), cp.asarray(v), mask)
    # d = 128 with 16-byte rows: the tensor-core kernel on sm_80+ (PREFILL_TC), else v2
    # (PREFILL_V2 is on)
    tc = katt.has_tensor_cores(dev)
    assert used == ["plan_prefill_tc" if tc else "plan_prefill_v2"]
