"""Kernels per decoder layer of a decode, a verify and a draft step, counted on the CPU (issue 27).

On a GPU each kernel launch costs host time (about 13 us through an op on an H200, 5.7 us for a
bare ``RawKernel``; docs/performance.md): a step of 36 layers at 18 launches a layer spent more
time launching than the GPU spent computing. tests/device_counter.py's backend records, for every
op call, the kernels its CuPy twin starts (``TWIN_LAUNCHES``), plus every array expression, copy
and assignment that would start one. The per-layer count is the difference between two depths
(what the embedding, the final norm and the head add cancels).

The ceilings are the counts of this tree, worked out by hand from the layer's code: a Qwen3 decode
layer is the stacked q/k/v product, the q/k norms and both RoPEs as one ``qk_norm_rope``
(models/fused.py ``FusedNormRope``), the K/V write as one ``write_kv`` (K and V in one storage
``[2, C, Hkv, D]``, models/cache.py), the attention (one launch: decode attention v3 merges its
key splits inside the kernel; 2 with v2's combine before), o_proj, two add+norms, the stacked
gate/up product, SwiGLU and down_proj: 10 (11 with v2's combine, 12 before the one K/V write, 15
before the fused q/k op, 18 before the stacking); a captured decode step over the fixed-capacity
stores (``FixedKV``: ``write_kv`` at the device positions, where a stack and a scatter were two)
the same 10. The twins of ``qk_norm_rope``, ``swiglu``, ``geglu`` and ``write_kv`` read the
stacked products' column slices in place (``READS_STRIDED_ROWS``), so a verify of 16 rows adds
only what the KV cache's growth launches here (``KVCache.append``: one zero-filled allocation and
one copy of the K and V rows when the rows outgrow the capacity, which doubles; the
fixed-capacity stores of issue 27 item 5 remove them): 12. Gemma 3 runs the same count: its
sandwich norms join the fused adds (``norm_add_rms_norm``: post norm, add, next norm) and its
GeGLU is one ``geglu`` launch where the NumPy expression was nine (26 before). A drafter layer:
the input norm, the stacked q/k/v product, ``qk_norm_rope``, the cache's growth (2) and the
block's K/V write into its spare rows (1), the attention (1), o_proj, the fused add +
post-attention norm, gate/up, SwiGLU, down_proj and the residual add: 13. A Qwen3.5 GDN layer's
gates are one ``gdn_gates`` launch (eleven array operations before) and its full-attention
layers' output gate one ``sigmoid_gate`` (five), its q and k heads one ``l2_norm``: 12.5 per
layer over the 3:1 hybrid (23.25 before). The attention's launches follow the twin's routing by
shape (tests/device_counter.py ``TWIN_LAUNCHES``: v2 and its combine, 2, where v3's plan refuses
the shape, as for d = 512). A count that grows fails here: a new per-layer launch must be a
decision, not an accident.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target
from tests.device_counter import LEDGER, counted, counting_backend
from tests.models.test_batch_arrays import tiny_model

FIXTURES = Path(__file__).parent / "fixtures" / "hf"

# family -> (decode, 16-row verify) kernels per layer (the hybrid: per 4 layers / 4)
CEILINGS = {"qwen3": (10, 12), "gemma3": (10, 12), "qwen3_5": (12.5, 16.75)}
DRAFT_PER_LAYER = 13  # a drafter layer's kernels for one block (context K/V written by extend)
FIXTURE_DECODE = {"gemma4_dense": 131, "gemma4_ple_kvshare": 209, "qwen35_moe": 235}
GRAPHED_DECODE = 10  # a Qwen3 decode layer in a captured step (fixed-capacity stores)


def per_layer(family: str, rows: int) -> float:
    """Kernels per layer of one forward of ``rows`` new tokens after a 12-token prompt."""
    be, counts = counting_backend(), {}
    depths = (4, 8) if family == "qwen3_5" else (2, 4)
    for n in depths:
        model = tiny_model(family, n, be)
        state = model.new_state()
        model.forward(np.arange(3, 15), state)
        counts[n] = len(counted(model.forward, np.arange(20, 20 + rows), state)[3])
    (a, ca), (b, cb) = counts.items()
    return (cb - ca) / (b - a)


@pytest.mark.parametrize("family", sorted(CEILINGS))
def test_kernels_per_layer_of_decode_and_verify(family):
    decode, verify = CEILINGS[family]
    assert per_layer(family, 1) <= decode
    assert per_layer(family, 16) <= verify


def test_a_qwen3_decode_layer_runs_one_product_per_stacked_projection():
    # The stacked weights of issue 27: q/k/v one product, gate/up one, then o_proj and down_proj.
    be = counting_backend()
    model = tiny_model("qwen3", 3, be)
    state = model.new_state()
    model.forward(np.arange(3, 15), state)
    seen = counted(model.forward, [20], state)[3]
    linear = [s for s in seen if s.startswith("op linear")]
    assert len(linear) == 3 * 4 + 1, linear  # per layer qkv, o, gate_up, down; then lm_head
    assert not [s for s in seen if "matmul" in s], "a projection bypassed ops.linear"


@pytest.mark.parametrize("case", sorted(FIXTURE_DECODE))
def test_fixture_families_decode_launches(case):
    # The HF fixtures have one depth each (4-6 layers): the whole decode forward is pinned.
    model = TargetModel.from_pretrained(FIXTURES / case, backend=counting_backend())
    state = model.new_state()
    model.forward(np.arange(3, 20), state)
    assert len(counted(model.forward, [30], state)[3]) <= FIXTURE_DECODE[case]


def test_kernels_per_drafter_layer_of_a_draft_step(tmp_path):
    be, counts = counting_backend(), {}
    t = write_tiny_target(tmp_path / "t", "qwen3", seed=3)
    for n in (1, 3):
        d = write_tiny_drafter(tmp_path / f"d{n}", t, seed=4, num_hidden_layers=n)
        target = TargetModel.from_pretrained(t, backend=be)
        drafter = DFlashDrafter.from_pretrained(d, target)
        cache = drafter.new_cache()
        width = drafter.fc.shape[1]
        cache.extend(be.to_backend(np.ones((12, width), np.float32)), np.arange(12))
        counts[n] = len(counted(cache.forward_block, 7, 12)[3])
    assert (counts[3] - counts[1]) / 2 <= DRAFT_PER_LAYER


def test_a_graphed_qwen3_decode_layer_writes_its_k_and_v_in_one_launch():
    # The captured step of a state made with kv_capacity: FixedKV writes K and V with one
    # write_kv at the device positions (a stack and a scatter_rows before: 12).
    be, counts = counting_backend(), {}
    for n in (2, 4):
        model = tiny_model("qwen3", n, be)
        state = model.new_state(kv_capacity=64, graphs=True)
        model.forward(np.arange(3, 15), state, logits_rows=slice(-1, None))  # prefill: eager
        model.forward([5], state)  # captures the 1-row step
        LEDGER.reset()
        model.forward([6], state)  # replays it
        (step,) = LEDGER.steps
        counts[n] = step.launches
        assert sum("op write_kv" in s for s in step.launches) == n
        assert not [s for s in step.launches if "scatter_rows" in s or "xp.stack" in s]
    assert (len(counts[4]) - len(counts[2])) / 2 <= GRAPHED_DECODE
