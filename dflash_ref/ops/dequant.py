"""Dequantizers for the GGUF block formats Q8_0, Q4_K and Q6_K (family "dequant").

Every op takes the raw bytes of a tensor as stored in a GGUF file (uint8, any shape whose total
size is a whole number of blocks; typically ``ReaderTensor.data`` [out, in_bytes]) and the
output ``shape`` in NumPy order (e.g. [out, in]), and returns float32 of that shape. Blocks are
laid out along the row, rows one after another, so the i-th weight of the flattened output
comes from block i // block_size. The byte layouts are drawn in :mod:`dflash_ref.io.quant`
(Q8_0, Q4_K) and in :func:`dequantize_q6_k`.

Exactness: these are float32 products of the stored integers with f16 scales widened to float32
(exact), evaluated in the same order as ggml-quants.c and ``gguf.quants``; the results are
bit-identical to ``gguf.quants.dequantize`` (tolerance "exact" in the tests). The CuPy twins use
``__fmul_rn``/``__fsub_rn`` so that no fused multiply-add changes a rounding.
"""

from __future__ import annotations

import numpy as np

Q8_0_BLOCK, Q8_0_BYTES = 32, 34
QK_K = 256
Q4_K_BYTES = 144
Q6_K_BYTES = 210


def check_quant_input(raw, shape, block: int, type_size: int, fmt: str) -> tuple[int, ...]:
    """Check raw bytes against the output shape (both backends); return the shape as a tuple.

    ``raw`` must be uint8 with exactly ``n / block`` blocks of ``type_size`` bytes for the
    ``n = prod(shape)`` weights, and n a multiple of the block.
    """
    shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
    if raw.dtype != np.uint8:
        raise TypeError(f"dequantize_{fmt}: raw must be uint8 bytes, got dtype {raw.dtype}")
    n = int(np.prod(shape, dtype=np.int64))
    if n % block != 0 or raw.size != n // block * type_size:
        raise ValueError(
            f"dequantize_{fmt}: output shape {shape} ({n} weights) needs "
            f"{n // block} blocks of {type_size} bytes = {n // block * type_size} bytes with "
            f"{n} a multiple of {block}; got {raw.size} bytes"
        )
    return shape


def _as_blocks(raw, shape, block: int, type_size: int, fmt: str) -> tuple[np.ndarray, tuple]:
    """raw uint8 [...] -> ([nblocks, type_size] uint8, output shape), checking the sizes agree."""
    raw = np.asarray(raw)
    shape = check_quant_input(raw, shape, block, type_size, fmt)
    return np.ascontiguousarray(raw).reshape(-1, type_size), shape


def _f16(raw_pairs: np.ndarray) -> np.ndarray:
    """[..., 2] uint8 little-endian f16 -> [...] float32 (exact widening)."""
    return np.ascontiguousarray(raw_pairs).view("<f2")[..., 0].astype(np.float32)


def dequantize_q8_0(raw, shape) -> np.ndarray:
    """Q8_0: raw uint8 [nblocks*34] -> float32 [shape], prod(shape) = nblocks*32.

    Block: d (f16, bytes 0-1), qs[32] (int8, bytes 2-33); x[i] = d * qs[i].
    """
    blocks, shape = _as_blocks(raw, shape, Q8_0_BLOCK, Q8_0_BYTES, "q8_0")
    d = _f16(blocks[:, 0:2])[:, None]  # [nb, 1]
    qs = blocks[:, 2:].view(np.int8).astype(np.float32)  # [nb, 32]
    return (d * qs).reshape(shape)


def q4_k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unpack the 12 scale bytes of Q4_K/Q5_K: [nb, 12] uint8 -> sc, m [nb, 8] in 0..63.

    j = 0..3:  sc[j] = scales[j] & 63            m[j] = scales[j+4] & 63
               sc[j+4] = scales[j+8] & 15 | (scales[j] >> 6) << 4
               m[j+4]  = scales[j+8] >> 4 | (scales[j+4] >> 6) << 4
    """
    first, second, third = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]  # [nb, 4] each
    sc = np.concatenate([first & 63, (third & 15) | ((first >> 6) << 4)], axis=1)
    m = np.concatenate([second & 63, (third >> 4) | ((second >> 6) << 4)], axis=1)
    return sc, m


def dequantize_q4_k(raw, shape) -> np.ndarray:
    """Q4_K: raw uint8 [nblocks*144] -> float32 [shape], prod(shape) = nblocks*256.

    Super-block: d (f16), dmin (f16), scales[12] (:func:`q4_k_scale_min`), qs[128]. Sub-block
    s = 0..7 of 32 weights: x[32 s + l] = (d * sc[s]) * q - dmin * m[s], with q the low nibble
    of qs[32 (s // 2) + l] for even s and the high nibble for odd s.
    """
    blocks, shape = _as_blocks(raw, shape, QK_K, Q4_K_BYTES, "q4_k")
    nb = blocks.shape[0]
    d = _f16(blocks[:, 0:2])[:, None]  # [nb, 1]
    dmin = _f16(blocks[:, 2:4])[:, None]
    sc, m = q4_k_scale_min(blocks[:, 4:16])  # [nb, 8] each
    qs = blocks[:, 16:].reshape(nb, 4, 1, 32)  # [nb, chunk, 1, 32]
    nibbles = (qs >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)) & 15  # [nb, 4, lo/hi, 32]
    q = nibbles.reshape(nb, 8, 32).astype(np.float32)  # sub-block s = 2 chunk + lo/hi
    step = (d * sc.astype(np.float32))[..., None]  # [nb, 8, 1]
    offset = (dmin * m.astype(np.float32))[..., None]  # [nb, 8, 1]
    return (step * q - offset).reshape(shape)


def dequantize_q6_k(raw, shape) -> np.ndarray:
    """Q6_K: raw uint8 [nblocks*210] -> float32 [shape], prod(shape) = nblocks*256.

    Super-block (210 bytes)::

        byte 0          128         192            208    210
             | ql[128]   | qh[64]    | scales[16] i8 | d f16 |

    Weight e = 0..255: half h = e // 128, t = e % 128, quarter k = t // 32, l = t % 32;
    low 4 bits  = (ql[64 h + 32 (k & 1) + l] >> 4 (k >> 1)) & 15,
    high 2 bits = (qh[32 h + l] >> 2 k) & 3,
    q = (low | high << 4) - 32 in -32..31, and x[e] = (d * scales[e // 16]) * q.
    """
    blocks, shape = _as_blocks(raw, shape, QK_K, Q6_K_BYTES, "q6_k")
    nb = blocks.shape[0]
    ql = blocks[:, 0:128].reshape(nb, 2, 1, 2, 32)  # [nb, h, 1, k & 1, l]
    qh = blocks[:, 128:192].reshape(nb, 2, 1, 32)  # [nb, h, 1, l]
    scales = blocks[:, 192:208].view(np.int8).astype(np.float32)  # [nb, 16]
    d = _f16(blocks[:, 208:210])[:, None]  # [nb, 1]
    shift = np.array([0, 4], np.uint8).reshape(1, 1, 2, 1, 1)
    low = (ql >> shift) & 15  # [nb, h, k >> 1, k & 1, l]
    low = low.reshape(nb, 2, 4, 32)  # [nb, h, k, l]
    high = (qh >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)) & 3  # [nb, h, k, l]
    q = (low | (high << 4)).astype(np.float32) - 32  # [nb, h, k, l], e = 128 h + 32 k + l
    scale = (d * scales).reshape(nb, 16, 1)  # [nb, e // 16, 1]
    return (scale * q.reshape(nb, 16, 16)).reshape(shape)
