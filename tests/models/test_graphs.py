"""A target step as one CUDA graph (issue 27, item 5; dflash_ref/models/graphs.py), on the CPU.

What a replay needs, and what each test here would catch:

- replay == eager, bit for bit, over many decode and verify steps with rollbacks: on NumPy a
  "replay" calls the step function made at the first step of its shape again
  (``capture_by_calling``), so a step that reads its first step's ids, positions, a length or a
  slice bound gives other logits than an eager step (``test_a_growing_cache_does_not_replay``
  shows the check fires);
- the step body is graph-safe on the recording backend (tests/device_counter.py): no upload, no
  download, no cuBLAS-sized ``linear``, the same tape at every replay (a CUDA graph repeats its
  recorded arguments), no store or input buffer reallocated; outside the body one upload per
  step (the per-step inputs) and nothing else;
- the fixed-capacity stores give the growing caches' tokens (their logits to float32 rounding:
  attention then sums over the C slots, the masked ones adding exact zeros in another order).

The GPU halves (capture on CuPy, replay == eager bit for bit over 64 steps) are
tests/models/test_graphs_gpu.py; they run :func:`step_logits` on CuPy, this file on NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.backend import get_backend
from dflash_ref.errors import ConfigError, StateError
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.fixed_stores import FixedCacheStore
from dflash_ref.models.graphs import GRAPH_MAX_ROWS, GraphRunner, StepGraphs
from dflash_ref.models.state import EagerRunner
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target
from kernels_cupy.linear_plan import MAX_ROWS
from tests.device_counter import LEDGER, counting_backend
from tests.models.test_batch_arrays import tiny_model

CAPACITY = 320
BLOCK = 16  # the verify width of the tests (the demo pair's block size)
PROMPT = np.arange(3, 15)


def schedule(n_steps: int, seed: int = 0) -> list[tuple[str, int]]:
    """Decode and verify steps in a DFlash-like order: ("decode", 0) runs the last token;
    ("verify", a) runs a 16-token block and keeps its first a + 1 rows."""
    rng = np.random.default_rng(seed)
    return [("verify", int(rng.integers(0, BLOCK))) if i % 3 == 2 else ("decode", 0)
            for i in range(n_steps)]


def step_logits(model, state, n_steps: int, prompt=PROMPT, seed: int = 0) -> list:
    """Host logits of a prefill and ``n_steps`` steps of :func:`schedule` on ``state``: decode
    steps feed the argmax back; verify blocks are pseudo-random tokens, rolled back to the kept
    rows. The same calls for every state, so two states' lists compare step by step."""
    be, rng = model.be, np.random.default_rng(seed + 1)
    vocab = model.config.vocab_size
    out = [be.to_numpy(model.forward(prompt, state, logits_rows=slice(-1, None)).logits)]
    token = int(out[-1][-1].argmax())
    for kind, keep in schedule(n_steps, seed):
        if kind == "decode":
            out.append(be.to_numpy(model.forward([token], state).logits))
            token = int(out[-1][-1].argmax())
        else:
            start = state.length
            block = np.concatenate([[token], rng.integers(0, vocab, BLOCK - 1)])
            out.append(be.to_numpy(model.forward(block, state).logits))
            state.rollback(start + keep + 1)
            token = int(out[-1][keep].argmax())
    return out


def test_replay_equals_eager_bit_for_bit_over_many_steps():
    model = tiny_model("qwen3", 2, get_backend("numpy"))
    graphed = model.new_state(kv_capacity=CAPACITY, graphs=True)
    eager = model.new_state(kv_capacity=CAPACITY)  # graphs=False: the same stores, eager
    a, b = step_logits(model, graphed, 64), step_logits(model, eager, 64)
    assert graphed.runner.captured == [1, BLOCK]  # one recording per shape, replayed after
    for i, (x, y) in enumerate(zip(a, b)):
        assert np.array_equal(x, y), f"step {i}: replay differs from eager"


def test_fixed_stores_give_the_growing_caches_tokens():
    model = tiny_model("qwen3", 2, get_backend("numpy"))
    fixed = step_logits(model, model.new_state(kv_capacity=CAPACITY, graphs=True), 30)
    grown = step_logits(model, model.new_state(), 30)
    for i, (x, y) in enumerate(zip(fixed, grown)):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5, err_msg=f"step {i}")
        assert np.array_equal(x.argmax(-1), y.argmax(-1)), f"step {i}"


def test_sliding_window_layers_replay_too():
    model = tiny_model("gemma3", 2, get_backend("numpy"))  # sliding and full layers
    a = step_logits(model, model.new_state(kv_capacity=CAPACITY, graphs=True), 20)
    b = step_logits(model, model.new_state(), 20)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5)


def test_a_growing_cache_does_not_replay():
    # The emulation is not vacuous: growing caches and a new input array per batch, forced
    # through the step graphs, replay the first step's inputs and diverge from eager.
    model = tiny_model("qwen3", 2, get_backend("numpy"))
    wrong = model.new_state()
    wrong.runner = GraphRunner(model.be)
    a, b = step_logits(model, wrong, 4), step_logits(model, model.new_state(), 4)
    assert any(not np.array_equal(x, y) for x, y in zip(a, b))


