"""Narrowing float32 weights for storage: BF16, Q8_0 and Q4_K, byte-exact in ggml's layout.

The quantizers write exactly the bytes ggml/GGUF store, so ``gguf.quants.dequantize`` (an
implementation we did not write) is the oracle in the tests. The dequantizers the model uses live
in :mod:`dflash_ref.ops.dequant` (family "dequant", with CuPy twins); this module only writes.

Layouts (little-endian; ``f16`` is IEEE half; one row of a tensor is a whole number of blocks,
blocks follow each other along the row, rows follow each other)::

    Q8_0: 32 weights in 34 bytes                     x[i] = d * qs[i]
      byte 0      2                                          34
           +------+------------------------------------------+
           | d f16| qs[0..31]  int8                          |
           +------+------------------------------------------+

    Q4_K: 256 weights in 144 bytes, 8 sub-blocks s = 0..7 of 32 weights
      byte 0      2      4            16                                        144
           +------+------+------------+-----------------------------------------+
           | d f16| dmin | scales[12] | qs[128]                                 |
           +------+------+------------+-----------------------------------------+
      x[32 s + l] = d * sc[s] * q - dmin * m[s]        sc[s], m[s] in 0..63, q in 0..15
      scales[12] packs 8 six-bit sc and 8 six-bit m (j = 0..3):
           scales[j]     = sc[j]   | (sc[j+4] >> 4) << 6
           scales[j + 4] = m[j]    | (m[j+4]  >> 4) << 6
           scales[j + 8] = (sc[j+4] & 0xF) | (m[j+4] & 0xF) << 4
      qs: 4 chunks c of 32 bytes; byte qs[32 c + l] holds sub-block 2c element l in its low
          nibble and sub-block 2c+1 element l in its high nibble.

    BF16: the upper 16 bits of the float32, rounded to nearest even (NaN kept quiet).

Error bounds (tested in tests/io/test_quant.py on random and adversarial blocks):

- **Q8_0** (ggml's reference choice: d = amax/127, q = round half away from zero of x/d, d
  stored as f16): ``|x - x^| <= amax/127 * (1/2 + 127 * 2^-11) + 2^-17``. The 1/2 is the rounding
  of q, 127 * 2^-11 the f16 rounding of d seen through |q| <= 127, 2^-17 covers a subnormal f16 d.
  Our bytes equal ``gguf.quants.quantize`` (which is bit-exact with ggml-quants.c), except in
  blocks with max|x| < 1.5e-36, where ggml's 1/d overflows and we store zeros.
- **Q4_K** (a min/max scheme, simpler than ggml's ``make_qkx2_quants`` search): per sub-block s
  the range [lo_s, hi_s] with lo_s = min(0, min x) and hi_s = max x is always covered (scales are
  rounded *up*), so every weight rounds to its nearest level: ``|x - x^| <= step_s / 2`` with
  step_s = d * sc[s] the stored step, and ``step_s <= (hi_s - lo_s)/15 + dmin/15 + d`` where
  ``dmin ~ max_s(-lo_s)/63`` and ``d ~ max_s(hi_s + offset_s)/945``. A float32 slack of
  2^-20 * (|hi_s| + offset_s) covers rounding in the dequantizer. On Gaussian weights the
  relative RMS error is ~8.0e-2; ggml's search reaches ~7.2e-2 by trading the coverage guarantee
  for a weighted least-squares fit, so our bytes differ from llama-quantize's (both are valid
  Q4_K; any Q4_K reader dequantizes them with the formula above).
"""

from __future__ import annotations

import numpy as np

from dflash_ref.errors import FormatError

Q8_0_BLOCK, Q8_0_BYTES = 32, 34
QK_K = 256  # weights per K-quant super-block
Q4_K_BYTES = 144
Q6_K_BYTES = 210
F16_MAX = 65504.0


# ---------------------------------------------------------------- BF16


def float32_to_bf16_bits(x) -> np.ndarray:
    """float32 -> bf16 bit patterns (uint16, same shape): round to nearest, ties to even.

    NaN stays a quiet NaN; +-inf stay inf; finite values beyond the bf16 range round to inf,
    as torch and ggml do.
    """
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    is_nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # add half an ulp (ties to even), truncate
    quiet_nan = (u >> 16) | 0x40  # keep sign and payload top, force the quiet bit
    return np.where(is_nan, quiet_nan, rounded).astype(np.uint16)


