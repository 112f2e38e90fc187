"""The launch plan of the prefill attention kernels and the rule that selects them (pure: no CuPy).

``attention_prefill_*`` in cuda/attention.cu serve many query rows (prefill, a long verify): a
block owns a tile of BQ consecutive query rows of one query head and streams the K/V tiles of its
kv head through shared memory once for all of them, so K and V are read ceil(Tq / BQ) times per
query head, where the decode kernel (``attention_fwd_*``, 16 (query, head) rows per block for
d <= 128, 8 above) reads them Tq * g / 16 times per kv head, four times as often. The per-row
arithmetic is the decode kernel's, in the same order (FP32 CUDA cores, no tensor cores):
docs/attention.md, "The prefill kernel".

:func:`choose_kernel` is the selection rule used by ``kernels_cupy.attention.attention``;
:func:`plan_prefill` gives the geometry. Both are tested on CPU
(tests/kernels/test_attention_prefill.py).

v2 (``attention_prefill_v2_f32`` in cuda/attention_prefill.cu; :func:`plan_prefill_v2`, emulated
in tests/kernels/test_attention_prefill_v2.py): 64 query rows of one head per block as in v1,
but register-tiled (each thread a 4 x 2 tile of scores and 4 rows x 8 columns of the output)
and fed by a cp.async ring of K/V tiles; the same per-row arithmetic in the same order. Where
the shape takes a prefill kernel, ``attention`` runs v2 when :data:`PREFILL_V2` is set and
:func:`v2_fits` (d % 4 == 0, d <= 128, 16-byte aligned), v1 otherwise.
"""

from __future__ import annotations

import math

# Must match attention.cu.
PF_WARPS = 8  # PF_WARPS: threads per block = 256
KEY_TILE = 32  # ATT_KT: one key slot per lane
# (largest head dim, rows per warp) of the two instantiations: BQ = PF_WARPS * rows per warp
# query rows per block. Rows per warp x ceil(d / 32) accumulators per lane = 32 registers in
# both; d > 128 takes fewer rows because its query tile would not fit 96 KiB with K and V.
VARIANTS = ((128, 8), (256, 4))
KERNELS = {  # (largest head dim, vec4) -> kernel name
    (128, False): "attention_prefill_d128_f32",
    (128, True): "attention_prefill_d128_vec4_f32",
    (256, False): "attention_prefill_d256_f32",
    (256, True): "attention_prefill_d256_vec4_f32",
}
# The selection rule's two thresholds (plan parameters of :func:`choose_kernel`, read at call
# time): at least MIN_QUERY_ROWS query rows (one full 64-row query tile), and a grid of at least
# MIN_BLOCKS_PER_SM blocks per SM (below that the decode kernel, which splits the keys of a small
# grid, keeps more SMs busy). Set from scripts/gpu_report.py's "attention kernel threshold" rows
# (docs/performance.md, NVIDIA H200, 32 query / 8 KV heads of 128 after 4096 keys): decode v2 is
# fastest at 64 rows (1.04 ms against prefill v2's 1.73; a grid of 32 blocks = 0.24 per SM),
# prefill v2 from 128 rows (1.76 ms against 1.98; 64 blocks = 0.48 per SM), so the cut lies
# between 0.24 and 0.48 blocks per SM (it was 1.0 before v2, when the v1 prefill kernel lost at
# 256 rows).
MIN_QUERY_ROWS = 64
MIN_BLOCKS_PER_SM = 0.4


def prefill_shared_bytes(BQ: int, d: int, ld: int, kv_bufs: int) -> int:
    """Dynamic shared memory: sQ [BQ, d] + kv_bufs x [KEY_TILE, ld] (K, then V or K and V)."""
    return (BQ * d + kv_bufs * KEY_TILE * ld) * 4


