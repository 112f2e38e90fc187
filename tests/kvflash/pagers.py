"""Small pagers and the write / read helpers shared by test_pager.py and test_pager_paging.py;
the tiny pooled targets shared by test_pooled_tree.py and test_pooled_snapshot.py."""

from __future__ import annotations

import numpy as np

from dflash_ref.kvflash import KVFlashPager
from dflash_ref.models.target import TargetModel
from dflash_ref.testing import Tolerance
from dflash_ref.tiny import write_tiny_target

CHUNK = dict(chunk_tokens=8, sink_chunks=1, tail_window_chunks=1)  # floor 32
POOLED = Tolerance(1e-5, 2e-5, "same visible keys; masked slots add exact zeros")


def tiny_targets(root, seed: int) -> dict[str, TargetModel]:
    """A tiny Qwen3, Qwen3.5 and Gemma 3 target each, capturing layers 0 and 2."""
    return {fam: TargetModel.from_pretrained(
        write_tiny_target(root / fam, fam, seed=seed, tie_word_embeddings=False),
        target_layer_ids=[0, 2]) for fam in ("qwen3", "qwen3_5", "gemma3")}


def random_ids(n, seed=0):
    """[n] token ids in the tiny vocabulary."""
    return np.random.default_rng(seed).integers(0, 256, size=n)


def small_pager(n_blocks: int, T: int = 4, sink: int = 1, tail: int = 1, **kw) -> KVFlashPager:
    """A pager with T-token chunks, one pooled layer of one head of width 2 unless overridden."""
    kw = {"layers": 1, "n_kv_heads": 1, "head_dim": 2, **kw}
    return KVFlashPager(n_blocks * T, T, sink, tail, **kw)


def write_positions(pager: KVFlashPager, positions, rng) -> dict[int, np.ndarray]:
    """Decode-style: slot_for then write random rows, one position at a time, in every pooled
    layer; return pos -> [L, 2, H, D]."""
    pool = pager.pool
    written = {}
    for p in positions:
        assert pager.slot_for(p) >= 0
        rows = rng.standard_normal((len(pool.layers), 2, 1, pool.n_kv_heads, pool.head_dim))
        rows = rows.astype(pool.dtype)
        for i, layer in enumerate(pool.layers):
            pager.write(layer, [p], rows[i, 0], rows[i, 1])
        written[p] = rows[:, :, 0]
    return written


def content_by_position(pager: KVFlashPager) -> dict[int, bytes]:
    """position -> bytes of its rows in every pooled layer, over all valid slots of the pool."""
    pos = pager.be.to_numpy(pager.slot_positions())
    data = pager.be.to_numpy(pager.pool.data)  # [L, 2, P, H, D]
    return {int(p): data[:, :, s].tobytes() for s, p in enumerate(pos) if p >= 0}
