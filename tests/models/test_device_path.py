"""The target's per-step path on CuPy against NumPy (``gpu``): device-side positions and masks,
the pooled target, the scorer, RoPE far out, a non-default attention scale.

These are the paths the per-batch device arrays changed (dflash_ref/models/batch_arrays.py;
docs/performance.md, "What was fixed by construction") and no earlier ``gpu`` test ran: the
attention twin reading mask positions that never left the device, the pager writing through one
checked device copy of the slots, ``fill_slot_pos`` from a host table. The expected values are
the NumPy backend's (the reference ops), run on the same inputs; CPU tests count the copies
(tests/models/test_batch_arrays.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dflash_ref.backend import get_backend
from dflash_ref.config import TargetConfig, expected_tensors
from dflash_ref.kvflash.pager import KVFlashPager
from dflash_ref.kvflash.scorers import ModelTailScorer
from dflash_ref.models.batch_arrays import BatchArrays
from dflash_ref.models.target import TargetModel
from dflash_ref.models.tree import TreeArrays
from dflash_ref.ops.rope import rope, rope_inv_freq
from dflash_ref.testing import TOLERANCES, Tolerance, assert_close
from dflash_ref.tiny import tiny_target_config, tiny_weights

pytestmark = pytest.mark.gpu

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
# As tests/models/test_target.py::test_target_numpy_vs_cupy: cuBLAS against NumPy's BLAS (other
# summation orders) through 4 float32 layers; logits are O(10).
MODEL = Tolerance(1e-4, 1e-4, "cuBLAS vs NumPy BLAS through a few float32 layers")


def pair(family: str, seed: int = 11, **over) -> tuple[TargetModel, TargetModel]:
    """The same tiny target on NumPy and on CuPy."""
    cfg = TargetConfig.from_hf(tiny_target_config(family, **over))
    w = tiny_weights(expected_tensors(cfg), seed, cfg.norm_offset)
    return (TargetModel(cfg, w, backend="numpy", target_layer_ids=[0, 2]),
            TargetModel(cfg, w, backend="cupy", target_layer_ids=[0, 2]))


def steps(model: TargetModel, pager=None) -> list[np.ndarray]:
    """Prefill, decode steps, a verify with a rollback, a tree verify and its commit, more
    decode: every output's logits (host) and the captured features at the end."""
    be, rng = model.be, np.random.default_rng(5)
    ids = rng.integers(0, 256, 80)
    state = model.new_state(pager=pager)
    out = [model.forward(ids[:21], state).logits]
    out += [model.forward(ids[i:i + 1], state).logits for i in range(21, 33)]
    out.append(model.forward(ids[33:41], state).logits)  # a verify batch ...
    state.rollback(36)  # ... of which 3 rows are kept
    out.append(model.forward_tree(ids[36:41], [-1, 0, 0, 1, 3], state).logits)
    state.commit_path([0, 1, 3])
    out += [model.forward(ids[i:i + 1], state).logits for i in range(39, 52)]
    out.append(state.features.rows())
    return [be.to_numpy(a) for a in out]


def assert_runs_match(got, want, case: str) -> None:
    for i, (a, e) in enumerate(zip(got, want)):
        assert_close(a, e, MODEL, op="target on CuPy", tensor=f"output {i}", case=case)


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_pooled_target_on_cupy_matches_numpy_through_evictions(family):
    # Chunks of 8, sink 1, tail 1: a 32-slot pool (the floor) holds 4 chunks, so the 52-token
    # run pages chunks out; the full-attention layers attend over the pool in slot order with
    # masks built on the device from the slot table, the writes go through one device copy of
    # the checked slots per forward.
    cpu, gpu = pair(family)
    pagers = [KVFlashPager(32, chunk_tokens=8, sink_chunks=1, tail_window_chunks=1)
              for _ in range(2)]
    want, got = steps(cpu, pagers[0]), steps(gpu, pagers[1])
    assert pagers[1].stats.evictions > 0 and pagers[1].stats == pagers[0].stats
    np.testing.assert_array_equal(pagers[1].chunk_blocks(), pagers[0].chunk_blocks())
    np.testing.assert_array_equal(gpu.be.to_numpy(pagers[1].slot_positions()),
                                  pagers[0].fill_slot_pos())
    assert_runs_match(got, want, f"{family}, pooled")


