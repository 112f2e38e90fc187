"""Decode attention v3 (``attention_decode_v3_*``, kernels_cupy/cuda/attention_decode_v3.cu).

On CPU: the plan (kernels_cupy/attention_decode_v3.py: every key in exactly one split, at most
MAX_SPLITS splits of whole 64-key strides, every row in a warp, the warp layouts by hand,
refusals), the constants against the CUDA source, registers without spills for sm_80 and sm_90,
and :func:`emulate_decode_v3`, the kernels' thread mapping and summation order in NumPy: per
(split, kv head, row block) block, warp w's rows (its row group, quads of 4) and key groups
j_begin + 8 (kw + key_warps u), the lane partial dots (lane L: float4 columns L and L + 32, x y z
w in order), the reduce-scatter over 32 lanes (the xor tree 16, 8, 4, 2, 1), the row's 8-lane
max and sum (xor 4, 2, 1), V added key by key for the rows that see it, then the block's merge
of a row group's warps in warp order and the last block's merge in split order. Shapes: decode
and 16-row verify blocks, d = 36, 64, 128, 200, 256, GQA 1 to 8. Expected values:
``dflash_ref.ops.attention.attention`` (the mask materialised, a two-pass softmax: an
independent evaluation).

Tolerances: float64 emulation vs float64 reference, rtol 1e-10 / atol 1e-12 (another association
of the same sums; a one-line error in the recurrence or the merge is O(1)); float32 emulation vs
float64 reference at "float32_attention" (dflash_ref/testing.py), the tolerance the ``gpu``
tests hold the kernel to. On a GPU (``gpu``): the kernel against the reference, every mask, with
and without splits, twice in a row (the ticket counters reset), and replayed from a CUDA graph.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.ops.attention import attention
from dflash_ref.ops.masks import MaskSpec, visible
from dflash_ref.testing import assert_close
from kernels_cupy import _build
from kernels_cupy import attention_decode_v3 as d3
from tests.kernels.ptxas import ptxas_entries
from tests.kernels.test_attention_decode_plan import MASKS, make_mask

LANES = np.arange(32)


def _fma(a, b, c, dt):
    """fmaf: one rounding of a * b + c (float64 products of float32 values are exact)."""
    return (np.asarray(a, np.float64) * b + c).astype(dt)


def _merge(slots, dt):
    """d3_merge over [(m [R], l [R], acc [R, W])] in slot order -> (O, M, L)."""
    M = np.full(slots[0][0].shape, -np.inf, dt)
    for m, l, _ in slots:
        M = np.where(l != 0, np.fmax(M, m), M)  # a NaN l is mass
    M = np.where(M == -np.inf, 0, M).astype(dt)  # att_softmax_shift
    L = np.zeros_like(M)
    O = np.zeros_like(slots[0][2])
    for m, l, acc in slots:
        w = np.where(l != 0, np.exp(m - M), 0).astype(dt)
        L = _fma(l, w, L, dt)
        O = _fma(acc, w[:, None], O, dt)  # every slot, even at w = 0
    return O, M, L


def _finish(O, L, dt):
    inv = np.where(L != 0, 1 / np.where(L != 0, L, 1), 0).astype(dt)
    return (O * inv[:, None]).astype(dt)


def _lanes(X, nv):
    """[n, 128 nv] columns -> [n, 32, 4 nv]: lane L's columns in its fmaf order (float4 slot
    L, then slot L + 32)."""
    return X.reshape(len(X), nv, 32, 4).transpose(0, 2, 1, 3).reshape(len(X), 32, 4 * nv)


def _quad(Qq, K, V, bits, state, scale, softcap, dt):
    """One quad's step over one key group: Qq [4, 32, 4 nv] lane columns, K / V [8, 128 nv],
    bits [4, 8] (row s sees key t); state (m [4], l [4], acc [4, 128 nv]) updated in place."""
    m, l, acc = state
    KG = d3.KEY_GROUP
    Kr = _lanes(K, Qq.shape[2] // 4)  # [KG, lane, 4 nv]
    a = (Qq[:, None, :, 0] * Kr[None, :, :, 0]).astype(dt)  # [4, KG, lane]
    for e in range(1, Qq.shape[2]):  # the lane's fmaf chain: slot 0 x y z w, then slot 1
        a = _fma(Qq[:, None, :, e], Kr[None, :, :, e], a, dt)
    for o in (16, 8, 4, 2, 1):  # reduce-scatter: the xor-butterfly tree
        a = (a + a[..., LANES ^ o]).astype(dt)
    x = (a[..., 0] * dt(scale)).astype(dt)  # [4, KG]
    if softcap:
        x = (dt(softcap) * np.tanh(x / dt(softcap))).astype(dt)
    x = np.where(bits, x, -np.inf).astype(dt)
    m_new = np.fmax(m, np.fmax.reduce(x, axis=1))  # fmaxf drops NaN
    sh = np.where(m_new == -np.inf, 0, m_new).astype(dt)
    p = np.where(bits, np.exp(x - sh[:, None]), 0).astype(dt)
    ps = p
    for o in (4, 2, 1):  # the row's 8 lanes
        ps = (ps + ps[:, np.arange(KG) ^ o]).astype(dt)
    seen = bits.any(axis=1)
    corr = np.exp(m - sh).astype(dt)
    l[:] = np.where(seen, _fma(l, corr, ps[:, 0], dt), l)
    acc[:] = np.where(seen[:, None], (acc * corr[:, None]).astype(dt), acc)
    for t in range(KG):  # keys ascending; a row only the keys it sees
        acc[:] = np.where(bits[:, t, None], _fma(p[:, t, None], V[t][None], acc, dt), acc)
    m[:] = np.where(seen, m_new, m)


def _warp(Q, k, v, vis, kvh, j_first, j_end, stride, scale, softcap, dt):
    """One warp's groups of one block: its (m, l, acc) per row. Q [4 nq, 128 nv]: the warp's
    rows of q (zero past d and past the rows); vis [4 nq, Tk] (False past the rows)."""
    R, KG, d = len(Q), d3.KEY_GROUP, k.shape[2]
    W = Q.shape[1]
    m, l, acc = np.full(R, -np.inf, dt), np.zeros(R, dt), np.zeros((R, W), dt)
    Qq = _lanes(Q, W // 128)
    for j0 in range(j_first, j_end, stride):
        keys = j0 + np.arange(KG)
        bits = vis[:, np.minimum(keys, len(k) - 1)] & (keys < j_end)[None]  # [R, KG] ballots
        need = bits.any(axis=0)  # K / V rows loaded: keys some row of the warp sees
        K, V = np.zeros((KG, W), dt), np.zeros((KG, W), dt)
        K[need, :d], V[need, :d] = k[keys[need], kvh], v[keys[need], kvh]
        for u in range(0, R, d3.ROWS):  # the quads; one no row of which sees the group: skipped
            if bits[u:u + 4].any():
                state = (m[u:u + 4], l[u:u + 4], acc[u:u + 4])  # views: updated in place
                _quad(Qq[u:u + 4], K, V, bits[u:u + 4], state, scale, softcap, dt)
    return m, l, acc


def emulate_decode_v3(q, k, v, spec, scale, softcap=None, sm_count=132):
    """attention_decode_v3_* in NumPy, block by block, in q's dtype. -> out [Tq, nh, d]."""
    dt = q.dtype.type
    Tq, nh, d = q.shape
    Tk, nkv, _ = k.shape
    g = nh // nkv
    plan = d3.plan_decode_v3(Tq, nh, nkv, d, Tk, sm_count)
    S, kps, rows = plan["n_splits"], plan["keys_per_split"], plan["rows"]
    rpb, kw, rpw = plan["rows_per_block"], plan["key_warps"], d3.ROWS * plan["quads"]
    assert plan["grid"] == (S, nkv, plan["row_blocks"]) and plan["kernel"] in d3.KERNELS.values()
    W = 128 * d3.slots_per_lane(d)
    vis_all = visible(spec) if spec is not None else np.ones((Tq, Tk), bool)
    out = np.full((Tq, nh, d), np.nan, dt)  # NaN: an unwritten row fails loudly
    for kvh in range(nkv):
        for row0 in range(0, rows, rpb):
            r = np.arange(row0, min(rows, row0 + rpb))  # this block's rows
            ri, rh = r // g, r % g  # query row, head within the group
            parts = []
            for z in range(S):
                jb, je = z * kps, min(Tk, (z + 1) * kps)
                slots = []  # per block row: its row group's key warps, in warp order
                for w in range(d3.WARPS):
                    rr = (w // kw) * rpw + np.arange(rpw)  # the warp's block rows
                    ok = rr < len(r)
                    Q = np.zeros((rpw, W), dt)
                    Q[ok, :d] = q[ri[rr[ok]], kvh * g + rh[rr[ok]]]
                    vis = np.zeros((rpw, Tk), bool)
                    vis[ok] = vis_all[ri[rr[ok]]]
                    if rr[0] < len(r):
                        slots.append(_warp(Q, k, v, vis, kvh, jb + (w % kw) * d3.KEY_GROUP, je,
                                           kw * d3.KEY_GROUP, scale, softcap, dt))
                groups = [_merge(slots[gi * kw:(gi + 1) * kw], dt)
                          for gi in range(len(slots) // kw)]
                O, M, L = (np.concatenate(x)[:len(r)] for x in zip(*groups))
                parts.append((M, L, O))
            O, L = parts[0][2], parts[0][1]
            if S > 1:  # the last block: the splits' partials in split order
                O, _, L = _merge(parts, dt)
            out[ri, kvh * g + rh] = _finish(O, L, dt)[:, :d]
    return out


def _inputs(rng, Tq, nh, nkv, d, Tk, dtype=np.float64):
    return tuple(rng.standard_normal(s).astype(dtype)
                 for s in ((Tq, nh, d), (Tk, nkv, d), (Tk, nkv, d)))


# ---------------------------------------------------------------- the plan


@pytest.mark.parametrize("Tk", [1, 7, 63, 64, 65, 511, 512, 4100, 32768, 100000])
@pytest.mark.parametrize(("nkv", "sm_count"), [(8, 132), (1, 132), (2, 8), (8, 1)])
def test_plan_covers_every_key_once(Tk, nkv, sm_count):
    p = d3.plan_decode_v3(1, 4 * nkv, nkv, 128, Tk, sm_count)
    S, kps = p["n_splits"], p["keys_per_split"]
    assert p["grid"] == (S, nkv, 1) and 1 <= S <= d3.MAX_SPLITS
    assert kps % d3.BLOCK_KEYS == 0 and (S - 1) * kps < Tk <= S * kps  # no empty split
    if S > 1:
        assert kps >= d3.MIN_KEYS_PER_SPLIT
        assert S * nkv <= max(sm_count, nkv)  # at most about one block per SM


def test_plan_at_32k_keys_for_qwen3_4b():
    # 8 kv heads on 132 SMs: 8 splits of 4096 keys, 64 blocks of 8 warps on keys.
    p = d3.plan_decode_v3(1, 32, 8, 128, 32768, 132)
    assert (p["n_splits"], p["keys_per_split"], p["rows"]) == (8, 4096, 4)
    assert p["shared_mem"] == 8 * 4 * 130 * 4  # hand count: slots of (acc, m, l)


@pytest.mark.parametrize(("shape", "layout"), [
    # (Tq, nh, nkv, d) -> (kernel, rows, rows_per_block, row_blocks, quads, key_warps), by hand
    ((1, 32, 8, 128), ("attention_decode_v3_f32", 4, 4, 1, 1, 8)),  # Qwen3-4B decode
    ((1, 4, 1, 256), ("attention_decode_v3_d256_f32", 4, 4, 1, 1, 8)),  # Gemma 3 270M decode
    ((1, 8, 8, 64), ("attention_decode_v3_f32", 1, 1, 1, 1, 8)),  # MHA, d = 64
    ((2, 8, 2, 64), ("attention_decode_v3_f32", 8, 8, 1, 1, 4)),  # 2 row groups x 4 key warps
    ((16, 8, 8, 64), ("attention_decode_v3_f32", 16, 16, 1, 1, 2)),  # MHA verify
    ((8, 16, 4, 128), ("attention_decode_v3_f32", 32, 32, 1, 1, 1)),  # 8 groups of 4 rows
    ((16, 32, 8, 128), ("attention_decode_v3_r8_f32", 64, 64, 1, 2, 1)),  # Qwen3-4B verify
    ((16, 4, 1, 256), ("attention_decode_v3_d256_f32", 64, 32, 2, 1, 1)),  # Gemma 3 verify
    ((16, 16, 2, 128), ("attention_decode_v3_r8_f32", 128, 64, 2, 2, 1)),  # GQA 8 verify
], ids=str)
def test_plan_warp_layout(shape, layout):
    p = d3.plan_decode_v3(*shape, 4096, 132)
    keys = ("kernel", "rows", "rows_per_block", "row_blocks", "quads", "key_warps")
    assert tuple(p[k] for k in keys) == layout
    assert p["grid"] == (p["n_splits"], shape[2], p["row_blocks"])
    assert p["counters"] == shape[2] * p["row_blocks"]
    assert p["shared_mem"] == 8 * 4 * p["quads"] * (shape[3] + 2) * 4  # hand count: the slots


@pytest.mark.parametrize("d", [4, 64, 128, 132, 256])
@pytest.mark.parametrize("Tq", range(1, 17))
@pytest.mark.parametrize("g", [1, 2, 4, 8])
def test_plan_every_row_has_a_warp(d, Tq, g):
    # the row groups (8 / key_warps of 4 quads rows) hold a block's rows; the row blocks all rows
    p = d3.plan_decode_v3(Tq, 2 * g, 2, d, 500, 132)
    assert (d3.WARPS // p["key_warps"]) * d3.ROWS * p["quads"] >= p["rows_per_block"]
    assert p["key_warps"] in (1, 2, 4, 8) and p["quads"] in (1, 2)
    assert (p["row_blocks"] - 1) * p["rows_per_block"] < Tq * g <= p["row_blocks"] * p[
        "rows_per_block"]
    assert p["rows_per_block"] <= (64 if d <= 128 else 32)  # the kernel's registers


@pytest.mark.parametrize(("shape", "why"), [
    ((17, 4, 4, 128), "query rows"), ((64, 32, 8, 128), "query rows"),
    ((1, 4, 1, 260), "head dim"), ((1, 4, 1, 66), "head dim"), ((1, 4, 3, 64), "cannot share"),
    ((1, 1025, 1025, 64), "ticket counters"),
])
def test_plan_refuses_what_v3_does_not_take(shape, why):
    with pytest.raises(ValueError, match=why):
        d3.plan_decode_v3(*shape, 100, 132)


def test_constants_match_the_cuda_source():
    src = (_build.CUDA_DIR / "attention_decode_v3.cu").read_text()
    for macro, value in [("D3_WARPS", d3.WARPS), ("D3_KG", d3.KEY_GROUP), ("D3_ROWS", d3.ROWS),
                         ("D3_MAX_SPLITS", d3.MAX_SPLITS), ("D3_MAX_D", d3.MAX_HEAD_DIM)]:
        assert re.search(rf"#define {macro} {value}\b", src), macro
    assert d3.ROWS * d3.KEY_GROUP == 32 and d3.MAX_SPLITS <= d3.WARPS  # merge slots suffice
    assert set(d3.KERNELS.values()) == set(_build.kernel_names("attention_decode_v3"))
    for (nv, nq), name in d3.KERNELS.items():  # each name instantiates its (NV, NQ)
        assert re.search(rf"{name}\(D3_ARGS\) {{\s*d3_body<{nv}, {nq}>", src), name


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_kernels_compile_without_spilling(arch):
    entries, log = ptxas_entries("attention_decode_v3", arch)
    assert sorted(name for name, _, _ in entries) == sorted(d3.KERNELS.values()), log
    assert all(int(spills) == 0 and int(regs) <= 255 for _, spills, regs in entries), entries


# ---------------------------------------------------------------- the emulation

SHAPES = [  # (Tq, nh, nkv, d, Tk)
    (1, 32, 8, 128, 4100),  # Qwen3-4B decode: GQA 4, 8 splits
    (1, 8, 8, 64, 700),  # MHA: one row per block
    (2, 4, 2, 128, 300),  # two query rows x GQA 2
    (1, 6, 2, 36, 130),  # d = 36: lanes 9.. hold no column; 3 rows
    (4, 2, 2, 128, 97),  # Tq = 4, one head per kv head; a short cache: one split
    (1, 4, 1, 256, 700),  # Gemma 3 270M decode: two float4 slots per lane
    (1, 4, 2, 200, 300),  # d = 200: lanes 18.. hold no second slot
    (3, 4, 2, 64, 260),  # 6 rows: 2 row groups x 4 key warps
    (16, 8, 8, 64, 200),  # MHA verify: 4 row groups x 2 key warps
    (16, 32, 8, 128, 300),  # Qwen3-4B verify: 64 rows, 8 per warp (two quads)
    (16, 4, 1, 256, 300),  # Gemma 3 verify: 64 rows in two row blocks of 32
    (5, 12, 2, 36, 150),  # 30 rows: 8 row groups, the last one partly empty
]


@pytest.mark.parametrize("kind", MASKS + ["empty"])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_emulated_kernel_matches_the_reference(rng, shape, kind):
    Tq, nh, nkv, d, Tk = shape
    q, k, v = _inputs(rng, Tq, nh, nkv, d, Tk)
    spec = make_mask(kind, Tq, Tk, rng)
    if spec is not None:  # garbage in the invalid slots never reaches a row
        k[np.asarray(spec.k_pos) < 0], v[np.asarray(spec.k_pos) < 0] = np.nan, np.inf
    for sm_count in (1, 132):  # one split; several
        out = emulate_decode_v3(q, k, v, spec, 0.1, sm_count=sm_count)
        np.testing.assert_allclose(out, attention(q, k, v, spec, scale=0.1), rtol=1e-10,
                                   atol=1e-12, err_msg=f"{shape} {kind} sm_count={sm_count}")


def test_emulated_kernel_softcap(rng):
    q, k, v = _inputs(rng, 1, 32, 8, 128, 900)
    spec = make_mask("causal", 1, 900, rng)
    out = emulate_decode_v3(3 * q, k, v, spec, 0.2, softcap=5.0)
    np.testing.assert_allclose(out, attention(3 * q, k, v, spec, scale=0.2, softcap=5.0),
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(("shape", "kind"), [((1, 32, 8, 128, 4100), "causal"),
                                             ((1, 32, 8, 128, 32768), "none"),
                                             ((2, 4, 2, 128, 2000), "prefix_window"),
                                             ((1, 6, 2, 36, 700), "tree"),
                                             ((1, 4, 1, 256, 4100), "causal"),
                                             ((16, 32, 8, 128, 1500), "tree"),
                                             ((16, 4, 1, 256, 1000), "causal")], ids=str)
def test_float32_emulation_within_the_stated_tolerance(rng, shape, kind):
    Tq, nh, nkv, d, Tk = shape
    q, k, v = _inputs(rng, Tq, nh, nkv, d, Tk)
    spec = make_mask(kind, Tq, Tk, rng)
    out32 = emulate_decode_v3(*(x.astype(np.float32) for x in (q, k, v)), spec, d ** -0.5)
    assert out32.dtype == np.float32
    assert_close(out32, attention(q, k, v, spec), "float32_attention", op="attention",
                 case=f"emulated v3 float32 {shape} {kind}")


@given(st.data())
def test_emulation_over_shapes(data):
    # keys at whole 64-key strides x splits and one off either side (a split with one key, a
    # stride one short), 1 and 16 query rows, d = 64 / 128 / 256, GQA 1 / 4, both split
    # regimes: a bound off by one, a stride or slot index wrong for one layout, fails here
    S = data.draw(st.integers(1, 8), "splits")
    Tk = max(1, 64 * S + data.draw(st.sampled_from([-1, 0, 1]), "keys - 64 splits"))
    Tq = data.draw(st.sampled_from([1, 16]), "Tq")
    d = data.draw(st.sampled_from([64, 128, 256]), "d")
    nkv, g = data.draw(st.sampled_from([1, 2]), "nkv"), data.draw(st.sampled_from([1, 4]), "g")
    kind = data.draw(st.sampled_from(MASKS + ["empty"]), "mask")
    sm_count = data.draw(st.sampled_from([1, 132]), "sm_count")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), "seed"))
    q, k, v = _inputs(rng, Tq, g * nkv, nkv, d, Tk)
    spec = make_mask(kind, Tq, Tk, rng)
    out = emulate_decode_v3(q, k, v, spec, 0.1, sm_count=sm_count)
    np.testing.assert_allclose(out, attention(q, k, v, spec, scale=0.1), rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------- on a GPU

GPU_SHAPES = SHAPES + [(1, 32, 8, 128, 32768), (1, 16, 4, 128, 8192), (1, 4, 1, 128, 65),
                      (1, 4, 1, 256, 32768), (16, 32, 8, 128, 8192), (16, 4, 1, 256, 8192)]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", MASKS + ["empty"])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
def test_decode_v3_matches_the_reference(rng, shape, kind):
    import cupy as cp

    from kernels_cupy.attention import attention_using

    Tq, nh, nkv, d, Tk = shape
    q, k, v = _inputs(rng, Tq, nh, nkv, d, Tk, np.float32)
    spec = make_mask(kind, Tq, Tk, rng)
    dev = [cp.asarray(x) for x in (q, k, v)]
    expected = attention(q, k, v, spec, scale=0.1)
    for run in range(2):  # the second launch finds its ticket counters back at 0
        got = attention_using("decode_v3", *dev, spec, scale=0.1)
        assert_close(got, expected, "float32_attention", op="attention (decode v3)",
                     case=f"{shape} {kind} run {run}")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 32, 8, 128), (1, 4, 1, 256), (16, 32, 8, 128),
                                   (16, 4, 1, 256), (16, 8, 8, 64)], ids=str)