def plan_prefill(Tq: int, nh: int, nkv: int, d: int, Tk: int, shared_limit: int,
                 vec4: bool | None = None) -> dict:
    """The launch geometry of ``attention_prefill_*`` (pure: tested on CPU).

    ``vec4`` (default: ``d % 4 == 0``) selects the float4 kernel; the caller also needs q, k, v
    16-byte aligned (``kernels_cupy.attention.can_use_vec4``). Returns a dict with kernel (name),
    rpw (query rows per warp), BQ (query rows per block), dc (accumulators per lane: d <= 32 dc),
    grid (x, y, z) = (ceil(Tq / BQ), nh, 1), vec4, ld (shared row stride of K and V in floats:
    d + 4 with float4, else d + 1), kv_bufs (2: K and V in their own buffers, 2 barriers per
    loaded key tile; 1: V reuses K's buffer, 4 barriers) and shared_mem (bytes).

    Raises:
        ValueError: d outside 1..256, float4 asked for with d % 4 != 0, or no layout within
            ``shared_limit``.
    """
    vec4 = d % 4 == 0 if vec4 is None else vec4
    if vec4 and d % 4:
        raise ValueError(f"plan_prefill: the float4 kernel needs d % 4 == 0, got d={d}")
    if nkv < 1 or nh % nkv:
        raise ValueError(f"plan_prefill: {nh} query heads cannot share {nkv} kv heads")
    variant = next(((dmax, rpw) for dmax, rpw in VARIANTS if 1 <= d <= dmax), None)
    if variant is None:
        raise ValueError(f"plan_prefill: head dim {d} outside 1..{VARIANTS[-1][0]}")
    dmax, rpw = variant
    BQ = PF_WARPS * rpw
    ld = d + 4 if vec4 else d + 1
    kv_bufs = 2
    while kv_bufs > 1 and prefill_shared_bytes(BQ, d, ld, kv_bufs) > shared_limit:
        kv_bufs -= 1
    shared_mem = prefill_shared_bytes(BQ, d, ld, kv_bufs)
    if shared_mem > shared_limit:
        raise ValueError(f"attention (prefill): head dim {d} needs {shared_mem} bytes of shared "
                         f"memory per block, more than this device's {shared_limit}")
    return {
        "kernel": KERNELS[(dmax, vec4)], "rpw": rpw, "BQ": BQ, "dc": dmax // 32,
        "grid": (max(1, math.ceil(Tq / BQ)), nh, 1), "vec4": vec4, "ld": ld,
        "kv_bufs": kv_bufs, "shared_mem": shared_mem,
    }


def choose_kernel(Tq: int, nh: int, nkv: int, d: int, Tk: int, sm_count: int, shared_limit: int,
                  vec4: bool | None = None, min_query_rows: int | None = None,
                  min_blocks_per_sm: float | None = None) -> str:
    """"prefill" or "decode": which kernel ``kernels_cupy.attention.attention`` runs.

    The prefill kernel when Tq >= ``min_query_rows``, its plan fits ``shared_limit`` and its
    grid has at least ``min_blocks_per_sm * sm_count`` blocks; the decode kernel otherwise
    (decode, drafter blocks, 16-token verify, short prompts, few heads: it splits the keys of a
    small grid over the SMs, which the prefill kernel never does). The thresholds default to
    :data:`MIN_QUERY_ROWS` and :data:`MIN_BLOCKS_PER_SM`, read at call time.
    """
    min_rows = MIN_QUERY_ROWS if min_query_rows is None else min_query_rows
    per_sm = MIN_BLOCKS_PER_SM if min_blocks_per_sm is None else min_blocks_per_sm
    if Tq < min_rows or Tk == 0:
        return "decode"
    try:
        plan = plan_prefill(Tq, nh, nkv, d, Tk, shared_limit, vec4)
    except ValueError:
        return "decode"
    gx, gy, _ = plan["grid"]
    return "prefill" if gx * gy >= per_sm * sm_count else "decode"