def _persistent(state) -> list:
    return [s.kv for s in state.kv_stores] + [s.k_pos for s in state.kv_stores] + list(
        state.runner.buffers.values())


def test_the_step_body_is_graph_safe_on_the_recording_backend():
    be = counting_backend()
    model = tiny_model("qwen3", 3, be)
    state = model.new_state(kv_capacity=CAPACITY, graphs=True)
    model.forward(np.arange(3, 25), state, logits_rows=slice(-1, None))  # prefill: eager
    persistent = [(id(a), a.shape) for a in _persistent(state)]
    per_forward = []
    for step, (kind, keep) in enumerate(schedule(12)):
        LEDGER.reset()
        start = state.length
        ids = [7] if kind == "decode" else np.arange(30 + step, 30 + step + BLOCK)
        model.forward(ids, state)
        per_forward.append((list(LEDGER.uploads), list(LEDGER.downloads), list(LEDGER.steps)))
        if kind == "verify":
            state.rollback(start + keep + 1)
    tapes: dict[int, tuple] = {}
    for uploads, downloads, steps in per_forward:
        (rec,) = steps  # every decode / verify forward replays exactly one step
        assert not rec.uploads and not rec.downloads, (rec.uploads, rec.downloads)
        assert len(uploads) == 1 and "batch_arrays.py" in uploads[0], uploads  # the inputs
        assert not downloads, downloads
        linear_rows = [sig[0][0][1][0] for what, sig in rec.tape if what == "op linear"]
        assert linear_rows and max(linear_rows) <= GRAPH_MAX_ROWS  # never cuBLAS
        rows = linear_rows[0]
        assert tapes.setdefault(rows, rec.tape) == rec.tape, "a replay's arguments moved"
    assert sorted(tapes) == [1, BLOCK]
    assert [(id(a), a.shape) for a in _persistent(state)][: len(persistent)] == persistent


def test_the_tape_sees_a_moving_slice_bound():
    # What the tape test would catch: the growing cache's append writes at rows len..len+T-1
    # (``write_kv(..., start=len)``), a host value that moves every step.
    be = counting_backend()
    model = tiny_model("qwen3", 2, be)
    state = model.new_state()
    state.runner = GraphRunner(be)
    model.forward(np.arange(3, 15), state)
    LEDGER.reset()
    for _ in range(3):
        model.forward([5], state)
    tapes = [rec.tape for rec in LEDGER.steps]
    assert len(tapes) == 3
    moved = [(a, b) for a, b in zip(tapes[0], tapes[1]) if a != b]
    assert moved and moved[0][0][0] == "op write_kv"  # KVCache.append's start=len
    assert dict(moved[0][0][1][1])["start"] + 1 == dict(moved[0][1][1][1])["start"]
    LEDGER.reset()
    state.runner = EagerRunner()
    n = state.length
    model.forward([5], state)
    assert state.length == n + 1 and not LEDGER.steps  # eager: nothing captured or replayed


def test_graph_rows_are_the_linear_kernels():
    assert GRAPH_MAX_ROWS == MAX_ROWS


def test_eager_step_graphs_call_the_step_each_time():
    calls = []
    graphs = StepGraphs(get_backend("numpy"), enabled=False)
    for i in range(3):
        assert graphs.run(1, lambda i=i: calls.append(i) or i) == i
    assert calls == [0, 1, 2] and graphs.captured == []


def test_capture_runs_a_warm_up_then_replays_the_first_step_function():
    calls = []
    graphs = StepGraphs(get_backend("numpy"))
    assert graphs.run("k", lambda: calls.append("first") or 1) == 1
    assert graphs.run("k", lambda: calls.append("second") or 2) == 1  # the recording, not 2
    assert calls == ["first"] * 3 and graphs.captured == ["k"]


def test_bad_graph_states_are_refused_with_the_fix():
    model = tiny_model("qwen3", 2, get_backend("numpy"))
    with pytest.raises(ConfigError, match="kv_capacity"):
        model.new_state(graphs=True)
    state = model.new_state(kv_capacity=16, graphs=True)
    with pytest.raises(StateError, match="larger kv_capacity"):
        model.forward(np.arange(3, 20), state)
    with pytest.raises(StateError, match="without kv_capacity"):
        model.forward_tree([3, 4, 5], [-1, 0, 0], model.new_state(kv_capacity=16))
    with pytest.raises(ConfigError, match="positive int"):
        model.new_state(kv_capacity=0)
    big = model.new_state(kv_capacity=64)
    model.forward(np.arange(3, 40), big)
    with pytest.raises(StateError, match="kv_capacity=16"):
        state.restore(big.snapshot())
    hybrid = tiny_model("qwen3_5", 4, get_backend("numpy"))
    with pytest.raises(ConfigError, match="Gated"):
        hybrid.new_state(kv_capacity=64, graphs=True)


