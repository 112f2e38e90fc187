"""The v2 decode / verify attention kernels, checked on the CPU (no GPU needed).

kernels_cupy/attention_decode.py's plan_decode is checked for its invariants (every row in one
block, every key in exactly one split, no empty split, the GPU filled at 512 keys, shared memory
within the device's limits), and :func:`emulate_decode` transcribes
kernels_cupy/cuda/attention_decode.cu's loop into NumPy: the same plan, the same blocks, the
cp.async ring of ``stages`` buffers with its commit groups and wait counts, the mask words kept
per stage, the per-split online softmax over key tiles in the kernel's order (V rows added slot
by slot, ascending), then the log-sum-exp combine. Ring bookkeeping errors (a tile read from the
wrong buffer, a buffer refilled before it was used, a tile used before its group completed) fail
the emulation's assertions; arithmetic errors fail the comparison with the float64 reference
``dflash_ref.ops.attention.attention`` (the mask materialised, a two-pass softmax: an independent
implementation).

Tolerances: float64 emulation vs float64 reference, rtol 1e-10 / atol 1e-12 (the same sums in
another association: ~1e-15 relative; any one-line error in the recurrence is O(1)); the
float32 emulation vs the float64 reference at "float32_attention" (dflash_ref/testing.py), the
tolerance the ``gpu`` tests (tests/kernels/test_attention_decode_gpu.py) hold the kernel to.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from dflash_ref.ops.attention import attention
from dflash_ref.ops.masks import MaskSpec, visible
from dflash_ref.testing import assert_close
from kernels_cupy import _build
from kernels_cupy.attention_decode import (
    BLOCKS_PER_SM,
    DEC_WARPS,
    KERNELS,
    KEY_TILE,
    MAX_SPLITS,
    MAX_STAGES,
    MIN_STAGES,
    VARIANTS,
    decode_shared_bytes,
    plan_decode,
)
from tests.kernels.ptxas import ptxas_entries

SM80 = {"shared_limit": 163 * 1024, "shared_per_sm": 164 * 1024}  # A100
SM86 = {"shared_limit": 99 * 1024, "shared_per_sm": 100 * 1024}  # RTX 30xx / A10
MASKS = ["none", "causal", "window", "tree", "prefix_window", "sym_window"]
# The issue's grid: Tq x Tk x d; GQA ratio and mask cycle over the cases.
GRID = [(Tq, Tk, d) for Tq in (1, 4, 16) for Tk in (1, 31, 32, 33, 512, 4100)
        for d in (64, 128, 256)]


def grid_heads_and_mask(case) -> tuple[int, int, str]:
    """(nh, nkv, mask kind) of a GRID case: GQA 4 (Qwen3-4B), 1 (MHA) and 8 in turn."""
    Tq, Tk, d = case
    nh, nkv = [(32, 8), (8, 8), (16, 2)][(Tq + Tk + d) % 3]
    return nh, nkv, MASKS[(Tq * 7 + Tk * 3 + d) % len(MASKS)]


def make_mask(kind: str, Tq: int, Tk: int, rng) -> MaskSpec | None:
    """A MaskSpec of ``kind`` for Tq queries at the end of Tk slots, ~5% of slots invalid."""
    k_pos = np.arange(Tk, dtype=np.int64)
    k_pos[rng.random(Tk) < 0.05] = -1
    base = max(Tk - Tq, 0)
    q_pos = np.arange(base, base + Tq, dtype=np.int64)
    if kind == "none":
        return None
    if kind == "causal":
        return MaskSpec(q_pos, k_pos, causal=True)
    if kind == "window":
        return MaskSpec(q_pos, k_pos, causal=True, window=40)
    if kind == "tree":
        return MaskSpec(q_pos, k_pos, causal=False, base_pos=base,
                        ancestors=rng.random((Tq, Tk)) < 0.5)
    if kind == "prefix_window":
        return MaskSpec(q_pos, k_pos, causal=True, base_pos=base, window=100)
    if kind == "sym_window":
        return MaskSpec(q_pos, k_pos, causal=False, window=20, window_mode="bidirectional")
    if kind == "empty":
        return MaskSpec(q_pos, np.full(Tk, -1), causal=True)
    raise ValueError(kind)


# ---------------------------------------------------------------- the plan

PLAN_CASES = [
    # (Tq, nh, nkv, d, Tk): Qwen3-4B decode / verify, drafter, MHA, d = 256, awkward
    (1, 32, 8, 128, 512), (1, 32, 8, 128, 32768), (16, 32, 8, 128, 4096), (4, 16, 2, 256, 4100),
    (16, 32, 8, 256, 40000), (63, 7, 7, 1, 1), (5, 64, 2, 200, 777), (1, 1, 1, 256, 100000),
    (16, 64, 4, 97, 33), (2, 6, 3, 66, 31),
]


@pytest.mark.parametrize("case", PLAN_CASES, ids=str)
@pytest.mark.parametrize("sm_count", [1, 108, 132])
@pytest.mark.parametrize("device", [{}, SM80], ids=["sm90", "sm80"])
def test_plan_covers_every_row_and_key_once(case, sm_count, device):
    Tq, nh, nkv, d, Tk = case
    p = plan_decode(Tq, nh, nkv, d, Tk, sm_count, **device)
    gx, gy, gz = p["grid"]
    rows = Tq * (nh // nkv)
    assert 1 <= p["R"] <= DEC_WARPS * p["rpw"]  # every block row has a (warp, slot)
    assert gx * p["R"] >= rows > (gx - 1) * p["R"]  # every row in one block, no empty block
    assert gy == nkv and gz == p["n_splits"] <= MAX_SPLITS
    kps = p["keys_per_split"]
    starts = [z * kps for z in range(gz)]
    assert starts[-1] < Tk <= starts[-1] + kps  # every key in exactly one split, none empty
    assert kps % KEY_TILE == 0 or kps < KEY_TILE  # whole tiles, except one short tile
    assert MIN_STAGES <= p["stages"] <= MAX_STAGES
    assert p["ld"] == (d + 4 if d % 4 == 0 else d + 1) and p["vec4"] == (d % 4 == 0)
    assert p["shared_mem"] == decode_shared_bytes(p["R"], d, p["ld"], p["stages"])
    assert p["shared_mem"] <= device.get("shared_limit", 227 * 1024)
    assert p["kernel"] == KERNELS[(128 if d <= 128 else 256, p["vec4"])]
    assert gx < 2**31 and gz <= 65535


def test_one_block_serves_a_whole_gqa_group():
    # Qwen3-4B (32 / 8 heads of 128): decode, 4 rows and a 16-token verify, 64 rows, both in one
    # block per kv head, so each K/V tile is read once per kv head and split.
    for Tq in (1, 4, 16):
        p = plan_decode(Tq, 32, 8, 128, 4096, 132)
        assert p["grid"][0] == 1 and p["R"] == Tq * 4


def test_grid_fills_the_gpu_at_512_keys():
    for sm_count in (108, 132):
        p = plan_decode(1, 32, 8, 128, 512, sm_count)
        blocks = math.prod(p["grid"])
        assert blocks >= sm_count  # every SM has work (v1: 16 blocks)
        assert blocks >= 0.9 * BLOCKS_PER_SM * sm_count
    # Long contexts: BLOCKS_PER_SM per SM, splits of whole tiles.
    p = plan_decode(1, 32, 8, 128, 32768, 132)
    assert math.prod(p["grid"]) >= 0.9 * BLOCKS_PER_SM * 132
    assert p["keys_per_split"] % KEY_TILE == 0


def test_stages_and_two_blocks_per_sm_on_sm90():
    # Decode d = 128: three stages (two tiles in flight while one is used), two blocks per SM.
    p = plan_decode(1, 32, 8, 128, 32768, 132)
    assert p["stages"] == 3 and 2 * (p["shared_mem"] + 1024) <= 228 * 1024
    # A 16-token verify holds 64 query rows: still >= 2 stages and two blocks per SM.
    p = plan_decode(16, 32, 8, 128, 4096, 132)
    assert p["stages"] >= 2 and 2 * (p["shared_mem"] + 1024) <= 228 * 1024


def test_small_shared_memory_halves_the_rows_or_refuses():
    # sm_86 / sm_89 (99 KiB per block): d = 128 fits; d = 256 needs more than 99 KiB for two
    # stages of K and V alone, so the plan refuses and the wrapper falls back to v1.
    assert plan_decode(16, 32, 8, 128, 4096, 84, **SM86)["stages"] >= 2
    with pytest.raises(ValueError, match="shared memory"):
        plan_decode(1, 16, 2, 256, 4096, 84, **SM86)
    # sm_80: d = 256 fits, with the rows of a 16-token verify split over blocks if needed.
    p = plan_decode(16, 16, 2, 256, 4096, 108, **SM80)
    assert p["shared_mem"] <= SM80["shared_limit"] and p["stages"] == 2


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="d % 4"):
        plan_decode(1, 4, 2, 66, 100, 132, vec4=True)
    with pytest.raises(ValueError, match="head dim"):
        plan_decode(1, 4, 2, 300, 100, 132)
    with pytest.raises(ValueError, match="kv heads"):
        plan_decode(1, 6, 4, 64, 100, 132)


def test_constants_match_the_cuda_source():
    src = (_build.CUDA_DIR / "attention_decode.cu").read_text()
    for name, value in (("DEC_WARPS", DEC_WARPS), ("DEC_KT", KEY_TILE),
                        ("DEC_MAX_STAGES", MAX_STAGES), ("DEC_MAX_SPLITS", MAX_SPLITS)):
        assert f"#define {name} {value}" in src, name
    # (RPW, DC) of each instantiation: rows per warp and ceil(d / 32) accumulators per lane.
    for (dmax, rpw) in VARIANTS:
        for vec4 in (False, True):
            name = KERNELS[(dmax, vec4)]
            body = re.search(rf"void DEC_BOUNDS {name}\(DEC_PARAMS\) {{\n\s+(.*)", src).group(1)
            assert body == f"attention_decode_body<{str(vec4).lower()}, {rpw}, {dmax // 32}>" \
                "(DEC_ARGS);", name
    assert set(_build.kernel_names("attention_decode")) == {*KERNELS.values(),
                                                           "attention_decode_combine_f32"}
    # cp.async.wait_group takes an immediate: the source spells out 0 .. MAX_STAGES - 2.
    for n in range(MAX_STAGES - 1):
        assert f"cp.async.wait_group {n};" in src


@pytest.mark.parametrize("d", [1, 4, 64, 66, 97, 128, 200, 256])
def test_tile_copies_cover_k_and_v_once_and_stay_aligned(d):
    # dec_issue_tile: thread t issues idx = t, t + 256, ... < 2 * KT * w (w copies per row:
    # d / 4 float4 or d floats); idx < KT * w is K. Every element of both tiles exactly once.
    vec4 = d % 4 == 0
    ld = d + 4 if vec4 else d + 1
    w, width = (d // 4, 4) if vec4 else (d, 1)
    seen = {}
    for tid in range(DEC_WARPS * 32):
        for idx in range(tid, 2 * KEY_TILE * w, DEC_WARPS * 32):
            which = int(idx >= KEY_TILE * w)
            jj, c = divmod(idx - which * KEY_TILE * w, w)
            dst = jj * ld + width * c
            assert dst * 4 % (4 * width) == 0  # cp.async dst aligned to its size
            for e in range(width):
                assert (which, dst + e) not in seen
                seen[(which, dst + e)] = (jj, width * c + e)
    assert sorted(seen) == sorted((x, j * ld + c) for x in (0, 1) for j in range(KEY_TILE)
                                  for c in range(d))
    assert all(seen[(x, j * ld + c)] == (j, c) for x in (0, 1) for j in range(KEY_TILE)
               for c in range(d))


# ---------------------------------------------------------------- the kernel's loop in NumPy


def emulate_decode(q, k, v, spec, scale, softcap=None, sm_count=132, **device):
    """attention_decode_* then attention_decode_combine_f32, block by block, in NumPy.

    The kv heads of one (row chunk, split) run together (their control flow is the same: the
    mask depends on the row's query i, not on its head). Arithmetic in q's dtype. Returns
    (out [Tq, nh, d], counters: tiles, loaded, barriers)."""
    dt = q.dtype.type
    Tq, nh, d = q.shape
    Tk, nkv, _ = k.shape
    g = nh // nkv
    p = plan_decode(Tq, nh, nkv, d, Tk, sm_count, **device)
    R, kps, S, nst = p["R"], p["keys_per_split"], p["n_splits"], p["stages"]
    vis = visible(spec) if spec is not None else np.ones((Tq, Tk), bool)  # [Tq, Tk]
    part_o = np.full((S, Tq * nh, d), np.nan, dt)  # NaN: an unwritten row fails loudly
    part_ml = np.full((S, Tq * nh, 2), np.nan, dt)
    out = np.full((Tq, nh, d), np.nan, dt)
    count = {"tiles": 0, "loaded": 0, "barriers": 0}
    for bx in range(p["grid"][0]):
        rg = bx * R + np.arange(R)  # block rows; row r <-> warp r % 8, slot r // 8
        assert ((rg % R) % DEC_WARPS + DEC_WARPS * ((rg % R) // DEC_WARPS) == rg % R).all()
        row_ok = rg < Tq * g
        i = np.where(row_ok, rg // g, 0)  # query row
        hh = rg % g  # head within the group
        heads = np.arange(nkv)[:, None] * g + hh[None, :]  # [nkv, R] query head of each row
        Q = q[i[None, :], heads] * row_ok[None, :, None]  # sQ [nkv, R, d], 0 past the end
        for z in range(S):
            j_begin, j_end = z * kps, min(Tk, (z + 1) * kps)
            n_tiles = -(-(j_end - j_begin) // KEY_TILE)

            def mask_words(t, j_begin=j_begin, j_end=j_end, row_ok=row_ok, i=i):
                cols = j_begin + t * KEY_TILE + np.arange(KEY_TILE)
                inside = cols < j_end
                return row_ok[:, None] & inside[None, :] & vis[i][:, np.minimum(cols, Tk - 1)]

            def copies(t, j_begin=j_begin, j_end=j_end):  # zero-filled past the split
                cols = j_begin + t * KEY_TILE + np.arange(KEY_TILE)
                inside = (cols < j_end)[None, :, None]
                kt = np.where(inside, k[np.minimum(cols, Tk - 1)].transpose(1, 0, 2), 0)
                vt = np.where(inside, v[np.minimum(cols, Tk - 1)].transpose(1, 0, 2), 0)
                return kt.astype(dt), vt.astype(dt)  # [nkv, KT, d] each

            stage = [None] * nst  # (tile, K, V) each buffer holds
            words = [None] * nst  # (tile, mask words [R, KT]) of sBits
            groups = []  # commit groups in order: the tile each copies, or None (empty)
            done = 0  # how many groups are complete for every thread
            m = np.full((nkv, R), -np.inf, dt)
            l = np.zeros((nkv, R), dt)
            acc = np.zeros((nkv, R, d), dt)

            def issue(t, b, stage=stage, groups=groups, n_tiles=n_tiles, copies=copies):
                """One commit group; the copies only if some row of the block sees tile t."""
                if b.any():
                    old = stage[t % nst]
                    assert old is None or old[0] <= t - nst, "a buffer refilled before its use"
                    stage[t % nst] = (t, *copies(t))
                    count["loaded"] += t < n_tiles
                groups.append(t if b.any() else None)

            for t in range(nst - 1):  # prologue
                b = mask_words(t)
                words[t % nst] = (t, b)
                count["barriers"] += 1
                issue(t, b)
            for t in range(n_tiles):
                count["tiles"] += 1
                tn = t + nst - 1
                bn = mask_words(tn)
                assert words[tn % nst] is None or words[tn % nst][0] == t - 1  # used at t - 1
                words[tn % nst] = (tn, bn)
                done = max(done, len(groups) - (nst - 2))  # cp.async.wait_group(stages - 2)
                count["barriers"] += 1  # __syncthreads_or
                issue(tn, bn)
                wt, b = words[t % nst]
                assert wt == t
                if not b.any():
                    continue  # every warp skips (and the block did not load it)
                assert t in groups[:done], "tile used before its copies landed"
                st, kt, vt = stage[t % nst]
                assert st == t, "tile read from the wrong buffer"
                seen = b.any(axis=1)  # rows with a visible slot here, [R]
                sc = np.einsum("hrd,hjd->hrj", Q, kt) * dt(scale)  # lane j: q . k_j
                if softcap:
                    sc = dt(softcap) * np.tanh(sc / dt(softcap))
                x = np.where(b[None], sc, -np.inf)
                # fmaxf drops NaN; att_softmax_shift: 0 while the max is -inf
                m_new = np.where(seen, np.fmax(m, np.fmax.reduce(x, axis=2, initial=-np.inf)), m)
                sh = np.where(m_new == -np.inf, 0, m_new).astype(dt)
                with np.errstate(invalid="ignore", over="ignore"):
                    corr = np.where(seen, np.exp(m - sh), 1)  # 0 when m was -inf
                    pr = np.where(b[None], np.exp(x - sh[..., None]), 0).astype(dt)
                    l = np.where(seen, l * corr + pr.sum(axis=2), l)
                    acc = acc * corr[..., None]
                    for jj in np.flatnonzero(b.any(axis=0)):  # slots ascending; a row only its own
                        acc = np.where(b[None, :, jj, None],
                                       acc + pr[:, :, jj, None] * vt[:, None, jj, :], acc)
                m = m_new
            orow = (i[None, :] * nh + heads)[:, row_ok]  # [nkv, rows] rows of out / part_*
            if S == 1:
                inv = np.where(l > 0, 1 / np.where(l > 0, l, 1), 0).astype(dt)
                with np.errstate(invalid="ignore"):
                    out.reshape(Tq * nh, d)[orow] = (acc * inv[..., None])[:, row_ok]
            else:
                part_o[z][orow] = acc[:, row_ok]
                part_ml[z][orow] = np.stack([m, l], axis=-1)[:, row_ok]
    if S > 1:  # attention_decode_combine_f32, per (i, h) row
        ms, ls = part_ml[..., 0], part_ml[..., 1]  # [S, Tq * nh]
        full = ls != 0  # mass; a NaN l counts
        M = np.fmax.reduce(np.where(full, ms, -np.inf), axis=0)
        M = np.where(M == -np.inf, 0, M)  # att_softmax_shift
        with np.errstate(invalid="ignore", over="ignore"):
            w = np.where(full, np.exp(ms - M), 0).astype(dt)  # [S, rows]
            L = np.zeros(Tq * nh, dt)
            o = np.zeros((Tq * nh, d), dt)
            for z in range(S):  # s ascending, every split (w = 0 still multiplies acc)
                L = L + ls[z] * w[z]
                o = o + w[z][:, None] * part_o[z]
            inv = np.where(L != 0, 1 / np.where(L != 0, L, 1), 0).astype(dt)
            out = (o * inv[:, None]).reshape(Tq, nh, d)
    return out, count


def _inputs(rng, Tq, nh, nkv, d, Tk, dtype=np.float64):
    q = rng.standard_normal((Tq, nh, d))
    k = rng.standard_normal((Tk, nkv, d))
    v = rng.standard_normal((Tk, nkv, d))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


@pytest.mark.parametrize("case", GRID, ids=str)
def test_emulated_kernel_matches_the_reference(rng, case):
    Tq, Tk, d = case
    nh, nkv, kind = grid_heads_and_mask(case)
    q, k, v = _inputs(rng, Tq, nh, nkv, d, Tk)
    spec = make_mask(kind, Tq, Tk, rng)
    out, count = emulate_decode(q, k, v, spec, 0.1)
    np.testing.assert_allclose(out, attention(q, k, v, spec, scale=0.1), rtol=1e-10,
                               atol=1e-12, err_msg=f"{case} {nh}/{nkv} {kind}")
    p = plan_decode(Tq, nh, nkv, d, Tk, 132)
    blocks = p["grid"][0] * p["n_splits"]  # (row chunk, split) pairs; kv heads run together
    assert count["barriers"] == count["tiles"] + blocks * (p["stages"] - 1)  # one per tile
    assert count["loaded"] <= count["tiles"]


@pytest.mark.parametrize("kind", MASKS + ["empty"])
@pytest.mark.parametrize(("shape", "sm_count", "device"), [
    ((1, 32, 8, 128, 4100), 132, {}),  # Qwen3-4B decode: 3 stages, many splits
    ((16, 32, 8, 128, 777), 1, {}),  # one split: a long tile loop through the ring
    ((16, 64, 4, 128, 200), 132, {}),  # 256 rows: 4 row chunks per kv head
    ((3, 16, 2, 256, 1000), 1, SM80),  # d = 256 on an A100: two stages
    ((5, 12, 4, 66, 300), 8, {}),  # the scalar kernel (d % 4 != 0)
    ((2, 6, 3, 97, 65), 132, SM86),  # short splits, a small device
], ids=str)
def test_emulated_kernel_every_mask_and_layout(rng, shape, sm_count, device, kind):
    Tq, nh, nkv, d, Tk = shape
    q, k, v = _inputs(rng, Tq, nh, nkv, d, Tk)
    spec = make_mask(kind, Tq, Tk, rng)
    out, count = emulate_decode(q, k, v, spec, 0.1, sm_count=sm_count, **device)
    np.testing.assert_allclose(out, attention(q, k, v, spec, scale=0.1), rtol=1e-10,
                               atol=1e-12, err_msg=f"{shape} {kind}")
    if kind == "empty":
        assert count["loaded"] == 0 and not out.any()  # no K/V traffic, zeros
    if kind == "window" and Tk > 300:
        assert count["loaded"] < count["tiles"]  # tiles outside the window are not loaded


def test_emulated_kernel_softcap_and_nan_in_invisible_slots(rng):
    Tq, nh, nkv, d, Tk = 4, 16, 4, 128, 700
    q, k, v = _inputs(rng, Tq, nh, nkv, d, Tk)
    q *= 3
    spec = make_mask("causal", Tq, Tk, rng)
    out, _ = emulate_decode(q, k, v, spec, 0.2, softcap=5.0)
    np.testing.assert_allclose(out, attention(q, k, v, spec, scale=0.2, softcap=5.0),
                               rtol=1e-10, atol=1e-12)
    bad = np.flatnonzero(np.asarray(spec.k_pos) < 0)
    k[bad], v[bad] = np.nan, np.nan  # an invalid pool slot holding NaN never reaches the output
    out, _ = emulate_decode(q, k, v, spec, 0.2, softcap=5.0)
    assert np.isfinite(out).all()


@pytest.mark.parametrize(("Tq", "nh", "nkv", "d", "Tk", "kind"), [
    (1, 32, 8, 128, 4100, "causal"), (16, 32, 8, 128, 4100, "prefix_window"),
    (4, 16, 2, 256, 4100, "tree"), (16, 8, 8, 64, 512, "none"),
])
def test_float32_emulation_within_the_stated_tolerance(rng, Tq, nh, nkv, d, Tk, kind):
    # The kernel's order in float32 against the float64 reference: the tolerance the gpu tests
    # hold attention_decode_* to ("float32_attention").
    q, k, v = _inputs(rng, Tq, nh, nkv, d, Tk)
    spec = make_mask(kind, Tq, Tk, rng)
    out32, _ = emulate_decode(*(x.astype(np.float32) for x in (q, k, v)), spec, d ** -0.5)
    assert out32.dtype == np.float32
    assert_close(out32, attention(q, k, v, spec), "float32_attention", op="attention",
                 case=f"emulated float32 {Tq, nh, nkv, d, Tk} {kind}")


def test_kernels_fit_two_blocks_per_sm_without_spilling():
    # __launch_bounds__(256, 2) caps the registers at 128 (two blocks of 256 threads per SM, as
    # the plan's shared memory assumes); ptxas must not meet the cap by spilling to local memory.
    entries, log = ptxas_entries("attention_decode")
    assert {name for name, _, _ in entries} >= set(KERNELS.values()), log
    for name, spills, regs in entries:
        assert int(spills) == 0 and int(regs) <= 128, (name, spills, regs)


def test_split_key_epilogue_lives_once_in_common_cuh():
    # attention_fwd_* (attention.cu) and attention_decode_* (attention_decode.cu) write their rows
    # (out = acc / l, or a split's acc and (m, l)) through one templated function of common.cuh;
    # a copy pasted back into either kernel would let the two drift apart.
    partial_write = "part_ml[prow * 2 + 1] = l[s];"
    texts = {p.name: p.read_text() for p in (_build.CUDA_DIR / n for n in (
        "common.cuh", "attention.cu", "attention_decode.cu"))}
    assert [name for name, text in texts.items() if partial_write in text] == ["common.cuh"]
    for name in ("attention.cu", "attention_decode.cu"):
        assert texts[name].count("dfr_attention_write_rows<") == 1, name
