"""gdn_chunked, the chunk-parallel form: its UT-transform inverse, agreement with the recurrent
form (float64 and float32), splits and block boundaries, extreme gates, and NumPy vs CuPy.

The expected values come from :func:`~dflash_ref.ops.gdn.gdn_recurrent`, itself checked against
the independent float64 closed form in test_gdn.py, and from ``numpy.linalg.inv``. The equations:
docs/gdn.md, "The chunked form, and why it is exact" and "The fp32-range rule".
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dflash_ref.ops.gdn as gdn_mod
from dflash_ref.ops._gdn_chunk import invert_unit_lower
from dflash_ref.ops.gdn import gdn_chunked, gdn_recurrent
from dflash_ref.testing import assert_close
from tests.gpu import check_twin
from tests.ops.test_gdn import GPU_CASES, _f32, desc, gdn_cases, inputs_of, make_inputs

# ---------------------------------------------------------------- unit: hand-checked values


def test_invert_unit_lower_against_numpy_inverse(rng):
    for C in (1, 5, 16, 24, 64):  # 24: C / base not a power of two -> plain substitution
        A = np.tril(rng.uniform(-1, 1, (3, C, C)), -1)
        expected = np.linalg.inv(np.eye(C) + A)
        # |A_ij| <= 1 as in the layer: the inverse's entries stay moderate at C <= 64.
        assert_close(invert_unit_lower(A), expected, "float64_gdn", op="invert_unit_lower",
                     case=f"C={C}")


# ---------------------------------------------------------------- property tests


@given(gdn_cases())
def test_chunked_equals_recurrent_float64(case):
    args = inputs_of(case)
    o_r, S_r = gdn_recurrent(*args)
    o_c, S_c = gdn_chunked(*args, chunk_size=case["chunk"])
    assert_close(o_c, o_r, "float64_gdn", op="gdn_chunked", tensor="o", case=desc(case))
    assert_close(S_c, S_r, "float64_gdn", op="gdn_chunked", tensor="state", case=desc(case))


@given(gdn_cases())
def test_float32_forms_match_float64(case):
    args = inputs_of(case)
    o_ref, S_ref = gdn_recurrent(*args)
    args32 = tuple(None if a is None else a.astype(np.float32) for a in args)
    for name, (o, S) in (("recurrent", gdn_recurrent(*args32)),
                         ("chunked", gdn_chunked(*args32, chunk_size=case["chunk"]))):
        assert o.dtype == np.float32
        assert_close(o, o_ref, "float32_gdn", op=f"gdn_{name}", tensor="o", case=desc(case))
        assert_close(S, S_ref, "float32_gdn", op=f"gdn_{name}", tensor="S", case=desc(case))


@given(gdn_cases(), st.data())
def test_split_anywhere_and_carry_the_state(case, data):
    args = inputs_of(case)
    T = case["T"]
    s = data.draw(st.integers(0, T), label="split")
    head, tail = [a[:s] for a in args[:5]], [a[s:] for a in args[:5]]
    o, S = gdn_recurrent(*args)
    o1, S1 = gdn_recurrent(*head, args[5])
    o2, S2 = gdn_recurrent(*tail, S1)
    # Same operations in the same order: bit-identical.
    assert_close(np.concatenate([o1, o2]), o, "exact", op="gdn_recurrent", case=desc(case))
    assert_close(S2, S, "exact", op="gdn_recurrent", tensor="state", case=desc(case))
    c = case["chunk"]
    o1, S1 = gdn_chunked(*head, args[5], chunk_size=c)
    o2, S2 = gdn_chunked(*tail, S1, chunk_size=c)
    assert_close(np.concatenate([o1, o2]), o, "float64_gdn", op="gdn_chunked", case=desc(case))
    assert_close(S2, S, "float64_gdn", op="gdn_chunked", tensor="state", case=desc(case))


@contextmanager
def chunks_per_block(n: int):
    """Temporarily process gdn_chunked in blocks of ``n`` chunks."""
    old = gdn_mod.CHUNKS_PER_BLOCK
    gdn_mod.CHUNKS_PER_BLOCK = n
    try:
        yield
    finally:
        gdn_mod.CHUNKS_PER_BLOCK = old


@given(gdn_cases(max_t=130), st.sampled_from([1, 2, 3]))
def test_block_boundaries_do_not_change_the_result(case, n_chunks):
    args = inputs_of(case)
    o, S = gdn_chunked(*args, chunk_size=case["chunk"])
    with chunks_per_block(n_chunks):
        o_b, S_b = gdn_chunked(*args, chunk_size=case["chunk"])
    assert_close(o_b, o, "float64_gdn", op="gdn_chunked", case=f"{desc(case)}, {n_chunks}/block")
    assert_close(S_b, S, "float64_gdn", op="gdn_chunked", tensor="state")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("g_value", [-50.0, -1e3, -1e4])
@pytest.mark.parametrize("kda", [False, True])
def test_extreme_gates_stay_finite(rng, dtype, g_value, kda):
    # A chunk of g = -50 spans exp(-3200): factoring exp(G_i) exp(-G_j) would overflow
    # (docs/gdn.md, "The fp32-range rule"). Masked, non-positive exponents only -> finite, and
    # equal to the recurrent form, which simply forgets everything before each token.
    T, H, HV, K, V = 150, 1, 2, 8, 4
    q, k, v, g, beta, S0 = make_inputs(rng, T, H, HV, K, V, kda=kda, dtype=dtype)
    g = np.full_like(g, g_value)
    g[::7] = 0.0  # mixed with no-decay tokens
    with np.errstate(over="raise", invalid="raise", divide="raise"):  # underflow is harmless
        o_c, S_c = gdn_chunked(q, k, v, g, beta, S0)
    o_r, S_r = gdn_recurrent(q, k, v, g, beta, S0)
    assert np.isfinite(o_c).all() and np.isfinite(S_c).all()
    tol = "float32_gdn" if dtype == np.float32 else "float64_gdn"
    assert_close(o_c, o_r, tol, op="gdn_chunked", case=f"g={g_value}, kda={kda}")
    assert_close(S_c, S_r, tol, op="gdn_chunked", tensor="state", case=f"g={g_value}")


# ---------------------------------------------------------------- NumPy vs CuPy (gpu)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_CASES, ids=str)
@pytest.mark.parametrize("chunk", [16, 64])
def test_gdn_chunked_twin(rng, shape, chunk):
    T, H, HV, K, V, kda = shape
    args = _f32(make_inputs(rng, T, H, HV, K, V, kda=kda, gmin=-8.0))
    check_twin("gdn_chunked", args, {"chunk_size": chunk}, "float32_gdn", case=str(shape))
    args = _f32(make_inputs(rng, T, H, HV, K, V, kda=kda, gmin=-50.0, init=False))
    check_twin("gdn_chunked", args[:5], {"chunk_size": chunk}, "float32_gdn",
               case=f"{shape} g to -50, no state")