def bf16_bits_to_float32(bits) -> np.ndarray:
    """bf16 bit patterns (uint16) -> float32, exactly (bf16 is the top half of a float32)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------- helpers


def _blocks(x, block: int, fmt: str) -> tuple[np.ndarray, tuple[int, ...]]:
    """x [..., n] float -> ([nblocks, block] float32, x.shape); n must be a multiple of block."""
    x = np.asarray(x)
    if x.ndim == 0 or not np.issubdtype(x.dtype, np.floating):
        raise FormatError(
            f"{fmt} quantizes float arrays of at least one dimension; got dtype {x.dtype}, "
            f"shape {x.shape}"
        )
    if x.shape[-1] % block != 0:
        raise FormatError(
            f"{fmt} needs the last dimension (the row, ggml ne0) to be a multiple of {block}; "
            f"got shape {x.shape}. Store this tensor as F32/F16/BF16 or pad the row"
        )
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.all(np.isfinite(x)):
        raise FormatError(f"{fmt}: the input has NaN or inf values; they cannot be quantized")
    return x.reshape(-1, block), x.shape


def _f16_round_up(v: np.ndarray, fmt: str) -> np.ndarray:
    """The smallest f16 >= v (v >= 0, float32), returned as float16."""
    if np.any(v > F16_MAX):
        raise FormatError(f"{fmt}: a block scale {float(v.max()):.3g} exceeds the f16 range")
    h = np.where(v > 0, v, np.float32(0)).astype(np.float16)  # -0.0 would store sign bit 0x8000
    low = h.astype(np.float32) < v
    h[low] = np.nextafter(h[low], np.float16(np.inf))
    return h


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C ``roundf``: halves round away from zero (np.round rounds halves to even)."""
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


# ---------------------------------------------------------------- Q8_0


def quantize_q8_0(x) -> np.ndarray:
    """x [..., n] float (n % 32 == 0) -> uint8 [..., n/32*34] Q8_0 blocks (layout above).

    Per block of 32: d = max|x| / 127 (float32), q = roundf(x * (1/d)) (q = 0 when d = 0),
    then d is stored as f16. This is ggml's ``quantize_row_q8_0_ref``.
    """
    blocks, shape = _blocks(x, Q8_0_BLOCK, "Q8_0")
    amax = np.abs(blocks).max(axis=1, keepdims=True)  # [nb, 1]
    d = amax / np.float32(127)
    if np.any(d > F16_MAX):
        raise FormatError(f"Q8_0: max|x| = {float(amax.max()):.3g} gives a scale beyond f16")
    with np.errstate(divide="ignore", over="ignore"):
        inv_d = np.float32(1) / d  # [nb, 1]; inf when d is 0 or a float32 subnormal
    # ggml also maps d = 0 to 1/d = 0. For a subnormal d (max|x| < 1.5e-36) its C code takes
    # roundf(x * inf) to int8, which is undefined; we store q = 0 there. d rounds to f16 0 in
    # that range, so the weights read back as 0 either way.
    inv_d = np.where(np.isfinite(inv_d), inv_d, np.float32(0))
    q = _round_half_away(blocks * inv_d).astype(np.int8)  # [nb, 32], |q| <= 127
    out = np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=1)
    return out.reshape(*shape[:-1], shape[-1] // Q8_0_BLOCK * Q8_0_BYTES)  # [nb, 34] -> [..]


def q8_0_error_bound(x) -> np.ndarray:
    """Per-element bound on |x - dequant(quantize_q8_0(x))|, same shape as x (see module doc)."""
    blocks, shape = _blocks(x, Q8_0_BLOCK, "Q8_0")
    d = np.abs(blocks).max(axis=1, keepdims=True) / 127.0
    bound = d * (0.5 + 127 * 2.0**-11) + 2.0**-17
    return np.broadcast_to(bound, blocks.shape).reshape(shape)


# ---------------------------------------------------------------- Q4_K


def _pack_q4_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """sc, m [nb, 8] ints in 0..63 -> scales [nb, 12] uint8 (bit layout in the module doc)."""
    sc, m = sc.astype(np.uint8), m.astype(np.uint8)
    lo_sc, hi_sc = sc[:, :4], sc[:, 4:]  # sub-blocks 0..3 / 4..7
    lo_m, hi_m = m[:, :4], m[:, 4:]
    first = lo_sc | ((hi_sc >> 4) << 6)  # bytes 0..3
    second = lo_m | ((hi_m >> 4) << 6)  # bytes 4..7
    third = (hi_sc & 0x0F) | ((hi_m & 0x0F) << 4)  # bytes 8..11
    return np.concatenate([first, second, third], axis=1)


def _q4_k_parameters(sub: np.ndarray):
    """sub [nb, 8, 32] float32 -> (d, dmin [nb] f16, sc, m [nb, 8] in 0..63).

    Per sub-block s: lo = min(0, min x), hi = max x; offset m_s = -lo >= 0. dmin and the six-bit
    m are rounded *up* so the stored offset dmin*m >= -lo, then the step needed to reach hi from
    -offset is rounded up the same way: the stored levels always cover [lo, hi].
    """
    lo = np.minimum(sub.min(axis=2), 0)  # [nb, 8]
    hi = sub.max(axis=2)  # [nb, 8]
    need_offset = -lo  # [nb, 8] >= 0
    dmin = _f16_round_up(need_offset.max(axis=1) / 63, "Q4_K")  # [nb]
    dmin32 = dmin.astype(np.float32)[:, None]  # [nb, 1]
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.where(dmin32 > 0, np.ceil(need_offset / dmin32), 0)  # [nb, 8]
    m = np.minimum(m, 63)
    offset = dmin32 * m.astype(np.float32)  # [nb, 8] stored offset, >= -lo
    need_step = (hi + offset) / 15  # [nb, 8] >= 0: 15 steps span [-offset, hi]
    d = _f16_round_up(need_step.max(axis=1) / 63, "Q4_K")  # [nb]
    d32 = d.astype(np.float32)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d32 > 0, np.ceil(need_step / d32), 0)  # [nb, 8]
    return d, dmin, np.minimum(sc, 63), m


