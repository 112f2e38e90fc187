"""Gemma's embedding scale: sqrt(hidden_size) rounded to the embedding dtype
(:func:`dflash_ref.config.embedding_scale_for`, :func:`dflash_ref.config.round_to_dtype`).

Expected values are hand-computed bf16 roundings (8 exponent bits, 7 stored mantissa bits).
"""

from __future__ import annotations

import math

import pytest

from dflash_ref.config import (
    embedding_scale_for,
    round_to_dtype,
)
from tests.config.configs import raises


def test_gemma_embedding_scale_rounding_values_from_spec():
    # Hand-rounded to bf16 (spacing 0.5 in [64, 128), 0.25 in [32, 64)):
    # sqrt(5376) = 73.32 -> 73.5; sqrt(3840) = 61.97 -> 62.0; sqrt(2816) = 53.07 -> 53.0.
    assert embedding_scale_for(5376) == 73.5
    assert embedding_scale_for(3840) == 62.0
    assert embedding_scale_for(2816) == 53.0
    # float16 keeps 10 mantissa bits: spacing 1/16 in [64, 128): 73.3212 -> 73.3125.
    assert embedding_scale_for(5376, "float16") == 73.3125
    assert embedding_scale_for(5376, "float32") == pytest.approx(math.sqrt(5376), rel=1e-7)


def test_bfloat16_rounding_ties_to_even():
    # bf16 keeps 7 mantissa bits: near 1 the spacing is 2^-7.
    assert round_to_dtype(1 + 2 ** -8, "bfloat16") == 1.0  # halfway, even is 1.0
    assert round_to_dtype(1 + 3 * 2 ** -8, "bfloat16") == 1 + 2 ** -6  # halfway, even is up
    assert round_to_dtype(1 + 2 ** -8 + 2 ** -12, "bfloat16") == 1 + 2 ** -7  # above half
    with raises("cannot round"):
        round_to_dtype(1.0, "int8")