def test_a_fixed_store_snapshots_and_restores():
    model = tiny_model("qwen3", 2, get_backend("numpy"))
    state = model.new_state(kv_capacity=64, graphs=True)
    model.forward(np.arange(3, 15), state)
    snap = state.snapshot()
    a = model.forward([9], state).logits
    other = model.new_state(kv_capacity=64, graphs=True)
    other.restore(snap)
    assert np.array_equal(model.forward([9], other).logits, a)
    assert all(isinstance(s, FixedCacheStore) for s in other.kv_stores)


# ---------------------------------------------------------------------------------- draft steps


def tiny_pair(tmp_path, backend="numpy", layers: int = 2):
    """A tiny Qwen3 target and a bound tiny DFlash drafter on ``backend``."""
    t = write_tiny_target(tmp_path / "t", "qwen3", seed=3)
    d = write_tiny_drafter(tmp_path / "d", t, seed=4, num_hidden_layers=layers)
    target = TargetModel.from_pretrained(t, backend=backend)
    return target, DFlashDrafter.from_pretrained(d, target)


def graphed_draft_cache(drafter, capacity: int, window=None):
    """A fixed-row draft cache whose draft step is captured and replayed (what a graphed state's
    runner hands the drafter, there without a window)."""
    return drafter.fixed_cache(capacity, window, run_step=StepGraphs(drafter.be).replay)


def draft_logits(drafter, cache, n_steps: int, seed: int = 0) -> list:
    """Host logits of ``n_steps`` drafts on ``cache``: 20 context positions, then per step a
    draft at s and one more committed position (crop to s, extend by one feature row)."""
    be, rng = drafter.be, np.random.default_rng(seed)
    feats = rng.standard_normal((20 + n_steps, drafter.fc.shape[1])).astype(np.float32)
    cache.extend(be.to_backend(feats[:20]), np.arange(20))
    out = []
    for s in range(20, 20 + n_steps):
        out.append(be.to_numpy(cache.forward_block(int(rng.integers(0, 100)), s)))
        cache.crop(s)
        cache.extend(be.to_backend(feats[s:s + 1]), [s])
    return out


def test_draft_replay_equals_eager_and_the_growing_cache(tmp_path):
    _, drafter = tiny_pair(tmp_path)
    graphed = draft_logits(drafter, graphed_draft_cache(drafter, CAPACITY), 24)
    eager = draft_logits(drafter, drafter.fixed_cache(CAPACITY), 24)
    grown = draft_logits(drafter, drafter.new_cache(), 24)
    for i, (x, y, z) in enumerate(zip(graphed, eager, grown)):
        assert np.array_equal(x, y), f"draft {i}: replay differs from eager"
        np.testing.assert_allclose(x, z, rtol=0, atol=1e-5, err_msg=f"draft {i}")


def test_a_windowed_fixed_draft_cache_hides_the_old_context(tmp_path):
    _, drafter = tiny_pair(tmp_path)
    a = draft_logits(drafter, graphed_draft_cache(drafter, CAPACITY, window=8), 10)
    b = draft_logits(drafter, drafter.new_cache(window=8), 10)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-5)


def test_the_draft_step_is_graph_safe_on_the_recording_backend(tmp_path):
    _, drafter = tiny_pair(tmp_path, backend=counting_backend())
    cache = graphed_draft_cache(drafter, 64)
    LEDGER.reset()
    draft_logits(drafter, cache, 6)
    assert len(LEDGER.steps) == 6
    for rec in LEDGER.steps:
        assert not rec.uploads and not rec.downloads, (rec.uploads, rec.downloads)
        assert rec.tape == LEDGER.steps[0].tape, "a draft replay's arguments moved"
        rows = [sig[0][0][1][0] for what, sig in rec.tape if what == "op linear"]
        assert rows and max(rows) <= GRAPH_MAX_ROWS


def test_generate_with_a_graphed_state_emits_the_eager_tokens(tmp_path):
    target, drafter = tiny_pair(tmp_path)
    prompt = np.arange(3, 20)
    state = target.new_state(kv_capacity=CAPACITY, graphs=True)
    spec = generate(target, drafter, prompt, 40, state=state)
    assert spec.tokens == generate(target, drafter, prompt, 40).tokens
    assert state.runner.captured == [drafter.block_size]  # every step a verify of the block
    plain = generate(target, None, prompt, 30,
                     state=target.new_state(kv_capacity=CAPACITY, graphs=True))
    assert plain.tokens == generate(target, None, prompt, 30).tokens


def test_a_graphed_state_runs_the_lazy_verify_whole(tmp_path):
    # Catches: a state that replays recorded steps handed a lazy verify's groups (then nothing is
    # recorded or replayed). The tiny target's vocabulary is below LAZY_MIN_VOCAB, so the lazy
    # rule is named here as a large-vocabulary target gets it by default.
    from dflash_ref.spec_decode.lazy_verify import LazyChainVerifier

    target, drafter = tiny_pair(tmp_path)
    prompt = np.arange(3, 20)
    state = target.new_state(kv_capacity=CAPACITY, graphs=True)
    spec = generate(target, drafter, prompt, 40, state=state, verify=LazyChainVerifier())
    assert spec.tokens == generate(target, drafter, prompt, 40).tokens
    assert state.runner.captured == [drafter.block_size]  # the whole block, recorded once