def quantize_q4_k(x) -> np.ndarray:
    """x [..., n] float (n % 256 == 0) -> uint8 [..., n/256*144] Q4_K super-blocks.

    Min/max scheme with covering (rounded-up) scales; error bound and the comparison with ggml's
    search in the module docstring.
    """
    blocks, shape = _blocks(x, QK_K, "Q4_K")
    nb = blocks.shape[0]
    sub = blocks.reshape(nb, 8, 32)  # [nb, 256] -> [nb, 8 sub-blocks, 32]
    d, dmin, sc, m = _q4_k_parameters(sub)
    # Quantize with the values a reader will reconstruct (f16 d, dmin; six-bit sc, m), float32.
    step = d.astype(np.float32)[:, None] * sc.astype(np.float32)  # [nb, 8]
    offset = dmin.astype(np.float32)[:, None] * m.astype(np.float32)  # [nb, 8]
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step[..., None] > 0, np.rint((sub + offset[..., None]) / step[..., None]), 0)
    q = np.clip(q, 0, 15).astype(np.uint8)  # [nb, 8, 32]
    # Sub-blocks 2c (low nibble) and 2c+1 (high nibble) share the 32 bytes of chunk c.
    q = q.reshape(nb, 4, 2, 32)  # [nb, chunk, low/high, 32]
    qs = (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(nb, 128)  # [nb, 128]
    out = np.concatenate(
        [d.view(np.uint8).reshape(nb, 2), dmin.view(np.uint8).reshape(nb, 2),
         _pack_q4_k_scales(sc, m), qs],
        axis=1,
    )  # [nb, 2 + 2 + 12 + 128 = 144]
    return out.reshape(*shape[:-1], shape[-1] // QK_K * Q4_K_BYTES)


def q4_k_error_bound(x) -> np.ndarray:
    """Per-element bound on |x - dequant(quantize_q4_k(x))| from the stored steps (module doc).

    Recomputes the stored d, sc (the parameters are a pure function of x) and returns
    step_s / 2 plus the float32 slack, broadcast to x's shape.
    """
    blocks, shape = _blocks(x, QK_K, "Q4_K")
    sub = blocks.reshape(-1, 8, 32)
    d, dmin, sc, m = _q4_k_parameters(sub)
    step = d.astype(np.float64)[:, None] * sc  # [nb, 8]
    offset = dmin.astype(np.float64)[:, None] * m
    slack = 2.0**-20 * (np.abs(sub.max(axis=2)) + offset)
    bound = step / 2 + slack  # [nb, 8]
    return np.broadcast_to(bound[..., None], sub.shape).reshape(shape)


def q4_k_input_bound(x) -> np.ndarray:
    """A looser bound on the Q4_K error in terms of x alone (module doc), broadcast to x's shape.

    step_s <= (hi_s - lo_s)/15 + dmin/15 + d with dmin <= max(-lo)/63 * (1 + 2^-10) + 2^-24 and
    d <= max(hi + offset)/945 * (1 + 2^-10) + 2^-24 (f16 round-up of a positive value).
    """
    blocks, shape = _blocks(x, QK_K, "Q4_K")
    sub = blocks.reshape(-1, 8, 32).astype(np.float64)
    lo = np.minimum(sub.min(axis=2), 0)
    hi = sub.max(axis=2)
    up = 1 + 2.0**-10
    dmin = (-lo).max(axis=1, keepdims=True) / 63 * up + 2.0**-24  # [nb, 1]
    offset_max = -lo + dmin  # [nb, 8]
    d = (hi + offset_max).max(axis=1, keepdims=True) / 945 * up + 2.0**-24
    step = (hi - lo) / 15 + dmin / 15 + d  # [nb, 8]
    bound = step / 2 + 2.0**-20 * (np.abs(hi) + offset_max)
    return np.broadcast_to(bound[..., None], sub.shape).reshape(shape)