@pytest.mark.parametrize("family", ["qwen3", "qwen3_5", "gemma3"])
def test_plain_cache_target_on_cupy_with_device_positions_and_masks(family):
    # Every mask kind the target builds on the device: causal, sliding window (gemma3), tree.
    cpu, gpu = pair(family)
    assert_runs_match(steps(gpu), steps(cpu), family)


def test_non_default_attention_scale_through_the_model():
    # Gemma's scale is query_pre_attn_scalar^-0.5: 24^-0.5 here against head_dim 16's default
    # 0.25, so a twin or layer that dropped the scale (used d^-0.5) would differ everywhere.
    cpu, gpu = pair("gemma3", query_pre_attn_scalar=24)
    assert gpu.config.attention_scale == pytest.approx(24 ** -0.5)
    assert_runs_match(steps(gpu), steps(cpu), "gemma3, scale 24^-0.5")


@pytest.mark.parametrize("case", ["gemma4_dense", "gemma4_ple_kvshare"])
def test_gemma4_on_cupy_scale_one_and_proportional_rope(case):
    # Gemma 4 attends with scale 1 (q and k are RMS-normed) and proportional RoPE on its full
    # layers, whose cos / sin table is built on the device once per batch.
    cpu = TargetModel.from_pretrained(FIXTURES / case)
    gpu = TargetModel.from_pretrained(FIXTURES / case, backend="cupy")
    assert gpu.config.attention_scale == 1.0
    ids = np.random.default_rng(2).integers(0, cpu.config.vocab_size, 40)
    runs = []
    for model in (cpu, gpu):
        state = model.new_state()
        logits = [model.forward(ids[:30], state).logits]
        logits += [model.forward(ids[i:i + 1], state).logits for i in range(30, 40)]
        runs.append([model.be.to_numpy(a) for a in logits])
    assert_runs_match(runs[1], runs[0], case)


# ---------------------------------------------------------------- ops fed device arrays


def test_attention_twin_reads_mask_positions_built_on_the_device(rng):
    # The masks of BatchArrays on CuPy hold device int32 positions (and device ancestors): the
    # twin must read them as they are and agree with the reference on the host-built masks.
    cpu_be, gpu_be = get_backend("numpy"), get_backend("cupy")
    import cupy as cp

    parents = np.array([-1, 0, 0, 1, 3, 3, 2])
    base, T = 37, 7
    positions = base + np.array([0, 1, 1, 2, 3, 3, 2])
    table = rng.permutation(np.concatenate([np.arange(base), [-1, -1, 40, 41]])).astype(np.int32)
    q = rng.standard_normal((T, 4, 64)).astype(np.float32)
    for name, build, n_keys in [
        ("causal", lambda a: a.causal_mask(base + T, None), base + T),
        ("sliding 5", lambda a: a.causal_mask(base + T, 5), base + T),
        ("committed over a slot table", lambda a: a.committed_mask(a.be.to_backend(table)),
         table.size),
        ("tree", lambda a: a.tree_mask(base, None), base + T),
        ("tree over a slot table", lambda a: a.tree_mask(a.be.to_backend(table), None),
         table.size + T),
    ]:
        tree = name.startswith("tree")
        pos = positions if tree else base + np.arange(T)
        k = rng.standard_normal((n_keys, 2, 64)).astype(np.float32)
        v = rng.standard_normal((n_keys, 2, 64)).astype(np.float32)
        outs = []
        for be in (cpu_be, gpu_be):
            arrays = (TreeArrays if tree else BatchArrays)(be, np.zeros(T, np.int64), pos, base,
                                                           parents=parents if tree else None)
            mask = build(arrays)
            if be is gpu_be:
                assert isinstance(mask.q_pos, cp.ndarray) and mask.q_pos.dtype == cp.int32
                assert isinstance(mask.k_pos, cp.ndarray) and mask.k_pos.flags.c_contiguous
            outs.append(be.ops.attention(be.to_backend(q), be.to_backend(k), be.to_backend(v),
                                         mask, scale=0.3))
        assert_close(outs[1], outs[0], "float32_attention", op="attention", case=name)


