"""The launch plan of the decode attention kernel v3 (pure: no CuPy).

``attention_decode_v3_*`` (cuda/attention_decode_v3.cu) serve a decode step and a verify block:
up to ``MAX_QUERY_ROWS`` query rows, every query head of a kv head (``Tq * nh / nkv`` "rows"
per kv head). One block per (key split, kv head, row block) holds up to ``block_rows(d)`` rows;
its 8 warps are ``row groups x key_warps``: each warp owns ``4 * quads`` rows (quads of 4 rows,
one (row, key) pair per lane for a group of ``KEY_GROUP`` keys) and every ``key_warps``-th group
of the split's keys, with its own online softmax. A decode step (<= 4 rows) puts all 8 warps on
keys; a 16-row verify puts each warp on its own rows over every key (K and V rows shared through
L1). The warps merge in the block, and the splits merge in the last block of each (kv head, row
block) to finish (a ticket counter each, reset by that block): no second launch, no memset per
call. docs/attention.md, "The decode kernel (v3)".

Per head dim, one kernel each (registers from ptxas for sm_90, tests/kernels):

- ``attention_decode_v3_f32`` (d <= 128, 4 rows per warp): one float4 column slot per lane
  (lanes past d / 4 hold none: d = 64 uses 16 lanes for loads); 168 registers; shared memory
  ``8 * 4 * (d + 2) * 4`` bytes (16.6 KiB at d = 128, 8.3 KiB at d = 64).
- ``attention_decode_v3_r8_f32`` (d <= 128, 8 rows per warp: 33..64 rows per block); 224
  registers; ``8 * 8 * (d + 2) * 4`` bytes (33 KiB at d = 128).
- ``attention_decode_v3_d256_f32`` (d <= 256, 4 rows per warp, at most 32 rows per block): two
  float4 slots per lane (columns 4 L and 128 + 4 L); 255 registers, no spill;
  ``8 * 4 * (d + 2) * 4`` bytes (33 KiB at d = 256).

:func:`plan_decode_v3` gives the geometry and refuses what the kernel does not take (the caller,
``kernels_cupy.attention``, then runs v2). A NumPy emulation of the kernel's thread mapping and
summation order is tested on CPU (tests/kernels/test_attention_decode_v3.py).
"""

from __future__ import annotations

import functools
import math

# Must match attention_decode_v3.cu.
WARPS = 8  # D3_WARPS: threads per block = 256
KEY_GROUP = 8  # D3_KG: keys per warp group
ROWS = 4  # D3_ROWS: rows of a quad, ROWS * KEY_GROUP = 32 (one (row, key) pair per lane)
MAX_SPLITS = 8  # D3_MAX_SPLITS
MAX_HEAD_DIM = 256  # D3_MAX_D: two float4 slots per lane
KERNELS = {  # (float4 slots per lane, quads per warp) -> kernel
    (1, 1): "attention_decode_v3_f32",
    (1, 2): "attention_decode_v3_r8_f32",
    (2, 1): "attention_decode_v3_d256_f32",
}
KERNEL = KERNELS[(1, 1)]
MAX_QUERY_ROWS = 16  # a verify block; longer spans run v2 or the prefill kernels
MAX_COUNTERS = 1024  # the wrapper's ticket counters: one per (kv head, row block)

# The split rule (plan parameters, to be set from a measurement): up to one block per SM, at
# most MAX_SPLITS splits, none shorter than MIN_KEYS_PER_SPLIT keys; a split is a whole number
# of the block's key strides (WARPS * KEY_GROUP = 64 keys) so that every warp gets as many groups.
MIN_KEYS_PER_SPLIT = 64
BLOCK_KEYS = WARPS * KEY_GROUP


def slots_per_lane(d: int) -> int:
    """Float4 column slots per lane: 1 for d <= 128, 2 for d <= 256."""
    return 1 if d <= 128 else 2


def block_rows(d: int) -> int:
    """The most rows one block holds: 8 warps x 8 rows (d <= 128), x 4 rows (d <= 256)."""
    return WARPS * ROWS * (2 if slots_per_lane(d) == 1 else 1)


