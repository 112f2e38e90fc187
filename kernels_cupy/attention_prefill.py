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
# grid, keeps more SMs busy). Both are to be set from scripts/gpu_report.py's "attention kernel
# threshold" rows, which time both kernels around them on the GPU.
MIN_QUERY_ROWS = 64
MIN_BLOCKS_PER_SM = 1.0


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