def test_rope_twin_at_positions_above_1e5(rng):
    # Tolerance float32_rope (rtol 1e-5, atol 1e-5): both backends form the same float32 angle,
    # float32(p) * inv_freq (one IEEE product from the same inv_freq table; p rounds to float32
    # the same way on both, above 2^24 too), so only cos / sin ulps and the final
    # x1 cos - x2 sin differ. Above p = 1e5 one float32 ulp of the angle is >= 2^-7 rad: a twin
    # that formed the angle another way (float64, an FMA, theta^e in the kernel) would miss by
    # up to ~4e-3 |x| there, hundreds of times the tolerance. The last check shows that scale.
    import cupy as cp

    gpu = get_backend("cupy")
    positions = np.array([100_000, 131_071, 262_144, 999_999, 2**24 + 1, 2**31 - 1])
    x = rng.standard_normal((positions.size, 4, 256)).astype(np.float32)
    for theta, rd, factor in [(1e6, None, 1.0), (1e7, 64, 1.0), (1e6, 128, 8.0)]:
        want = rope(x, positions, theta, rd, factor)
        case = f"theta={theta:g} rd={rd} factor={factor}"
        for pos in (positions, cp.asarray(positions.astype(np.int32))):  # host, device int32
            got = gpu.ops.rope(cp.asarray(x), pos, theta, rd, factor)
            assert_close(got, want, "float32_rope", op="rope", case=case)
    # The same rotation with the exact (float64) angle differs far beyond the tolerance.
    inv = rope_inv_freq(1e6, 256).astype(np.float64)
    angle = positions[:, None].astype(np.float64) * inv[None, :]  # [T, 128]
    x1, x2 = x[..., :128].astype(np.float64), x[..., 128:].astype(np.float64)
    exact = np.concatenate([x1 * np.cos(angle)[:, None] - x2 * np.sin(angle)[:, None],
                            x2 * np.cos(angle)[:, None] + x1 * np.sin(angle)[:, None]], axis=-1)
    tol = TOLERANCES["float32_rope"]
    beyond = np.abs(exact - rope(x, positions, 1e6)) - tol.rtol * np.abs(exact)  # [T, 4, 256]
    assert beyond[0].max() > 100 * tol.atol  # already at p = 1e5 (CPU: 6e-3)


def test_rope_twin_keeps_one_inv_freq_table_per_configuration():
    import cupy as cp

    from kernels_cupy.rope import _inv_freq_on_device

    dev = cp.cuda.Device().id
    a = _inv_freq_on_device(1e6, 128, 1.0, dev)
    assert _inv_freq_on_device(1e6, 128, 1.0, dev) is a
    np.testing.assert_array_equal(cp.asnumpy(a), rope_inv_freq(1e6, 128))


def test_fill_slot_pos_host_and_device_tables_agree():
    import cupy as cp

    gpu = get_backend("cupy")
    table = np.array([3, -1, 0, 5, -1, 1], np.int64)
    want = get_backend("numpy").ops.fill_slot_pos(table, 8, 48)
    for t in (table, cp.asarray(table)):
        np.testing.assert_array_equal(cp.asnumpy(gpu.ops.fill_slot_pos(t, 8, 48)), want)
    with pytest.raises(ValueError, match="distinct blocks"):
        gpu.ops.fill_slot_pos(np.array([1, 1]), 8, 48)


# ---------------------------------------------------------------- the scorer


@pytest.mark.parametrize("rope_qk", [False, True])
def test_scorer_on_cupy_matches_numpy(rope_qk):
    # attention_qk runs the target over the history with a probe tap; ModelTailScorer turns it
    # into chunk scores. Q/K as the model: MODEL's tolerance. Chunk scores are means of z-scores
    # of the smoothed max attention probabilities: q, k agreeing to ~1e-6 relative move a
    # probability (<= 0.11 here) by ~5e-7; divided by the smoothed maxima's spread (4e-3 for
    # this input, measured on CPU) that is ~1e-4 per token. 2e-3 keeps a margin and stays below
    # the smallest gap between two chunks' scores (1e-2 here), which decides what is evicted.
    cpu, gpu = pair("qwen3")
    ids = np.random.default_rng(9).integers(0, 256, 150)
    (qc, kc), (qg, kg) = (m.attention_qk(ids, n_tail=8, rope=rope_qk, piece_tokens=64)
                          for m in (cpu, gpu))
    assert_close(qg, qc, MODEL, op="attention_qk", tensor="q_tail", case=f"rope={rope_qk}")
    assert_close(kg, kc, MODEL, op="attention_qk", tensor="keys", case=f"rope={rope_qk}")
    want = ModelTailScorer(cpu, rope=rope_qk).chunk_scores(ids, 16)
    got = ModelTailScorer(gpu, rope=rope_qk).chunk_scores(ids, 16)
    assert_close(got, want, Tolerance(1e-3, 2e-3, "z-scores of float32 attention maxima"),
                 op="ModelTailScorer.chunk_scores", case=f"rope={rope_qk}")
