"""The launch plan of the decode / verify attention kernels (v2; pure: no CuPy).

``attention_decode_*`` in cuda/attention_decode.cu serve few query rows (a decode step, a
16-token verify, a drafter block): one block takes a whole GQA group (every query row i and
every query head of one kv head: ``Tq * g`` "rows", in chunks of at most ``R_MAX``), so each K/V
tile is read from global memory once per kv head and key split. The keys are split across
blocks until the grid holds ``BLOCKS_PER_SM`` blocks per SM (flash-decoding), and
``attention_decode_combine_f32`` merges the splits by log-sum-exp. Inside a block K/V tiles of
``KEY_TILE`` keys stream through a ring of ``stages`` shared-memory buffers with ``cp.async``:
the load of tile t + stages - 1 is issued before tile t is scored, so up to ``stages - 1``
tiles are in flight while one is used. docs/attention.md, "The decode kernel (v2)".

:func:`plan_decode` gives the geometry; ``kernels_cupy.attention`` launches it. Both the plan
and a NumPy emulation of the kernel's loop are tested on CPU
(tests/kernels/test_attention_decode_plan.py).
"""

from __future__ import annotations

import functools
import math

# Must match attention_decode.cu.
DEC_WARPS = 8  # DEC_WARPS: threads per block = 256
KEY_TILE = 32  # DEC_KT: one key slot per lane
# (largest head dim, rows per warp) of the two instantiations: a block holds up to
# R_MAX = DEC_WARPS * rows per warp rows; rows per warp x ceil(d / 32) accumulators per lane
# = 32 registers in both.
VARIANTS = ((128, 8), (256, 4))
KERNELS = {  # (largest head dim, vec4) -> kernel name
    (128, False): "attention_decode_d128_f32",
    (128, True): "attention_decode_d128_vec4_f32",
    (256, False): "attention_decode_d256_f32",
    (256, True): "attention_decode_d256_vec4_f32",
}
COMBINE_THREADS = 128
MAX_STAGES = 4  # DEC_MAX_STAGES: cp.async.wait_group takes an immediate, 0..MAX_STAGES - 2
MIN_STAGES = 2  # one tile in flight while one is used: never fewer

# The split rule: enough (kv head, row chunk, key split) blocks for BLOCKS_PER_SM per SM, no
# split shorter than MIN_KEYS_PER_SPLIT keys (a split costs a partial row write and its share
# of the combine), at most MAX_SPLITS (the combine kernel's shared weights, DEC_MAX_SPLITS).
BLOCKS_PER_SM = 2
MIN_KEYS_PER_SPLIT = 16
MAX_SPLITS = 256
# Per-SM shared memory reserved by the driver per resident block (sm_80 / sm_90: 1 KiB).
RESERVED_PER_BLOCK = 1024
# Device defaults for the plan tests: an H100 / H200 (sm_90).
SM90_SHARED_OPTIN = 227 * 1024
SM90_SHARED_PER_SM = 228 * 1024


def decode_shared_bytes(rows: int, d: int, ld: int, stages: int) -> int:
    """Dynamic shared memory: stages x (K, V) [KEY_TILE, ld], sQ [rows, d], the mask words
    sBits [stages, rows] (uint32)."""
    return (stages * 2 * KEY_TILE * ld + rows * d + stages * rows) * 4


