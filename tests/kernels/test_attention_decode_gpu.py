"""The v2 decode / verify attention kernels on a GPU (``gpu``): NumPy reference vs CuPy.

``attention_decode_*`` (kernels_cupy/cuda/attention_decode.cu) is named explicitly through
``attention_using("decode_v2", ...)`` so that a fallback to v1 cannot hide it. The expected
values are the NumPy reference's (``dflash_ref.ops.attention.attention``: the mask materialised,
a two-pass softmax; an independent implementation), compared at the "float32_attention"
tolerance (dflash_ref/testing.py: another summation order over d <= 256 and up to ~3e4 keys).
The same cases run on the CPU through the kernel's emulation
(tests/kernels/test_attention_decode_plan.py).
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.ops.attention import attention
from dflash_ref.ops.masks import MaskSpec
from dflash_ref.testing import assert_close
from tests.kernels.test_attention_decode_plan import GRID, MASKS, grid_heads_and_mask, make_mask

pytestmark = pytest.mark.gpu

def run_v2(q, k, v, mask, **kw):
    import cupy as cp

    from kernels_cupy.attention import attention_using

    got = attention_using("decode_v2", cp.asarray(q), cp.asarray(k), cp.asarray(v), mask, **kw)
    return cp.asnumpy(got)


@pytest.mark.parametrize("case", GRID, ids=str)
def test_decode_v2_matches_the_reference(rng, case):
    Tq, Tk, d = case
    nh, nkv, kind = grid_heads_and_mask(case)  # GQA 4, 1 (MHA), 8; every mask kind in turn
    q = rng.standard_normal((Tq, nh, d)).astype(np.float32)
    k = rng.standard_normal((Tk, nkv, d)).astype(np.float32)
    v = rng.standard_normal((Tk, nkv, d)).astype(np.float32)
    mask = make_mask(kind, Tq, Tk, rng)
    assert_close(run_v2(q, k, v, mask, scale=0.1), attention(q, k, v, mask, scale=0.1),
                 "float32_attention", op="attention", case=f"{case} {nh}/{nkv} {kind}")


@pytest.mark.parametrize("kind", MASKS + ["empty"])
@pytest.mark.parametrize("shape", [(1, 32, 8, 128, 4100), (16, 32, 8, 128, 777),
                                   (5, 12, 4, 66, 300), (3, 16, 2, 256, 1000),
                                   (16, 64, 4, 128, 200), (2, 6, 3, 97, 65)], ids=str)
def test_decode_v2_every_mask_scalar_and_vec4(rng, shape, kind):
    # d = 66 and 97: the 4-byte cp.async kernels; (16, 64, 4): 256 rows, several row chunks.
    Tq, nh, nkv, d, Tk = shape
    q = rng.standard_normal((Tq, nh, d)).astype(np.float32)
    k = rng.standard_normal((Tk, nkv, d)).astype(np.float32)
    v = rng.standard_normal((Tk, nkv, d)).astype(np.float32)
    mask = make_mask(kind, Tq, Tk, rng)
    assert_close(run_v2(q, k, v, mask, scale=0.1), attention(q, k, v, mask, scale=0.1),
                 "float32_attention", op="attention", case=f"{shape} {kind}")


def test_decode_v2_softcap_and_default_scale(rng):
    Tq, nh, nkv, d, Tk = 4, 16, 4, 256, 2000
    q = rng.standard_normal((Tq, nh, d)).astype(np.float32) * 3
    k = rng.standard_normal((Tk, nkv, d)).astype(np.float32)
    v = rng.standard_normal((Tk, nkv, d)).astype(np.float32)
    mask = make_mask("causal", Tq, Tk, rng)
    for kw in ({"softcap": 30.0}, {}):
        assert_close(run_v2(q, k, v, mask, **kw), attention(q, k, v, mask, **kw),
                     "float32_attention", op="attention", case=str(kw))


def test_decode_v2_unaligned_views_and_nan_in_invisible_slots(rng):
    # k / v one float into a larger buffer (the scalar kernel); a NaN in an invalid slot must not
    # reach the output (the slot is zero-weighted, never multiplied in).
    import cupy as cp

    from kernels_cupy.attention import attention_using

    Tq, nh, nkv, d, Tk = 1, 8, 2, 128, 300
    q = rng.standard_normal((Tq, nh, d)).astype(np.float32)
    kv = rng.standard_normal((2, Tk * nkv * d + 1)).astype(np.float32)
    k, v = (kv[i, 1:].reshape(Tk, nkv, d) for i in range(2))
    k_pos = np.arange(Tk)
    k_pos[7] = -1
    k[7], v[7] = np.nan, np.nan
    mask = MaskSpec(np.array([Tk]), k_pos, causal=True)
    dev = cp.asarray(kv)
    dk, dv = (dev[i, 1:].reshape(Tk, nkv, d) for i in range(2))
    assert dk.data.ptr % 16 != 0
    got = cp.asnumpy(attention_using("decode_v2", cp.asarray(q), dk, dv, mask))
    assert_close(got, attention(q, k, v, mask), "float32_attention", op="attention",
                 case="unaligned k/v, NaN in an invalid slot")


@pytest.mark.parametrize("name", ["decode", "decode_v2", "auto"])
def test_every_named_decode_kernel_agrees(rng, name):
    import cupy as cp

    from kernels_cupy.attention import attention_using

    Tq, nh, nkv, d, Tk = 16, 32, 8, 128, 1500
    q, k, v = (rng.standard_normal(s).astype(np.float32)
               for s in ((Tq, nh, d), (Tk, nkv, d), (Tk, nkv, d)))
    mask = make_mask("causal", Tq, Tk, rng)
    got = attention_using(name, cp.asarray(q), cp.asarray(k), cp.asarray(v), mask)
    assert_close(cp.asnumpy(got), attention(q, k, v, mask), "float32_attention",
                 op="attention", case=name)


def test_auto_runs_v2_for_decode_and_verify(monkeypatch, rng):
    import cupy as cp

    import kernels_cupy.attention as katt

    used = []
    real = katt.plan_decode
    monkeypatch.setattr(katt, "plan_decode", lambda *a: used.append(a) or real(*a))
    for Tq in (1, 16):  # GQA 8: 8 rows per kv head even for one token, more than v3 takes
        q, k, v = (cp.asarray(rng.standard_normal(s).astype(np.float32))
                   for s in ((Tq, 64, 128), (600, 8, 128), (600, 8, 128)))
        katt.attention(q, k, v, make_mask("causal", Tq, 600, rng))
    assert [a[0] for a in used] == [1, 16]


def test_v2_without_a_key_split_equals_the_prefill_kernel_bit_for_bit(rng):
    # With one key split each row sees the prefill kernel's float operations in its order
    # (docs/attention.md, "The decode kernel (v2)").
    import cupy as cp

    from kernels_cupy.attention import _sm_count, attention_using
    from kernels_cupy.attention_decode import plan_decode

    Tq, nh, nkv, d, Tk = 1024, 32, 8, 128, 1024
    assert plan_decode(Tq, nh, nkv, d, Tk, _sm_count(cp.cuda.Device().id))["n_splits"] == 1
    q, k, v = (cp.asarray(rng.standard_normal(s).astype(np.float32))
               for s in ((Tq, nh, d), (Tk, nkv, d), (Tk, nkv, d)))
    mask = MaskSpec(np.arange(Tq), np.arange(Tk), causal=True)
    a = attention_using("prefill", q, k, v, mask, scale=0.05)
    b = attention_using("decode_v2", q, k, v, mask, scale=0.05)
    assert cp.array_equal(a, b), f"max |prefill - v2| = {float(cp.abs(a - b).max())}"
