"""BF16 / Q8_0 / Q4_K writers: hand-checked bytes, gguf as the oracle, the stated error bounds.

The oracle for every quantized byte string is ``gguf.quants.dequantize`` (and, for Q8_0 and
BF16, ``gguf.quants.quantize``, which the gguf package states is bit-exact with ggml-quants.c).
Error bounds are the ones stated in dflash_ref/io/quant.py's docstring.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import Q4_K as GGUF_Q4_K
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.errors import FormatError
from dflash_ref.io.quant import (
    _pack_q4_k_scales,
    bf16_bits_to_float32,
    float32_to_bf16_bits,
    q4_k_input_bound,
    q8_0_error_bound,
    quantize_q4_k,
    quantize_q8_0,
)
from dflash_ref.testing import assert_close
from tests.strategies import f32_arrays


def rel_rms(x, y) -> float:
    x = x.astype(np.float64)
    return float(np.sqrt(np.mean((x - y) ** 2) / np.mean(x**2)))


def adversarial_rows(n: int, rng) -> dict[str, np.ndarray]:
    """Rows of length n (a multiple of 256) that stress a block quantizer."""
    g = rng.standard_normal(n).astype(np.float32)
    outlier = g.copy()
    outlier[::97] = 300.0  # one huge weight in some blocks
    mixed = g * np.repeat(np.float32(10.0) ** rng.integers(-3, 4, n // 32), 32)  # 1e-3..1e3
    return {
        "gaussian": g,
        "zeros": np.zeros(n, np.float32),
        "all equal positive": np.full(n, 0.37, np.float32),
        "all equal negative": np.full(n, -2.5, np.float32),
        "negative only": -np.abs(g) - 0.1,
        "positive only": np.abs(g) + 0.1,
        "outliers": outlier,
        "mixed magnitudes": mixed.astype(np.float32),
        "tiny (subnormal f16 scales)": (g * 1e-6).astype(np.float32),
        "large": (g * 1e4).astype(np.float32),
        "one nonzero": np.eye(1, n, 5, dtype=np.float32)[0],
    }


# ---------------------------------------------------------------- BF16


def test_bf16_hand_values():
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.0, np.inf, 3.4e38], np.float32)
    # 1 + 2^-8 is halfway between 1 (0x3F80, even) and 1 + 2^-7 (0x3F81): ties to even -> 0x3F80.
    # 1 + 3 * 2^-8 is halfway between 0x3F81 (odd) and 0x3F82: -> 0x3F82. -2 = 0xC000.
    # 3.4e38 is past the midpoint 3.396e38 between the largest bf16 0x7F7F (3.390e38) and inf.
    assert float32_to_bf16_bits(x).tolist() == [0x3F80, 0x3F80, 0x3F82, 0xC000, 0x7F80, 0x7F80]
    nan = float32_to_bf16_bits(np.array([np.nan], np.float32))
    assert np.isnan(bf16_bits_to_float32(nan)).all()


def test_bf16_matches_gguf(rng):
    x = (rng.standard_normal(4096) * 10.0 ** rng.integers(-20, 20, 4096)).astype(np.float32)
    x[:3] = [np.nan, -np.inf, 0.0]
    expected = gguf.quants.quantize(x, Q.BF16)  # uint8 [8192]
    assert np.array_equal(float32_to_bf16_bits(x).view(np.uint8), expected)
    bits = float32_to_bf16_bits(x)
    assert_close(bf16_bits_to_float32(bits), gguf.quants.dequantize(expected, Q.BF16), "exact",
                 op="bf16_bits_to_float32")


# ---------------------------------------------------------------- Q8_0


def test_q8_0_hand_block():
    # amax = 127 -> d = 1 exactly (f16 0x3C00), q = roundf(x): halves round AWAY from zero
    # (C roundf), unlike np.round: 0.5 -> 1, 2.5 -> 3, -0.5 -> -1, -2.5 -> -3.
    x = np.zeros(32, np.float32)
    x[:6] = [127.0, 0.5, 2.5, -0.5, -2.5, -126.4]
    raw = quantize_q8_0(x)
    assert raw.shape == (34,) and raw[:2].tolist() == [0x00, 0x3C]
    assert raw[2:8].view(np.int8).tolist() == [127, 1, 3, -1, -3, -126]
    assert raw[8:].tolist() == [0] * 26


@pytest.mark.parametrize("case", list(adversarial_rows(512, np.random.default_rng(0))))
def test_q8_0_bytes_equal_gguf_and_error_within_bound(case):
    x = adversarial_rows(512, np.random.default_rng(1))[case].reshape(2, 256)
    raw = quantize_q8_0(x)
    assert np.array_equal(raw, gguf.quants.quantize(x, Q.Q8_0)), case
    err = np.abs(gguf.quants.dequantize(raw, Q.Q8_0) - x)
    bound = q8_0_error_bound(x)
    assert np.all(err <= bound), f"{case}: max excess {np.max(err - bound)}"


def test_q8_0_underflowing_scale_stores_zeros():
    # max|x| = 1e-37: d = amax/127 is a float32 subnormal and 1/d overflows. ggml's C code would
    # convert roundf(x * inf) to int8 (undefined); we store d = 0 and q = 0, read back as 0.
    x = np.full(32, 1e-37, np.float32)
    x[::2] = 0.0
    with np.errstate(over="raise", invalid="raise"):
        raw = quantize_q8_0(x)
    assert raw.tolist() == [0] * 34


@given(st.data())
def test_q8_0_property(data):
    rows = data.draw(st.integers(1, 3))
    n = 32 * data.draw(st.sampled_from([1, 3, 8]))
    x = data.draw(f32_arrays((rows, n), -1e3, 1e3))
    raw = quantize_q8_0(x)
    # Byte equality with gguf except in blocks whose 1/d overflows (see the test above).
    ordinary = np.abs(x.reshape(-1, 32)).max(axis=1) >= 1e-30
    with np.errstate(over="ignore", invalid="ignore"):
        expected = gguf.quants.quantize(x, Q.Q8_0).reshape(-1, 34)
    assert np.array_equal(raw.reshape(-1, 34)[ordinary], expected[ordinary])
    assert np.all(np.abs(gguf.quants.dequantize(raw, Q.Q8_0) - x) <= q8_0_error_bound(x))


# ---------------------------------------------------------------- Q4_K


def test_q4_k_scale_packing_matches_gguf(rng):
    sc = rng.integers(0, 64, (50, 8))
    m = rng.integers(0, 64, (50, 8))
    got_sc, got_m = GGUF_Q4_K.get_scale_min(_pack_q4_k_scales(sc, m))
    assert np.array_equal(got_sc, sc) and np.array_equal(got_m, m)


def test_q4_k_hand_block():
    # Integers 0..15 with 0 and 15 in every sub-block: lo = 0 -> dmin = 0, m = 0; step 1 needs
    # d = f16 round-up of 1/63 and sc = 63 everywhere; each weight lands on its own level.
    x = (np.arange(256) % 16).astype(np.float32)
    raw = quantize_q4_k(x)
    assert raw.shape == (144,)
    d = raw[0:2].view(np.float16)[0]
    assert d >= np.float16(1 / 63) and d * 63 >= 1 and raw[2:4].tolist() == [0, 0]
    # scales: bytes 0..3 = sc | (sc >> 4) << 6 = 63 | 3 << 6 = 0xFF; 4..7 = m = 0;
    # 8..11 = (sc & 15) | (m & 15) << 4 = 0x0F.
    assert raw[4:16].tolist() == [0xFF] * 4 + [0] * 4 + [0x0F] * 4
    # qs chunk c byte l: low nibble = x[64 c + l], high nibble = x[64 c + 32 + l].
    qs = raw[16:].reshape(4, 32)
    assert np.array_equal(qs & 15, x.reshape(4, 2, 32)[:, 0]), "low nibbles"
    assert np.array_equal(qs >> 4, x.reshape(4, 2, 32)[:, 1]), "high nibbles"


def q4_k_stored_step_bound(x: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """step_s / 2 + float32 slack, with d, sc, dmin, m decoded from the bytes by gguf's code."""
    blocks = raw.reshape(-1, 144)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float64)  # [nb, 1]
    dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float64)
    sc, m = GGUF_Q4_K.get_scale_min(blocks[:, 4:16].copy())  # [nb, 8] each
    step, offset = d * sc, dmin * m
    sub = x.reshape(-1, 8, 32).astype(np.float64)
    slack = 2.0**-20 * (np.abs(sub.max(axis=2)) + offset)
    return np.broadcast_to((step / 2 + slack)[..., None], sub.shape).reshape(x.shape)


