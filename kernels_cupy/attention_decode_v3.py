"""The launch plan of the decode attention kernel v3 (pure: no CuPy).

``attention_decode_v3_f32`` (cuda/attention_decode_v3.cu) serves a decode step: at most
``ROWS`` (query, head) rows per kv head (``Tq * nh / nkv``: one token with GQA up to 4). One
block per (key split, kv head) holds every row of its kv head; all ``WARPS`` warps work on keys,
each on its own groups of ``KEY_GROUP`` keys (eight groups, 64 K/V rows, in flight per block),
with its own online softmax; the warps merge in the block, and the splits merge in the last
block of each kv head to finish (a ticket counter per kv head that the last block resets): no
second launch, no memset per call. The key bytes are read once. docs/attention.md, "The decode
kernel (v3)".

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
ROWS = 4  # D3_ROWS: rows per block, ROWS * KEY_GROUP = 32 (one (row, key) pair per lane)
MAX_SPLITS = 8  # D3_MAX_SPLITS
MAX_HEAD_DIM = 128  # D3_MAX_D: one float4 of columns per lane
KERNEL = "attention_decode_v3_f32"

# The split rule (plan parameters, to be set from a measurement): up to one block per SM, at
# most MAX_SPLITS splits, none shorter than MIN_KEYS_PER_SPLIT keys; a split is a whole number
# of the block's key strides (WARPS * KEY_GROUP = 64 keys) so that every warp gets as many groups.
MIN_KEYS_PER_SPLIT = 64
BLOCK_KEYS = WARPS * KEY_GROUP


def shared_bytes(d: int) -> int:
    """Dynamic shared memory: the merge slots sAcc [WARPS, ROWS, d], sM and sL [WARPS, ROWS]."""
    return WARPS * ROWS * (d + 2) * 4


@functools.lru_cache(maxsize=4096)
def plan_decode_v3(Tq: int, nh: int, nkv: int, d: int, Tk: int, sm_count: int) -> dict:
    """The launch geometry of ``attention_decode_v3_f32`` (pure, cached: called per launch).

    Args:
        Tq, nh, nkv, d, Tk: q [Tq, nh, d], k / v [Tk, nkv, d].
        sm_count: SMs of the device; the splits aim at one block per SM.

    Returns a dict: kernel, rows (Tq * g), grid (n_splits, nkv), block (WARPS * 32,),
    n_splits, keys_per_split, shared_mem (bytes), counters (the ticket counters it needs: nkv).

    Raises:
        ValueError: what v3 does not take (more than ROWS rows per kv head, d % 4 != 0,
            d > MAX_HEAD_DIM, a bad GQA grouping, no key or no query); the wrapper runs v2.
    """
    if nkv < 1 or nh % nkv:
        raise ValueError(f"plan_decode_v3: {nh} query heads cannot share {nkv} kv heads")
    if Tq < 1 or Tk < 1:
        raise ValueError(f"plan_decode_v3: needs Tq >= 1 and Tk >= 1, got Tq={Tq}, Tk={Tk}")
    rows = Tq * (nh // nkv)
    if rows > ROWS:
        raise ValueError(f"plan_decode_v3: {rows} rows per kv head, more than {ROWS}")
    if d % 4 or not 4 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"plan_decode_v3: head dim {d} is not a multiple of 4 in 4..."
                         f"{MAX_HEAD_DIM}")
    n_splits = max(1, min(MAX_SPLITS, math.ceil(sm_count / nkv), Tk // MIN_KEYS_PER_SPLIT))
    kps = -(-math.ceil(Tk / n_splits) // BLOCK_KEYS) * BLOCK_KEYS  # whole block strides
    n_splits = math.ceil(Tk / kps)  # no empty split
    return {
        "kernel": KERNEL, "rows": rows, "grid": (n_splits, nkv), "block": (WARPS * 32,),
        "n_splits": n_splits, "keys_per_split": kps, "shared_mem": shared_bytes(d),
        "counters": nkv,
    }
