"""gather_rows, scatter_rows, fill_slot_pos, write_kv: hand-checked values, properties, NumPy vs
CuPy.

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
from dflash_ref.ops.pager import fill_slot_pos, gather_rows, scatter_rows, write_kv
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


def test_write_kv_hand_values_at_rows_and_from_start():
    # kv [2, C=5, H=2, D=1] of NaN (an unwritten element shows); k rows 1, 2, v rows -1, -2,
    # head h adds 10 h. At rows [4, 0]: K row 4 = [1, 11], K row 0 = [2, 12], V likewise negated.
    kv = np.full((2, 5, 2, 1), np.nan, np.float32)
    k = np.array([[[1], [11]], [[2], [12]]], np.float32)  # [T=2, H=2, D=1]
    v = -k
    assert write_kv(kv, k, v, rows=np.array([4, 0])) is kv
    nan = np.nan
    np.testing.assert_array_equal(kv[0, :, :, 0], [[2, 12], [nan, nan], [nan, nan], [nan, nan],
                                                   [1, 11]])
    np.testing.assert_array_equal(kv[1, :, :, 0], [[-2, -12], [nan, nan], [nan, nan],
                                                   [nan, nan], [-1, -11]])
    write_kv(kv, k, v, start=2)  # rows 2, 3
    np.testing.assert_array_equal(kv[0, 2:4, :, 0], [[1, 11], [2, 12]])
    np.testing.assert_array_equal(kv[1, 2:4, :, 0], [[-1, -11], [-2, -12]])
    np.testing.assert_array_equal(kv[0, 4, :, 0], [1, 11])  # rows outside 2..3 untouched
    write_kv(kv, k[:0], v[:0], start=5)  # no rows: nothing to do, even at the end


def test_write_kv_reads_a_strided_v_column_slice():
    # The v of a stacked q/k/v product: [T, H, D] view with row stride > H D. Values = their
    # own flat addresses, so the expected rows are read off by hand from the addresses.
    T, H, D, width = 3, 2, 2, 11
    qkv = np.arange(T * width, dtype=np.float32).reshape(T, width)
    v = qkv[:, 5:9].reshape(T, H, D)  # columns 5..8 of each row
    assert not v.flags.c_contiguous
    kv = np.zeros((2, 4, H, D), np.float32)
    write_kv(kv, np.zeros((T, H, D), np.float32), v, rows=[3, 1, 2])
    np.testing.assert_array_equal(kv[1, 3].ravel(), [5, 6, 7, 8])
    np.testing.assert_array_equal(kv[1, 1].ravel(), [16, 17, 18, 19])
    np.testing.assert_array_equal(kv[1, 2].ravel(), [27, 28, 29, 30])
    assert not kv[1, 0].any() and not kv[0].any()


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: write_kv(np.zeros((3, 4, 2, 2)), np.zeros((1, 2, 2)), np.zeros((1, 2, 2))),
         r"\[2, C, H, D\]"),
        (lambda: write_kv(np.zeros((2, 4, 2, 2)), np.zeros((1, 2, 3)), np.zeros((1, 2, 3))),
         r"\[T, 2, 2\]"),
        (lambda: write_kv(np.zeros((2, 4, 2, 2)), np.zeros((1, 2, 2)), np.zeros((2, 2, 2))),
         r"\[T, 2, 2\]"),
        (lambda: write_kv(np.zeros((2, 4, 2, 4))[..., ::2], np.zeros((1, 2, 2)),
                          np.zeros((1, 2, 2))), "C-contiguous"),
        (lambda: write_kv(np.zeros((2, 4, 1, 1)), np.zeros((2, 1, 1)), np.zeros((2, 1, 1)),
                          start=3), "do not fit"),
        (lambda: write_kv(np.zeros((2, 4, 1, 1)), np.zeros((1, 1, 1)), np.zeros((1, 1, 1)),
                          start=-1), "do not fit"),
        (lambda: write_kv(np.zeros((2, 4, 1, 1)), np.zeros((1, 1, 1)), np.zeros((1, 1, 1)),
                          rows=[0], start=1), "not both"),
        (lambda: write_kv(np.zeros((2, 4, 1, 1)), np.zeros((2, 1, 1)), np.zeros((2, 1, 1)),
                          rows=[1, 1]), "distinct"),
        (lambda: write_kv(np.zeros((2, 4, 1, 1)), np.zeros((1, 1, 1)), np.zeros((1, 1, 1)),
                          rows=[4]), r"\[0, 4\)"),
        (lambda: write_kv(np.zeros((2, 4, 1, 1)), np.zeros((2, 1, 1)), np.zeros((2, 1, 1)),
                          rows=[1]), "one row each"),
    ],
)
def test_write_kv_bad_arguments_are_explained(call, match):
    with pytest.raises(ValueError, match=match):
        call()


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


@given(st.integers(1, 4), st.integers(1, 3), st.integers(1, 5), st.data())
def test_write_kv_equals_two_assignments_and_leaves_other_rows(C, H, D, data):
    # The op's meaning, against the plain NumPy writes of the K and the V rows.
    rows = np.array(data.draw(st.lists(st.integers(0, C - 1), max_size=C, unique=True)), np.int64)
    T = rows.size
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    kv = rng.standard_normal((2, C, H, D)).astype(np.float32)
    k, v = (rng.standard_normal((T, H, D)).astype(np.float32) for _ in range(2))
    expected = kv.copy()
    expected[0][rows], expected[1][rows] = k, v
    np.testing.assert_array_equal(write_kv(kv.copy(), k, v, rows=rows), expected)
    start = data.draw(st.integers(0, C - T))
    expected = kv.copy()
    expected[0][start:start + T], expected[1][start:start + T] = k, v
    np.testing.assert_array_equal(write_kv(kv.copy(), k, v, start=start), expected)


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


@pytest.mark.gpu
@pytest.mark.parametrize(("T", "C", "H", "D"), [(1, 1, 1, 1), (1, 64, 8, 128), (5, 33, 3, 66),
                                                (16, 300, 4, 256), (513, 600, 2, 64)])
@pytest.mark.parametrize("form", ["rows", "start"])
def test_write_kv_twin(rng, T, C, H, D, form):
    # Not check_twin: the op mutates kv, so each side gets its own copy. v is the column slice
    # of a stacked product on both sides (the twin reads it in place, strided).
    kv = rng.standard_normal((2, C, H, D)).astype(np.float32)
    k = rng.standard_normal((T, H, D)).astype(np.float32)
    qkv = rng.standard_normal((T, 3 * H * D + 7)).astype(np.float32)
    rows = rng.permutation(C)[:T] if form == "rows" else None
    start = 0 if form == "rows" else C - T
    v = qkv[:, 2 * H * D + 3: 3 * H * D + 3].reshape(T, H, D)
    expected = write_kv(kv.copy(), k, v, rows=rows, start=start)
    cp_be = get_backend("cupy")
    dev_kv = cp_be.to_backend(kv)
    dev_v = cp_be.to_backend(qkv)[:, 2 * H * D + 3: 3 * H * D + 3].reshape(T, H, D)
    assert not dev_v.flags.c_contiguous or T == 1
    dev_rows = None if rows is None else cp_be.to_backend(rows.astype(np.int32))
    out = cp_be.ops.write_kv(dev_kv, cp_be.to_backend(k), dev_v, rows=dev_rows, start=start,
                             checked=True)
    assert out is dev_kv
    assert_close(out, expected, "exact", op="write_kv", case=f"{form} T={T} C={C} H={H} D={D}")
    host_rows = cp_be.ops.write_kv(cp_be.to_backend(kv), cp_be.to_backend(k), dev_v,
                                   rows=rows, start=start)  # host rows: checked, uploaded
    assert_close(host_rows, expected, "exact", op="write_kv", case=f"host rows, {form}")


@pytest.mark.gpu
def test_write_kv_twin_rejects_bad_rows():
    cp_be = get_backend("cupy")
    xp = cp_be.xp
    kv, k = xp.zeros((2, 4, 1, 2), xp.float32), xp.ones((2, 1, 2), xp.float32)
    with pytest.raises(ValueError, match="distinct"):
        cp_be.ops.write_kv(kv, k, k, rows=xp.asarray([1, 1], xp.int32))
    with pytest.raises(ValueError, match="do not fit"):
        cp_be.ops.write_kv(kv, k, k, start=3)
    with pytest.raises(TypeError, match="float32"):
        cp_be.ops.write_kv(kv.astype(xp.float64), k, k, start=0)
    assert not kv.any()
