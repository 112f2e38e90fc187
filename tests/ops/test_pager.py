"""gather_rows, scatter_rows, fill_slot_pos: hand-checked values, properties, NumPy vs CuPy.

Reading order: dflash_ref/ops/pager.py (the spec) -> kernels_cupy/pager.py and
kernels_cupy/cuda/pager.cu (the twin) -> this file. The pager that uses them is tested in
tests/kvflash/.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.backend import get_backend
from dflash_ref.ops.pager import fill_slot_pos, gather_rows, scatter_rows
from dflash_ref.testing import assert_close
from tests.gpu import check_twin

# ---------------------------------------------------------------- unit: hand-checked values


def test_gather_rows_hand_values():
    # Two segments of three slots, rows of width 2: pool[s, p] = [10 s + p, -(10 s + p)].
    pool = np.array([[[0, 0], [1, -1], [2, -2]], [[10, -10], [11, -11], [12, -12]]], np.float32)
    rows = gather_rows(pool, np.array([2, 0, 2]))
    expected = [[[2, -2], [0, 0], [2, -2]], [[12, -12], [10, -10], [12, -12]]]
    assert_close(rows, np.array(expected, np.float32), "exact", op="gather_rows")
    assert rows.dtype == np.float32 and rows.flags.c_contiguous
    out = np.full((2, 3, 2), np.nan, np.float32)  # NaN-filled: an unwritten element would show
    assert gather_rows(pool, np.array([2, 0, 2]), out=out) is out
    assert_close(out, np.array(expected, np.float32), "exact", op="gather_rows", case="out=")


def test_scatter_rows_writes_in_place_and_returns_the_pool():
    pool = np.zeros((2, 4, 1), np.float32)
    rows = np.array([[[5], [7]], [[50], [70]]], np.float32)  # [S=2, n=2, W=1]
    out = scatter_rows(pool, np.array([3, 1]), rows)
    assert out is pool
    assert_close(pool[:, :, 0], np.array([[0, 7, 0, 5], [0, 70, 0, 50]], np.float32), "exact",
                 op="scatter_rows")


def test_fill_slot_pos_hand_values():
    # T = 2, P = 6 (3 blocks). Chunk 0 in block 2, chunk 1 paged out, chunk 2 in block 0.
    # Block 2 = slots 4, 5 holds positions 0, 1; block 0 = slots 0, 1 holds positions 4, 5.
    out = fill_slot_pos(np.array([2, -1, 0]), chunk_tokens=2, pool_tokens=6)
    np.testing.assert_array_equal(out, [4, 5, -1, -1, 0, 1])
    assert out.dtype == np.int32
    np.testing.assert_array_equal(fill_slot_pos(np.zeros(0, np.int64), 4, 8), [-1] * 8)


def test_copies_are_bit_exact_for_any_dtype():
    # float16 and raw uint8 bytes move unchanged (no arithmetic, no cast).
    pool = np.arange(2 * 5 * 3, dtype=np.uint16).reshape(2, 5, 3).view(np.float16)
    rows = gather_rows(pool, np.array([4, 1]))
    assert rows.dtype == np.float16
    assert rows.view(np.uint16).tolist() == pool.view(np.uint16)[:, [4, 1]].tolist()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: gather_rows(np.zeros((4, 2)), [0]), r"\[S, P, W\]"),
        (lambda: gather_rows(np.zeros((1, 4, 2)), [4]), r"\[0, 4\)"),
        (lambda: gather_rows(np.zeros((1, 4, 2)), [-1]), "never allocated"),
        (lambda: gather_rows(np.zeros((1, 4, 2)), [0.5]), "integer"),
        (lambda: scatter_rows(np.zeros((1, 4, 2)), [1, 1], np.zeros((1, 2, 2))), "distinct"),
        (lambda: scatter_rows(np.zeros((1, 4, 2)), [1], np.zeros((1, 2, 2))), r"\[S, n, W\]"),
        (lambda: scatter_rows(np.zeros((1, 4, 4))[:, :, ::2], [1], np.zeros((1, 1, 2))),
         "C-contiguous"),
        (lambda: gather_rows(np.zeros((1, 4, 2)), [0], out=np.zeros((1, 2, 2))), "out must"),
        (lambda: gather_rows(np.zeros((1, 4, 2)), [0], out=np.zeros((1, 1, 2), np.float32)),
         "out must"),
        (lambda: fill_slot_pos([0, 0], 2, 4), "distinct blocks"),
        (lambda: fill_slot_pos([2], 2, 4), "distinct blocks"),
        (lambda: fill_slot_pos([0], 3, 4), "multiple"),
    ],
)
def test_bad_arguments_are_explained(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------- property tests


@st.composite
def pool_and_slots(draw):
    S, P, W = draw(st.integers(1, 3)), draw(st.integers(1, 17)), draw(st.integers(1, 5))
    slots = draw(st.lists(st.integers(0, P - 1), min_size=0, max_size=P, unique=True))
    seed = draw(st.integers(0, 2**16))
    pool = np.random.default_rng(seed).standard_normal((S, P, W)).astype(np.float32)
    return pool, np.array(slots, dtype=np.int64)


@given(pool_and_slots())
def test_scatter_of_gather_is_identity_and_gather_of_scatter_returns_the_rows(case):
    pool, slots = case
    before = pool.copy()
    scatter_rows(pool, slots, gather_rows(pool, slots))
    np.testing.assert_array_equal(pool, before)
    rows = np.full((pool.shape[0], slots.size, pool.shape[2]), 3.25, np.float32)
    scatter_rows(pool, slots, rows)
    np.testing.assert_array_equal(gather_rows(pool, slots), rows)
    untouched = np.setdiff1d(np.arange(pool.shape[1]), slots)
    np.testing.assert_array_equal(pool[:, untouched], before[:, untouched])


@given(st.integers(1, 5), st.integers(1, 6), st.data())
def test_fill_slot_pos_inverts_the_mapping(T, n_blocks, data):
    # Any injective chunk -> block table: slot b*T + i holds c*T + i, every other slot -1.
    n_chunks = data.draw(st.integers(0, 8))
    perm = data.draw(st.permutations(range(max(n_blocks, n_chunks))))
    table = np.array([b if b < n_blocks else -1 for b in perm[:n_chunks]], dtype=np.int64)
    out = fill_slot_pos(table, T, n_blocks * T)
    for c, b in enumerate(table):
        if b >= 0:
            np.testing.assert_array_equal(out[b * T : (b + 1) * T], c * T + np.arange(T))
    free = sorted(set(range(n_blocks)) - set(table[table >= 0].tolist()))
    for b in free:
        assert (out[b * T : (b + 1) * T] == -1).all()


# ---------------------------------------------------------------- NumPy vs CuPy (gpu)

POOLS = [(1, 1, 1), (2, 7, 3), (4, 64, 128), (6, 300, 96), (32, 513, 256)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", POOLS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gather_rows_twin(rng, shape, dtype):
    S, P, W = shape
    if dtype == np.float16 and W % 2:
        W += 1  # the twin moves 32-bit words: a float16 row needs an even width
    pool = rng.standard_normal((S, P, W)).astype(dtype)
    slots = rng.permutation(P)[: max(1, P // 3)]
    check_twin("gather_rows", (pool, slots), tol="exact", case=f"{shape} {dtype.__name__}")
    cp_be = get_backend("cupy")
    out = cp_be.xp.full((S, slots.size, W), np.nan, dtype=dtype)
    got = cp_be.ops.gather_rows(cp_be.to_backend(pool), cp_be.to_backend(slots), out)
    assert got is out
    assert_close(out, gather_rows(pool, slots), "exact", op="gather_rows", case="out=")


@pytest.mark.gpu
@pytest.mark.parametrize("shape", POOLS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_scatter_rows_twin(rng, shape, dtype):
    # Not check_twin: the op mutates its pool, so each side gets its own copy.
    S, P, W = shape
    if dtype == np.float16 and W % 2:
        W += 1
    pool = rng.standard_normal((S, P, W)).astype(dtype)
    slots = rng.permutation(P)[: max(1, P // 2)]
    rows = rng.standard_normal((S, slots.size, W)).astype(dtype)
    expected = scatter_rows(pool.copy(), slots, rows)
    cp_be = get_backend("cupy")
    dev_pool = cp_be.to_backend(pool)
    out = cp_be.ops.scatter_rows(dev_pool, cp_be.to_backend(slots), cp_be.to_backend(rows))
    assert out is dev_pool
    assert_close(out, expected, "exact", op="scatter_rows", case=f"{shape} {dtype.__name__}")


@pytest.mark.gpu
@pytest.mark.parametrize(("T", "n_blocks", "n_chunks"), [(1, 1, 1), (4, 5, 9), (64, 8, 300)])
def test_fill_slot_pos_twin(rng, T, n_blocks, n_chunks):
    table = np.full(n_chunks, -1, dtype=np.int64)
    resident = rng.permutation(n_chunks)[:n_blocks]
    table[resident] = rng.permutation(n_blocks)[: resident.size]
    check_twin("fill_slot_pos", (table, T, n_blocks * T), tol="exact", case=f"T={T}")


@pytest.mark.gpu
def test_twins_reject_bad_slots_instead_of_corrupting_memory():
    cp_be = get_backend("cupy")
    pool = cp_be.xp.zeros((1, 4, 2), dtype=cp_be.xp.float32)
    with pytest.raises(ValueError, match="never allocated"):
        cp_be.ops.gather_rows(pool, cp_be.xp.asarray([-1]))
    with pytest.raises(ValueError, match="distinct"):
        cp_be.ops.scatter_rows(pool, cp_be.xp.asarray([1, 1]), cp_be.xp.zeros((1, 2, 2)))
    with pytest.raises(TypeError, match="multiple of 4 bytes"):
        cp_be.ops.gather_rows(cp_be.xp.zeros((1, 4, 3), dtype=cp_be.xp.float16), [0])
