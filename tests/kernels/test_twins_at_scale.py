"""NumPy vs CuPy at the sizes and on the paths the by-construction GPU fixes touch (``gpu``).

Each test names the fix it checks (docs/performance.md, "What each gpu test checks"):

- bounded-memory gdn_chunked: prompts spanning several blocks, and 32k tokens under a device
  memory-pool limit the one-pass wrapper exceeded;
- coalesced gdn_recurrent_f32: KDA with K > 32, V not a multiple of the 32-column tile, a
  non-default scale, with and without the trace;
- pager slots validated on the host: no device synchronisation in scatter_rows, same errors;
- decode attention with float4 loads and one barrier per key tile: aligned and unaligned head
  dims, both shared-memory layouts (double- and single-buffered K), masks of every kind.

The expected values are the NumPy reference's (an independent implementation: the oracle).
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.backend import get_backend
from dflash_ref.ops.attention import attention
from dflash_ref.ops.masks import MaskSpec
from dflash_ref.ops.pager import scatter_rows
from dflash_ref.testing import assert_close
from tests.gpu import check_twin
from tests.ops.test_gdn import make_inputs

pytestmark = pytest.mark.gpu


def _f32(args):
    return tuple(None if a is None else a.astype(np.float32) for a in args)


# ---------------------------------------------------------------- gdn_chunked in blocks


@pytest.mark.parametrize("kda", [False, True])
def test_gdn_chunked_spanning_several_blocks(rng, monkeypatch, kda):
    import kernels_cupy.gdn as kgdn

    monkeypatch.setattr(kgdn, "BLOCK_BYTES", 1)  # the smallest block: 16 chunks
    T = 3 * 16 * 16 + 37  # chunk 16: three whole blocks and a padded tail
    args = _f32(make_inputs(rng, T, 2, 4, 48 if kda else 64, 40, kda=kda, gmin=-8.0))
    assert len(kgdn.plan_chunk_blocks(T, 16, kgdn.chunks_per_block_for(4, 64, 40, 16, kda))) == 4
    check_twin("gdn_chunked", args, {"chunk_size": 16}, "float32_gdn", case=f"T={T} kda={kda}")


def test_gdn_chunked_long_prefill_default_blocks(rng):
    args = _f32(make_inputs(rng, 8192 + 37, 16, 16, 128, 128, gmin=-8.0))
    check_twin("gdn_chunked", args, {"chunk_size": 64}, "float32_gdn", case="T=8229, 16 heads")


def test_gdn_chunked_32k_fits_a_memory_limit_the_one_pass_wrapper_exceeded(rng):
    # 16 heads, K = V = 128, T = 32768: inputs + output are 1.07 GB; the one-pass wrapper's
    # temporaries were another ~4 GB, a block's are <= 512 MiB (kernels_cupy.gdn.BLOCK_BYTES).
    import cupy as cp

    args = _f32(make_inputs(rng, 32768, 16, 16, 128, 128, gmin=-8.0, init=False))
    expected_o, expected_S = get_backend("numpy").ops.gdn_chunked(*args[:5])
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    pool.set_limit(size=2 * 2**30)
    try:
        dev = [cp.asarray(a) for a in args[:5]]
        o, S = get_backend("cupy").ops.gdn_chunked(*dev)
        cp.cuda.Device().synchronize()
    finally:
        pool.set_limit(size=0)  # 0 = no limit
    assert_close(o, expected_o, "float32_gdn", op="gdn_chunked", case="T=32768 under 2 GiB")
    assert_close(S, expected_S, "float32_gdn", op="gdn_chunked", tensor="state")


# ---------------------------------------------------------------- gdn_recurrent, coalesced

RECURRENT_CASES = [
    # T, H, HV, K, V, kda
    (9, 2, 4, 128, 128, True),  # KDA with K > 32: rows spread over all 8 warps
    (16, 2, 4, 128, 40, False),  # V not a multiple of the 32-column tile: dead lanes
    (1, 16, 32, 128, 128, False),  # a Qwen3.5-shaped decode step
    (5, 1, 1, 7, 1, False),  # K < 8: warps without rows; one live lane
]


@pytest.mark.parametrize("shape", RECURRENT_CASES, ids=str)
@pytest.mark.parametrize("trace", [False, True])
def test_gdn_recurrent_coalesced(rng, shape, trace):
    T, H, HV, K, V, kda = shape
    args = _f32(make_inputs(rng, T, H, HV, K, V, kda=kda, gmin=-8.0))
    check_twin("gdn_recurrent", args, {"return_trace": trace}, "float32_gdn", case=str(shape))
    check_twin("gdn_recurrent", args, {"scale": 0.37}, "float32_gdn", case=f"{shape} scale")


# ---------------------------------------------------------------- pager: host-side slots


def test_scatter_with_host_slots_does_not_synchronise(rng):
    # Host slots are validated with NumPy before upload: no device -> host copy in the call.
    import cupy as cp

    cp_be = get_backend("cupy")
    pool = rng.standard_normal((4, 64, 32)).astype(np.float32)
    slots = rng.permutation(64)[:16]
    rows = rng.standard_normal((4, 16, 32)).astype(np.float32)
    expected = scatter_rows(pool.copy(), slots, rows)
    dev_pool, dev_rows = cp_be.to_backend(pool), cp_be.to_backend(rows)
    # One call before the window: the first compiles and loads the pager module, and loading a
    # module waits for the device; the window must hold only what every later call does.
    cp_be.ops.scatter_rows(cp_be.to_backend(pool), slots, dev_rows)
    cp.cuda.Device().synchronize()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        # A long kernel ahead of the scatter: a host sync inside scatter_rows would wait for it.
        big = cp.ones((4096, 4096), cp.float32)
        for _ in range(20):
            big = big @ big * np.float32(1e-3)
        start = cp.cuda.Event()
        start.record()
        cp_be.ops.scatter_rows(dev_pool, slots, dev_rows)
        returned_before_done = not stream.done
    stream.synchronize()
    assert returned_before_done, "scatter_rows waited for the stream: a host sync remains"
    assert_close(dev_pool, expected, "exact", op="scatter_rows", case="host slots")


def test_host_slot_errors_match_the_reference():
    cp_be = get_backend("cupy")
    pool = cp_be.xp.zeros((1, 4, 2), dtype=cp_be.xp.float32)
    with pytest.raises(ValueError, match="distinct"):
        cp_be.ops.scatter_rows(pool, np.array([1, 1]), cp_be.xp.zeros((1, 2, 2)))
    with pytest.raises(ValueError, match="never allocated"):
        cp_be.ops.scatter_rows(pool, np.array([-1]), cp_be.xp.zeros((1, 1, 2)))
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        cp_be.ops.gather_rows(pool, np.array([4]))


# ---------------------------------------------------------------- decode attention


def _mask(kind: str, Tq: int, Tk: int, rng) -> MaskSpec | None:
    k_pos = np.arange(Tk, dtype=np.int64)
    k_pos[rng.random(Tk) < 0.05] = -1  # invalid slots
    q_pos = np.arange(Tk - Tq, Tk, dtype=np.int64)
    if kind == "none":
        return None
    if kind == "causal":
        return MaskSpec(q_pos=q_pos, k_pos=k_pos, causal=True)
    if kind == "window":
        return MaskSpec(q_pos=q_pos, k_pos=k_pos, causal=True, window=300)
    raise ValueError(kind)


ATTENTION_CASES = [
    # Tq, nh, nkv, d, Tk: decode (split keys), verify, d not a multiple of 4 (scalar path),
    # d = 256 (single-buffered K), d = 128 double-buffered, a short prefill
    (1, 32, 8, 128, 32768), (16, 32, 8, 128, 4096), (1, 4, 2, 66, 1000), (1, 8, 2, 97, 513),
    (3, 16, 4, 256, 5000), (16, 32, 8, 256, 777), (200, 8, 8, 64, 200),
]


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=str)
@pytest.mark.parametrize("kind", ["none", "causal", "window"])
def test_attention_vectorised_one_barrier_per_tile(rng, case, kind):
    Tq, nh, nkv, d, Tk = case
    q = rng.standard_normal((Tq, nh, d)).astype(np.float32)
    k = rng.standard_normal((Tk, nkv, d)).astype(np.float32)
    v = rng.standard_normal((Tk, nkv, d)).astype(np.float32)
    check_twin("attention", (q, k, v, _mask(kind, Tq, Tk, rng)), {"scale": 0.05},
               "float32_attention", case=f"{case} {kind}")


def test_attention_unaligned_views_take_the_scalar_path(rng):
    # k and v as views one float into a larger buffer: not 16-byte aligned, so the float4 path
    # must not be taken; the result must still match.
    import cupy as cp

    Tq, nh, nkv, d, Tk = 1, 8, 2, 128, 300
    q = rng.standard_normal((Tq, nh, d)).astype(np.float32)
    kv = rng.standard_normal((2, Tk * nkv * d + 1)).astype(np.float32)
    k, v = (kv[i, 1:].reshape(Tk, nkv, d) for i in range(2))
    expected = attention(q, k, v)
    dev = cp.asarray(kv)
    dk, dv = (dev[i, 1:].reshape(Tk, nkv, d) for i in range(2))
    assert dk.data.ptr % 16 != 0
    got = get_backend("cupy").ops.attention(cp.asarray(q), dk, dv)
    assert_close(got, expected, "float32_attention", op="attention", case="unaligned k/v")
