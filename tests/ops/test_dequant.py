"""dequantize_q8_0 / q4_k / q6_k: hand-built blocks, gguf as the oracle, NumPy vs CuPy.

Reading order: dflash_ref/io/quant.py (the layouts drawn) -> dflash_ref/ops/dequant.py (the
reference) -> kernels_cupy/dequant.py and cuda/dequant.cu (the twin) -> this file.

The oracle is ``gguf.quants.dequantize`` (the gguf package, written against ggml-quants.c, not by
us). Tolerance "exact": both sides multiply the same integers by the same f16-widened scales in
the same order in float32, so not a single bit may differ.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.io.quant import quantize_q4_k, quantize_q8_0
from dflash_ref.ops.dequant import dequantize_q4_k, dequantize_q6_k, dequantize_q8_0
from dflash_ref.testing import assert_close
from tests.gpu import check_twin

FORMATS = {  # name -> (op, ggml type, weights per block, bytes per block, f16 scale offsets)
    "q8_0": (dequantize_q8_0, Q.Q8_0, 32, 34, (0,)),
    "q4_k": (dequantize_q4_k, Q.Q4_K, 256, 144, (0, 2)),
    "q6_k": (dequantize_q6_k, Q.Q6_K, 256, 210, (208,)),
}


def random_blocks(rng, fmt: str, rows: int, blocks_per_row: int) -> np.ndarray:
    """Random valid blocks [rows, bytes]: random quant bytes, f16 scales in [-2, 2] x 2^-6..2^2.

    Every byte pattern is a valid block for these formats; only the f16 scales are set so the
    values stay finite and away from subnormals (the CuPy kernels run with -ftz).
    """
    _, _, _, nbytes, scale_offsets = FORMATS[fmt]
    raw = rng.integers(0, 256, (rows * blocks_per_row, nbytes), dtype=np.uint8)
    for off in scale_offsets:
        scale = rng.uniform(0.5, 2.0, len(raw)) * 2.0 ** rng.integers(-6, 3, len(raw))
        if fmt != "q4_k":
            scale *= rng.choice([-1, 1], len(raw))  # Q4_K d, dmin are non-negative by design
        raw[:, off:off + 2] = scale.astype(np.float16).view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, blocks_per_row * nbytes)


def f16_bytes(v: float) -> list[int]:
    return list(np.array([v], np.float16).view(np.uint8))


# ---------------------------------------------------------------- unit: hand-built blocks


def test_q8_0_hand_block():
    # d = 0.5 (f16 0x3800), qs = -16..15: x = 0.5 * q.
    qs = np.arange(-16, 16, dtype=np.int8)
    raw = np.array(f16_bytes(0.5) + list(qs.view(np.uint8)), np.uint8)
    assert raw.tolist()[:2] == [0x00, 0x38]
    assert_close(dequantize_q8_0(raw, 32), 0.5 * np.arange(-16, 16), "exact", op="dequantize_q8_0")


def q4_k_hand_block(sc, m, q, d=1.0, dmin=0.5) -> np.ndarray:
    """Pack one Q4_K block by the byte rules of dflash_ref/io/quant.py, written out per byte."""
    scales = [0] * 12
    for j in range(4):
        scales[j] = sc[j] | ((sc[j + 4] >> 4) << 6)
        scales[j + 4] = m[j] | ((m[j + 4] >> 4) << 6)
        scales[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4)
    qs = [0] * 128
    for s in range(8):
        for l in range(32):
            qs[32 * (s // 2) + l] |= q[32 * s + l] << (4 * (s % 2))
    return np.array(f16_bytes(d) + f16_bytes(dmin) + scales + qs, np.uint8)


def test_q4_k_hand_block():
    # sc, m use the high bits (>= 16) in sub-blocks 4..7, which live in the packed third part.
    sc = [1, 2, 3, 4, 17, 33, 63, 5]
    m = [0, 1, 2, 3, 20, 40, 63, 7]
    q = [l % 16 for l in range(256)]
    raw = q4_k_hand_block(sc, m, q)
    expected = [1.0 * sc[e // 32] * q[e] - 0.5 * m[e // 32] for e in range(256)]
    assert_close(dequantize_q4_k(raw, 256), expected, "exact", op="dequantize_q4_k")
    assert_close(gguf.quants.dequantize(raw, Q.Q4_K), expected, "exact", op="gguf oracle")


def test_q6_k_hand_block():
    # q_e = (e % 64) - 32 covers every 6-bit value; scales[i] = i - 8 (signed); d = 0.25.
    q = [(e % 64) - 32 for e in range(256)]
    scales = [i - 8 for i in range(16)]
    ql, qh = [0] * 128, [0] * 64
    for e in range(256):
        h, t = divmod(e, 128)
        k, l = divmod(t, 32)
        u = q[e] + 32  # 0..63
        ql[64 * h + 32 * (k & 1) + l] |= (u & 15) << (4 * (k >> 1))
        qh[32 * h + l] |= (u >> 4) << (2 * k)
    raw = np.array(ql + qh + list(np.array(scales, np.int8).view(np.uint8)) + f16_bytes(0.25),
                   np.uint8)
    expected = [0.25 * scales[e // 16] * q[e] for e in range(256)]
    assert_close(dequantize_q6_k(raw, 256), expected, "exact", op="dequantize_q6_k")
    assert_close(gguf.quants.dequantize(raw, Q.Q6_K), expected, "exact", op="gguf oracle")


def test_shapes_and_argument_checks(rng):
    raw = random_blocks(rng, "q8_0", 3, 2)  # [3 rows, 2 blocks * 34 bytes]
    assert dequantize_q8_0(raw, (3, 64)).shape == (3, 64)
    assert dequantize_q8_0(raw.reshape(-1), 192).shape == (192,)
    with pytest.raises(ValueError, match="204 bytes"):
        dequantize_q8_0(raw, (3, 65))
    with pytest.raises(ValueError, match="multiple of 256"):
        dequantize_q4_k(np.zeros(144, np.uint8), 200)
    with pytest.raises(TypeError, match="uint8"):
        dequantize_q6_k(np.zeros(210, np.int8), 256)


# ---------------------------------------------------------------- oracle: gguf.quants


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("rows, blocks", [(1, 1), (3, 2), (7, 5)])
def test_equals_gguf_on_random_blocks(rng, fmt, rows, blocks):
    op, qtype, per_block, _, _ = FORMATS[fmt]
    raw = random_blocks(rng, fmt, rows, blocks)
    expected = gguf.quants.dequantize(raw, qtype)  # [rows, blocks * per_block]
    assert_close(op(raw, (rows, blocks * per_block)), expected, "exact", op=f"dequantize_{fmt}",
                 case=f"{rows}x{blocks} blocks")


@given(st.data())
def test_our_quantizers_dequantize_like_gguf(data):
    rows = data.draw(st.integers(1, 4))
    seed = data.draw(st.integers(0, 2**32 - 1))
    x = np.random.default_rng(seed).standard_normal((rows, 256)).astype(np.float32)
    for quantize, op, qtype in ((quantize_q8_0, dequantize_q8_0, Q.Q8_0),
                                (quantize_q4_k, dequantize_q4_k, Q.Q4_K)):
        raw = quantize(x)
        assert_close(op(raw, x.shape), gguf.quants.dequantize(raw, qtype), "exact",
                     op=op.__name__, case=f"seed {seed}")


# ---------------------------------------------------------------- NumPy vs CuPy (gpu)

# (rows, blocks per row): awkward counts; the last Q8_0 case has more than 65536 * 256 weights,
# so the grid-stride loop of launch_elementwise wraps around.
GPU_CASES = [(1, 1), (3, 7), (5, 33), (64, 16)]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("rows, blocks", GPU_CASES)
def test_dequant_twin(rng, fmt, rows, blocks):
    op, qtype, per_block, _, _ = FORMATS[fmt]
    raw = random_blocks(rng, fmt, rows, blocks)
    shape = (rows, blocks * per_block)
    check_twin(op.__name__, (raw, shape), tol="exact", case=f"{fmt} {rows}x{blocks}")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_dequant_twin_equals_gguf(rng, fmt):
    import cupy as cp

    import kernels_cupy.dequant as twin

    op, qtype, per_block, _, _ = FORMATS[fmt]
    blocks = 65536 * 256 // per_block + 3  # > one full grid of threads
    raw = random_blocks(rng, fmt, 1, blocks)
    y = getattr(twin, op.__name__)(cp.asarray(raw), (blocks * per_block,))
    assert_close(y, gguf.quants.dequantize(raw, qtype).reshape(-1), "exact", op=op.__name__,
                 case="grid-stride wrap, gguf oracle")
