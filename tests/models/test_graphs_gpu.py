"""A target step captured as a CUDA graph on CuPy and replayed (``gpu``; issue 27, item 5).

The CPU halves are tests/models/test_graphs.py: the same :func:`step_logits` schedule (a
prefill, then decode steps and 16-token verify blocks with rollbacks) on NumPy, where a replay
calls the first step's function again, and the recording backend's graph-safety checks. Here the
step is really captured (``kernels_cupy/graphs.py``) and replayed:

- replay == eager (``graphs=False``, the same fixed stores) bit for bit over 64 steps: the
  kernels are deterministic (no atomics), so any difference is a replay that read a stale input,
  wrote to memory another array now owns, or missed a launch;
- a draft step (``FixedDraftCache``) replayed == eager bit for bit over 64 drafts, and greedy
  ``generate`` through a graphed state (verify and draft steps replayed) emits the eager tokens;
- the graphed state against the NumPy reference with growing caches: the tokens, and the logits
  to the model tolerance of tests/models/test_device_path.py (another summation order).

A failure to capture (a cuBLAS call, a host synchronisation inside the step) raises from CuPy
at the first step of a shape.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.backend import get_backend
from dflash_ref.models.graphs import StepGraphs
from dflash_ref.spec_decode.loop import generate
from dflash_ref.testing import Tolerance, assert_close
from tests.models.test_batch_arrays import tiny_model
from tests.models.test_graphs import BLOCK, CAPACITY, draft_logits, step_logits, tiny_pair

pytestmark = pytest.mark.gpu

MODEL = Tolerance(1e-4, 1e-4, "CuPy kernels vs NumPy BLAS through a few float32 layers")


def test_capture_replays_ops_over_an_updated_buffer():
    # The smallest case first: a norm and a projection over a buffer rewritten between replays.
    be, rng = get_backend("cupy"), np.random.default_rng(0)
    x = be.to_backend(rng.standard_normal((4, 64)).astype(np.float32))
    g = be.to_backend(rng.standard_normal(64).astype(np.float32))
    w = be.to_backend(rng.standard_normal((96, 64)).astype(np.float32))

    def step():
        return be.ops.linear(be.ops.rms_norm(x, g, 1e-6, 0.0), w)  # [4, 96]

    replay = be.capture(step)
    for _ in range(3):
        x[...] = be.to_backend(rng.standard_normal((4, 64)).astype(np.float32))
        got = be.to_numpy(replay())
        assert np.array_equal(got, be.to_numpy(step()))


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_replay_equals_eager_bit_for_bit_over_64_steps(family):
    model = tiny_model(family, 2, get_backend("cupy"))
    graphed = model.new_state(kv_capacity=CAPACITY, graphs=True)
    a = step_logits(model, graphed, 64)
    b = step_logits(model, model.new_state(kv_capacity=CAPACITY), 64)
    assert graphed.runner.captured == [1, BLOCK]
    for i, (x, y) in enumerate(zip(a, b)):
        assert np.array_equal(x, y), f"{family} step {i}: replay differs from eager"


def test_graphed_steps_match_the_numpy_reference():
    cupy_model = tiny_model("qwen3", 2, get_backend("cupy"))
    numpy_model = tiny_model("qwen3", 2, get_backend("numpy"))
    a = step_logits(cupy_model, cupy_model.new_state(kv_capacity=CAPACITY, graphs=True), 24)
    b = step_logits(numpy_model, numpy_model.new_state(), 24)
    for i, (x, y) in enumerate(zip(a, b)):
        assert_close(x, y, MODEL, op="a graphed qwen3 step", tensor="logits", case=f"step {i}")
        assert np.array_equal(x.argmax(-1), y.argmax(-1)), f"step {i}"


def test_draft_replay_equals_eager_bit_for_bit_over_64_drafts(tmp_path):
    _, drafter = tiny_pair(tmp_path, backend="cupy")
    drafts = StepGraphs(drafter.be)
    cache = drafter.fixed_cache(CAPACITY, run_step=drafts.replay)
    a = draft_logits(drafter, cache, 64)
    b = draft_logits(drafter, drafter.fixed_cache(CAPACITY), 64)
    assert drafts.captured == [(drafter.block_size, False)]
    for i, (x, y) in enumerate(zip(a, b)):
        assert np.array_equal(x, y), f"draft {i}: replay differs from eager"


def test_generate_through_graphs_emits_the_eager_tokens(tmp_path):
    target, drafter = tiny_pair(tmp_path, backend="cupy")
    prompt = np.arange(3, 20)
    for d in (None, drafter):
        state = target.new_state(kv_capacity=CAPACITY, graphs=True)
        graphed = generate(target, d, prompt, 48, state=state)
        eager = generate(target, d, prompt, 48,  # the same fixed stores, every step eager
                         state=target.new_state(kv_capacity=CAPACITY))
        assert graphed.tokens == eager.tokens
        assert state.runner.captured, "no step was captured"