# ---------------------------------------------------------------- v2 (attention_prefill.cu)

# Must match attention_prefill.cu.
PF2_BQ, PF2_BK, PF2_TX = 64, 32, 16  # query rows per block, keys per step, block (16, 16)
PF2_MAX_D, PF2_MAX_STAGES, PF2_LDP = 128, 3, 36  # head dim limit, ring depth, p-tile stride
KERNEL_V2 = "attention_prefill_v2_f32"
# Plan parameters, read at call time: run v2 where it fits (False: always v1), and the blocks per
# SM the ring depth must leave room for (a deeper ring overlaps more loads, two blocks per SM
# overlap one block's barriers with the other's arithmetic; to be settled by the
# "attention kernel threshold" rows of scripts/gpu_report.py).
PREFILL_V2 = True
PF2_BLOCKS_PER_SM = 2
RESERVED_PER_BLOCK = 1024  # shared memory the driver reserves per resident block (sm_80+)


def v2_fits(d: int, vec4: bool) -> bool:
    """Can ``attention_prefill_v2_f32`` take head dim ``d`` (float4 rows, 4 columns x 2 per
    thread)? ``vec4``: d % 4 == 0 and q, k, v 16-byte aligned (``can_use_vec4``)."""
    return vec4 and d % 4 == 0 and 1 <= d <= PF2_MAX_D


def prefill_v2_shared_bytes(d: int, stages: int) -> int:
    """Dynamic shared memory of v2: sQ [64, d] + stages x {K, V} [32, d + 4] + p [64, 36]."""
    return 4 * (PF2_BQ * d + stages * 2 * PF2_BK * (d + 4) + PF2_BQ * PF2_LDP)


def plan_prefill_v2(Tq: int, nh: int, nkv: int, d: int, optin: int, shared_per_sm: int,
                    vec4: bool = True, blocks_per_sm: int | None = None) -> dict:
    """The launch of ``attention_prefill_v2_f32`` (pure: tested on CPU).

    Ring depth: the deepest (<= PF2_MAX_STAGES) whose shared memory lets ``blocks_per_sm``
    blocks (default :data:`PF2_BLOCKS_PER_SM`) share an SM of ``shared_per_sm`` bytes, else the
    deepest within the per-block opt-in limit ``optin``. Returns kernel, grid (ceil(Tq / 64),
    nh, 1), block (16, 16, 1), stages, shared_mem.

    Raises:
        ValueError: d not float4-able or over 128 (run v1), heads that cannot share kv heads, or
            no ring depth within ``optin``.
    """
    if not v2_fits(d, vec4):
        raise ValueError(f"plan_prefill_v2: needs d % 4 == 0, d <= {PF2_MAX_D} and 16-byte "
                         f"aligned q, k, v; got d={d}, vec4={vec4}: use the v1 prefill kernel")
    if nkv < 1 or nh % nkv:
        raise ValueError(f"plan_prefill_v2: {nh} query heads cannot share {nkv} kv heads")
    per_sm = PF2_BLOCKS_PER_SM if blocks_per_sm is None else blocks_per_sm
    fits = [s for s in range(PF2_MAX_STAGES, 0, -1) if prefill_v2_shared_bytes(d, s) <= optin]
    if not fits:
        raise ValueError(f"attention (prefill v2): head dim {d} needs "
                         f"{prefill_v2_shared_bytes(d, 1)} bytes of shared memory per block, "
                         f"more than this device's {optin}")
    shared = [s for s in fits
              if per_sm * (prefill_v2_shared_bytes(d, s) + RESERVED_PER_BLOCK) <= shared_per_sm]
    stages = (shared or fits)[0]
    return {"kernel": KERNEL_V2, "grid": (max(1, math.ceil(Tq / PF2_BQ)), nh, 1),
            "block": (PF2_TX, PF2_TX, 1), "stages": stages,
            "shared_mem": prefill_v2_shared_bytes(d, stages)}