def test_decode_v3_is_chosen_and_replays_from_a_graph(rng, monkeypatch, shape):
    # decode and 16-row verify, d = 64, 128, 256: "auto" runs v3 (one launch), a graph replays it
    import cupy as cp

    import kernels_cupy.attention as katt
    from kernels_cupy.graphs import capture

    Tq = shape[0]
    q, k, v = (cp.asarray(x) for x in _inputs(rng, *shape, 8192, np.float32))
    host = make_mask("causal", Tq, 8192, rng)
    expected = attention(*(cp.asnumpy(x) for x in (q, k, v)), host)
    # positions on the device, int32: a captured step copies nothing from the host
    spec = MaskSpec(cp.asarray(host.q_pos, cp.int32), cp.asarray(host.k_pos, cp.int32),
                    causal=True)
    launched = []
    real = katt._decode_v3
    monkeypatch.setattr(katt, "_decode_v3", lambda *a: launched.append(1) or real(*a))
    assert_close(katt.attention(q, k, v, spec), expected, "float32_attention", op="auto")
    assert launched  # "auto" ran v3
    replay = capture(lambda: katt.attention_using("decode_v3", q, k, v, spec))
    for _ in range(3):  # no memset, no host sync: each replay is the whole op
        assert_close(replay(), expected, "float32_attention", op="decode v3 (graph)")
