"""What one target forward copies to the device, counted on CPU; the masks it builds there.

The counts come from tests/device_counter.py: a NumPy backend whose arrays stand for device
memory and whose ledger records every place CuPy would copy a host array to the device (or read
one back). The expected counts are by hand from the design (dflash_ref/models/batch_arrays.py):
one packed copy of ids / positions / slots per forward, nothing per layer. Each test would catch
a per-layer host array handed to device code again (an ``np.arange`` in a mask, host positions
to ``rope``, host slots to a pager write): the count would grow with the depth.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dflash_ref.models.batch_arrays as batch_arrays
import dflash_ref.models.gemma4 as gemma4
from dflash_ref.config import TargetConfig, expected_tensors
from dflash_ref.kvflash.pager import KVFlashPager
from dflash_ref.models.batch_arrays import BatchArrays
from dflash_ref.models.target import TargetModel
from dflash_ref.models.tree import TreeArrays
from dflash_ref.ops.masks import tree_mask, visible
from dflash_ref.tiny import tiny_target_config, tiny_weights
from tests.device_counter import counted, counting_backend

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
PACK = "batch_arrays.py"  # where the one upload of a forward is made


def tiny_model(family: str, n_layers: int, backend, seed: int = 5) -> TargetModel:
    """A tiny ``family`` target with ``n_layers`` layers (the tiny pattern repeated)."""
    over = {"num_hidden_layers": n_layers}
    if family == "gemma3":
        over["layer_types"] = (["sliding_attention", "full_attention"] * n_layers)[:n_layers]
    if family == "qwen3_5":
        over["layer_types"] = (["linear_attention"] * 3 + ["full_attention"]) * (n_layers // 4)
    cfg = TargetConfig.from_hf(tiny_target_config(family, **over))
    weights = tiny_weights(expected_tensors(cfg), seed, cfg.norm_offset)
    return TargetModel(cfg, weights, backend=backend, target_layer_ids=[0])


def assert_one_pack(uploads, downloads, what: str) -> None:
    assert len(uploads) == 1 and PACK in uploads[0], f"{what}: uploads {uploads}"
    assert downloads == [], f"{what}: host reads {downloads}"


# ---------------------------------------------------------------- uploads per forward


@pytest.mark.parametrize(("family", "depths"), [
    ("qwen3", (1, 5)),  # dense, full attention
    ("gemma3", (2, 6)),  # sliding + full: two window kinds, two RoPE bases
    ("qwen3_5", (4, 8)),  # hybrid: GDN layers, partial rotary, output gate
])
def test_a_decode_step_copies_one_array_to_the_device_whatever_the_depth(family, depths):
    be = counting_backend()
    for n_layers in depths:
        model = tiny_model(family, n_layers, be)
        ref = tiny_model(family, n_layers, "numpy")
        state, ref_state = model.new_state(), ref.new_state()
        prompt = np.arange(3, 15)
        out, up, down, _ = counted(model.forward, prompt, state, logits_rows=slice(-1, None))
        assert_one_pack(up, down, f"{family} x{n_layers} prefill, last row only")
        np.testing.assert_array_equal(  # the emulation changes no number
            be.to_numpy(out.logits), ref.forward(prompt, ref_state, logits_rows=[-1]).logits)
        for t in range(3):
            _, up, down, _ = counted(model.forward, [20 + t], state)
            assert_one_pack(up, down, f"{family} x{n_layers} decode step {t}")
        _, up, down, _ = counted(model.forward, np.arange(40, 56), state)
        assert_one_pack(up, down, f"{family} x{n_layers} 16-row verify")


@pytest.mark.parametrize("case", ["gemma4_dense", "gemma4_ple_kvshare"])
def test_gemma4_decode_copies_one_array_and_builds_one_proportional_table(monkeypatch, case):
    # Proportional RoPE on the full layers (two of them in each fixture), KV sharing and PLE.
    calls = []
    real = gemma4.proportional_cos_sin
    monkeypatch.setattr(gemma4, "proportional_cos_sin",
                        lambda *a: calls.append(1) or real(*a))
    model = TargetModel.from_pretrained(FIXTURES / case, backend=counting_backend())
    full = [i for i, t in enumerate(model.config.layer_types) if t == "full_attention"]
    assert len(full) >= 2
    state = model.new_state()
    model.forward(np.arange(3, 20), state)
    for step in range(2):
        calls.clear()
        _, up, down, _ = counted(model.forward, [30 + step], state)
        assert_one_pack(up, down, f"{case} decode step {step}")
        assert len(calls) == 1, f"{len(calls)} proportional tables for one batch"


@pytest.mark.parametrize(("family", "n_layers", "kinds"), [("qwen3", 5, 1), ("gemma3", 6, 2)])
def test_masks_are_built_once_per_batch_and_window_kind(monkeypatch, family, n_layers, kinds):
    built = []
    real = batch_arrays.causal_mask
    monkeypatch.setattr(batch_arrays, "causal_mask",
                        lambda *a, **k: built.append(1) or real(*a, **k))
    model = tiny_model(family, n_layers, "numpy")
    state = model.new_state()
    for ids in (np.arange(3, 13), [7], [8]):
        built.clear()
        model.forward(ids, state)
        assert len(built) == kinds


def test_pooled_decode_copies_the_pack_and_the_slot_table_once_per_new_chunk():
    # Within a chunk a step uploads its pack (ids, positions, slots) only; the step that opens
    # a chunk changes the page mapping and uploads the slot table once more (fill_slot_pos,
    # checked on the host), whatever the number of pooled layers. The pool holds the whole
    # context: no eviction, no page copies.
    be = counting_backend()
    for n_layers in (1, 4):
        model = tiny_model("qwen3", n_layers, be)
        state = model.new_state(pager=KVFlashPager(128, chunk_tokens=4, sink_chunks=1,
                                                   tail_window_chunks=1))
        model.forward(np.arange(3, 13), state)
        for _ in range(9):
            opens_chunk = state.length % 4 == 0
            _, up, down, _ = counted(model.forward, [5], state)
            assert PACK in up[0] and down == [], (up, down)
            assert len(up) == 1 + opens_chunk, f"x{n_layers} at {state.length - 1}: {up}"
            if opens_chunk:
                assert "fill_slot_pos" in up[1]


@pytest.mark.parametrize("pooled", [False, True])
def test_a_tree_verify_copies_one_array_and_its_commit_one_more(pooled):
    be = counting_backend()
    for n_layers in (1, 4):
        model = tiny_model("qwen3", n_layers, be)
        pager = KVFlashPager(128, chunk_tokens=4, sink_chunks=1, tail_window_chunks=1)
        state = model.new_state(pager=pager if pooled else None)
        model.forward(np.arange(3, 12), state)
        _, up, down, _ = counted(model.forward_tree, [1, 2, 3, 4, 5], [-1, 0, 0, 1, 3], state)
        assert_one_pack(up, down, f"tree verify x{n_layers}")
        _, up, down, _ = counted(state.commit_path, [0, 1, 3, 4])
        # the path's node indices; a pooled commit also uploads the slots it writes
        assert len(up) == 1 + pooled and down == [], (up, down)


# ---------------------------------------------------------------- the masks built on the backend


def test_the_device_tree_mask_equals_the_tree_mask_builder():
    # TreeArrays.tree_mask builds the spec from device arrays; masks.tree_mask (host) is the
    # readable definition. Checked on a plain cache and on a pool whose slot table holds free
    # slots (-1), stale drafts (>= base) and committed positions in shuffled order.
    parents = np.array([-1, 0, 0, 1, 3, 3, 2])
    depth = np.array([0, 1, 1, 2, 3, 3, 2])
    base = 9
    arrays = TreeArrays(counting_backend(), np.arange(7), base + depth, base, parents=parents)
    for window in (None, 3):
        got = arrays.tree_mask(base, window)
        want = tree_mask(parents, base, window=window)
        np.testing.assert_array_equal(visible(got), visible(want))
    table = np.array([4, -1, 0, 12, 1, 2, 3, 9, 5, 6, -1, 7, 8, 10], np.int32)  # 12, 10: stale
    got = arrays.tree_mask(arrays.be.to_backend(table), None)
    want = tree_mask(parents, base, k_pos=np.concatenate([table, base + depth]),
                     node_slots=table.size + np.arange(7))
    np.testing.assert_array_equal(visible(got), visible(want))


def test_batch_positions_must_fit_the_kernels_int32():
    be = counting_backend()
    with pytest.raises(ValueError, match=r"2\^31 - 1"):
        BatchArrays(be, [1, 2], [2**31 - 1, 2**31], start=2**31 - 1)
    arrays = BatchArrays(be, [1], [2**31 - 1], start=2**31 - 1)
    assert arrays.positions.dtype == np.int32 and int(arrays.positions[0]) == 2**31 - 1