@functools.lru_cache(maxsize=4096)
def plan_decode(Tq: int, nh: int, nkv: int, d: int, Tk: int, sm_count: int,
                vec4: bool | None = None, shared_limit: int = SM90_SHARED_OPTIN,
                shared_per_sm: int = SM90_SHARED_PER_SM) -> dict:
    """The launch geometry of ``attention_decode_*`` (pure, cached: called per launch).

    Args:
        Tq, nh, nkv, d, Tk: q [Tq, nh, d], k / v [Tk, nkv, d] (Tq, Tk >= 1).
        sm_count: SMs of the device; the split count fills BLOCKS_PER_SM blocks per SM.
        vec4: the float4 / 16-byte cp.async kernel (default ``d % 4 == 0``); the caller also
            needs q, k, v 16-byte aligned (``kernels_cupy.attention.can_use_vec4``).
        shared_limit: the largest dynamic shared memory of one block (the device's opt-in).
        shared_per_sm: shared memory of one SM; the plan prefers a layout that lets
            BLOCKS_PER_SM blocks share an SM, with as many stages (<= MAX_STAGES) as fit.

    Returns a dict: kernel (name), rpw (rows per warp, the instantiation's), rows (Tq * g),
    R (rows per block), grid (x, y, z) = (row chunks, nkv, n_splits), n_splits,
    keys_per_split, stages, vec4, ld (shared row stride of K and V in floats: d + 4 with float4
    rows, d + 1 scalar), shared_mem (bytes).

    Raises:
        ValueError: d outside 1..256, float4 asked for with d % 4 != 0, a bad GQA grouping, or
            no layout with two stages within ``shared_limit`` (the caller falls back to the
            v1 decode kernel, ``attention_fwd_*``).
    """
    vec4 = d % 4 == 0 if vec4 is None else vec4
    if vec4 and d % 4:
        raise ValueError(f"plan_decode: the float4 kernel needs d % 4 == 0, got d={d}")
    if nkv < 1 or nh % nkv:
        raise ValueError(f"plan_decode: {nh} query heads cannot share {nkv} kv heads")
    if Tq < 1 or Tk < 1:
        raise ValueError(f"plan_decode: needs Tq >= 1 and Tk >= 1, got Tq={Tq}, Tk={Tk}")
    variant = next(((dmax, rpw) for dmax, rpw in VARIANTS if 1 <= d <= dmax), None)
    if variant is None:
        raise ValueError(f"plan_decode: head dim {d} outside 1..{VARIANTS[-1][0]}")
    dmax, rpw = variant
    rows = Tq * (nh // nkv)
    ld = d + 4 if vec4 else d + 1
    # Rows per block: the whole group up to R_MAX; halved while even two stages do not fit.
    R = min(rows, DEC_WARPS * rpw)
    while R > 1 and decode_shared_bytes(R, d, ld, MIN_STAGES) > shared_limit:
        R = math.ceil(R / 2)
    if decode_shared_bytes(R, d, ld, MIN_STAGES) > shared_limit:
        raise ValueError(f"attention (decode v2): head dim {d} needs "
                         f"{decode_shared_bytes(R, d, ld, MIN_STAGES)} bytes of shared memory "
                         f"per block, more than this device's {shared_limit}")
    shared_two = min(shared_limit, shared_per_sm // BLOCKS_PER_SM - RESERVED_PER_BLOCK)
    stages = MIN_STAGES
    while (stages < MAX_STAGES
           and decode_shared_bytes(R, d, ld, stages + 1) <= max(
               shared_two, decode_shared_bytes(R, d, ld, MIN_STAGES))):
        stages += 1
    gx = math.ceil(rows / R)
    blocks = gx * nkv
    n_splits = math.ceil(BLOCKS_PER_SM * sm_count / blocks)
    n_splits = max(1, min(n_splits, math.ceil(Tk / MIN_KEYS_PER_SPLIT), MAX_SPLITS))
    kps = math.ceil(Tk / n_splits)
    kps = -(-kps // KEY_TILE) * KEY_TILE if kps >= KEY_TILE else kps  # whole tiles past one
    n_splits = math.ceil(Tk / kps)  # no empty split
    return {
        "kernel": KERNELS[(dmax, vec4)], "rpw": rpw, "rows": rows, "R": R,
        "grid": (gx, nkv, n_splits), "n_splits": n_splits, "keys_per_split": kps,
        "stages": stages, "vec4": vec4, "ld": ld,
        "shared_mem": decode_shared_bytes(R, d, ld, stages),
    }