def warp_layout(rows: int, d: int) -> tuple[int, int]:
    """(quads per warp, key warps) for a block of ``rows`` rows: 4 rows per warp while the 8
    warps hold them (8 rows per warp above 32 rows), and the warps a row group leaves spare
    split its keys (key_warps = 8 / row groups, a power of two)."""
    quads = 1 if rows <= WARPS * ROWS else 2
    groups = math.ceil(rows / (ROWS * quads))
    key_warps = WARPS
    while key_warps > 1 and (WARPS // key_warps) < groups:
        key_warps //= 2
    return quads, key_warps


def shared_bytes(d: int, quads: int = 1) -> int:
    """Dynamic shared memory: the merge slots sAcc [WARPS, 4 quads, d] and sML
    [WARPS, 4 quads, 2]."""
    return WARPS * ROWS * quads * (d + 2) * 4


@functools.lru_cache(maxsize=4096)
def plan_decode_v3(Tq: int, nh: int, nkv: int, d: int, Tk: int, sm_count: int) -> dict:
    """The launch geometry of ``attention_decode_v3_*`` (pure, cached: called per launch).

    Args:
        Tq, nh, nkv, d, Tk: q [Tq, nh, d], k / v [Tk, nkv, d].
        sm_count: SMs of the device; the splits aim at one block per SM.

    Returns a dict: kernel, rows (Tq * g), rows_per_block, row_blocks, quads (4-row quads per
    warp), key_warps, grid (n_splits, nkv, row_blocks), block (WARPS * 32,), n_splits,
    keys_per_split, shared_mem (bytes), counters (the ticket counters it needs: nkv *
    row_blocks).

    Raises:
        ValueError: what v3 does not take (more than MAX_QUERY_ROWS query rows, d % 4 != 0,
            d > MAX_HEAD_DIM, a bad GQA grouping, no key or no query, more than MAX_COUNTERS
            (kv head, row block) pairs); the wrapper runs v2.
    """
    if nkv < 1 or nh % nkv:
        raise ValueError(f"plan_decode_v3: {nh} query heads cannot share {nkv} kv heads")
    if Tq < 1 or Tk < 1:
        raise ValueError(f"plan_decode_v3: needs Tq >= 1 and Tk >= 1, got Tq={Tq}, Tk={Tk}")
    if Tq > MAX_QUERY_ROWS:
        raise ValueError(f"plan_decode_v3: {Tq} query rows, more than {MAX_QUERY_ROWS}")
    if d % 4 or not 4 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"plan_decode_v3: head dim {d} is not a multiple of 4 in 4..."
                         f"{MAX_HEAD_DIM}")
    rows = Tq * (nh // nkv)
    row_blocks = math.ceil(rows / block_rows(d))
    rows_per_block = math.ceil(rows / row_blocks)
    if nkv * row_blocks > MAX_COUNTERS:
        raise ValueError(f"plan_decode_v3: {nkv} kv heads x {row_blocks} row blocks, more "
                         f"than {MAX_COUNTERS} ticket counters")
    quads, key_warps = warp_layout(rows_per_block, d)
    blocks = nkv * row_blocks
    n_splits = max(1, min(MAX_SPLITS, math.ceil(sm_count / blocks), Tk // MIN_KEYS_PER_SPLIT))
    kps = -(-math.ceil(Tk / n_splits) // BLOCK_KEYS) * BLOCK_KEYS  # whole block strides
    n_splits = math.ceil(Tk / kps)  # no empty split
    return {
        "kernel": KERNELS[(slots_per_lane(d), quads)], "rows": rows,
        "rows_per_block": rows_per_block, "row_blocks": row_blocks, "quads": quads,
        "key_warps": key_warps, "grid": (n_splits, nkv, row_blocks), "block": (WARPS * 32,),
        "n_splits": n_splits, "keys_per_split": kps, "shared_mem": shared_bytes(d, quads),
        "counters": nkv * row_blocks,
    }
