"""The CuPy attention kernel's launch plan, checked on CPU (no GPU needed).

kernels_cupy.attention.plan_launch decides rows per block, the key split and the shared memory;
a wrong plan would only show on a GPU, so its invariants are checked here.
"""

from __future__ import annotations

import math

import pytest

from kernels_cupy import _build
from kernels_cupy.attention import (
    KEY_TILE,
    MAX_HEAD_DIM,
    MAX_RPW,
    SHARED_LIMIT,
    WARPS,
    plan_launch,
)

CASES = [
    # (Tq, nh, nkv, d, Tk): decode, drafter, verify, prefill, awkward
    (1, 32, 8, 128, 32768), (16, 32, 8, 128, 4096), (16, 32, 8, 256, 40000),
    (4096, 32, 8, 128, 4096), (63, 7, 7, 1, 1), (5, 64, 2, 200, 777), (1, 1, 1, 256, 100000),
    (300, 12, 4, 96, 0),
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("sm_count", [1, 108, 132])
def test_plan_covers_every_row_and_key_within_limits(case, sm_count):
    Tq, nh, nkv, d, Tk = case
    p = plan_launch(Tq, nh, nkv, d, Tk, sm_count)
    gx, gy, gz = p["grid"]
    assert 1 <= p["rpw"] <= MAX_RPW and p["R"] == WARPS * p["rpw"]
    assert gx * p["R"] >= Tq * (nh // nkv) > (gx - 1) * p["R"]  # every row, no empty block
    assert gy == nkv and gz == p["n_splits"] >= 1
    kps = p["keys_per_split"]
    assert kps % KEY_TILE == 0  # the kernel's tiles never straddle two splits
    assert gz * kps >= Tk and (gz - 1) * kps < max(Tk, 1)  # every key, no empty split
    assert p["shared_mem"] == (p["R"] * d + KEY_TILE * (d + 1)) * 4 <= SHARED_LIMIT
    assert gx < 2**31 and gz <= 65535


def test_plan_splits_long_decode_but_not_prefill():
    decode = plan_launch(1, 32, 8, 128, 32768, sm_count=132)
    assert decode["n_splits"] > 1  # 8 blocks alone would leave 124 SMs idle
    prefill = plan_launch(4096, 32, 8, 128, 4096, sm_count=132)
    assert prefill["n_splits"] == 1


def test_worst_case_shared_memory_fits_without_opt_in():
    for d in range(1, MAX_HEAD_DIM + 1):
        p = plan_launch(64, 32, 8, d, 1000, 132)
        assert p["shared_mem"] <= SHARED_LIMIT, d


def test_constants_match_the_cuda_source():
    src = (_build.CUDA_DIR / "attention.cu").read_text()
    for name, value in (("ATT_WARPS", WARPS), ("ATT_KT", KEY_TILE), ("ATT_MAX_RPW", MAX_RPW)):
        assert f"#define {name} {value}" in src, name
    assert f"#define ATT_MAX_DC {math.ceil(MAX_HEAD_DIM / 32)}" in src
