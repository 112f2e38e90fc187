"""The default captured target layers (:func:`dflash_ref.config.build_target_layer_ids`).

Expected lists are the published examples (docs/config.md, "target_layer_ids"; z-lab/dflash
``dflash/model.py``) and the formula's properties, never produced by the code under test.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.config import (
    build_target_layer_ids,
)
from tests.config.configs import raises


@pytest.mark.parametrize("L, D, expected", [
    (36, 5, [1, 9, 17, 25, 33]),
    (64, 5, [1, 16, 31, 46, 61]),
    (60, 6, [1, 12, 23, 35, 46, 57]),
    (28, 5, [1, 7, 13, 19, 25]),
])
def test_build_target_layer_ids_spec_examples(L, D, expected):
    assert build_target_layer_ids(L, D) == expected


@pytest.mark.parametrize("L", [1, 2, 7, 36, 64])
def test_build_target_layer_ids_single_draft_layer_is_middle(L):
    assert build_target_layer_ids(L, 1) == [L // 2]


def test_build_target_layer_ids_rounds_half_to_even():
    # L = 7, D = 3: points 1, 1 + 3/2 = 2.5, 4. round(2.5) = 2 (half to even; half-up gives 3).
    assert build_target_layer_ids(7, 3) == [1, 2, 4]
    # L = 9, D = 3: points 1, 3.5, 6. round(3.5) = 4 (even, same as half-up here).
    assert build_target_layer_ids(9, 3) == [1, 4, 6]


def test_build_target_layer_ids_errors():
    with raises("list target_layer_ids explicitly"):
        build_target_layer_ids(6, 4)  # layers 1..3 cannot hold 4 distinct captures
    with raises("positive integers"):
        build_target_layer_ids(0, 5)
    with raises("positive integers"):
        build_target_layer_ids(36, 0)


@given(st.integers(5, 400), st.data())
def test_build_target_layer_ids_properties(L, data):
    D = data.draw(st.integers(2, min(L - 3, 64)))
    ids = build_target_layer_ids(L, D)
    assert len(ids) == D
    assert ids[0] == 1 and ids[-1] == L - 3
    assert all(a < b for a, b in zip(ids, ids[1:]))