@pytest.mark.parametrize("case", list(adversarial_rows(512, np.random.default_rng(0))))
def test_q4_k_error_within_bounds(case):
    x = adversarial_rows(512, np.random.default_rng(2))[case].reshape(2, 256)
    raw = quantize_q4_k(x)
    err = np.abs(gguf.quants.dequantize(raw, Q.Q4_K).astype(np.float64) - x)
    stored = q4_k_stored_step_bound(x, raw)
    assert np.all(err <= stored), f"{case}: max excess {np.max(err - stored)}"
    assert np.all(err <= q4_k_input_bound(x)), f"{case}: input bound"


@given(st.data())
def test_q4_k_property(data):
    rows = data.draw(st.integers(1, 3))
    x = data.draw(f32_arrays((rows, 256), -100.0, 100.0))
    raw = quantize_q4_k(x)
    err = np.abs(gguf.quants.dequantize(raw, Q.Q4_K).astype(np.float64) - x)
    assert np.all(err <= q4_k_stored_step_bound(x, raw))
    assert np.all(err <= q4_k_input_bound(x))


def test_gaussian_relative_rms(rng):
    # Typical errors quoted in quant.py's docstring and compare.REL_RMS_BUDGET.
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    q8 = rel_rms(x, gguf.quants.dequantize(quantize_q8_0(x), Q.Q8_0))
    q4 = rel_rms(x, gguf.quants.dequantize(quantize_q4_k(x), Q.Q4_K))
    assert 4e-3 < q8 < 7e-3, q8
    assert 7e-2 < q4 < 8.5e-2, q4


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("quantize, n_bad", [(quantize_q8_0, 33), (quantize_q4_k, 255)])
def test_quantizers_reject_bad_input(quantize, n_bad):
    with pytest.raises(FormatError, match="multiple of"):
        quantize(np.zeros((2, n_bad), np.float32))
    with pytest.raises(FormatError, match="NaN or inf"):
        quantize(np.full(256, np.nan, np.float32))
    with pytest.raises(FormatError, match="float arrays"):
        quantize(np.zeros(256, np.int32))


def test_q8_0_rejects_scale_beyond_f16():
    with pytest.raises(FormatError, match="f16"):
        quantize_q8_0(np.full(32, 1e7, np.float32))
