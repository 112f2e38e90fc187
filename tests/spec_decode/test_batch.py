"""Several sequences at once (docs/serving.md): generate_batch == each sequence's own run.

Properties (hypothesis): for random mixes of prompt lengths, block sizes, stop tokens (finish
times) and families, every sequence's tokens and acceptance lengths equal its single-sequence
``generate`` run. The closed-form copy drafter of test_feature_drafter.py accepts every draft
only when it reads its own sequence's features; features interleaved across sequences (the
seeds' flat shared buffer) would change its acceptance lengths, which this test compares exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash_ref import generate_batch
from dflash_ref.models.batch import forward_batch
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.ops.sampling import SamplingParams
from dflash_ref.spec_decode.loop import generate
from dflash_ref.testing import Tolerance, assert_close
from tests.spec_decode.drafters import FAMILIES, tiny_pairs
from tests.spec_decode.test_feature_drafter import _build_drafter, _build_target

JOINED = Tolerance(1e-5, 2e-5, "one matmul over the joined rows instead of one per sequence")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch")
    out = tiny_pairs(root, 61, 62, block_size=8)
    rng = np.random.default_rng(0)
    perm = _build_target(root / "copy_t", rng)
    _build_drafter(root / "copy_d", root / "copy_t")
    target = TargetModel.from_pretrained(root / "copy_t")
    out["copy"] = (target, DFlashDrafter.from_pretrained(root / "copy_d", target), perm)
    return out


def _ids(n, seed):
    return np.random.default_rng(seed).integers(0, 250, size=n)


@pytest.mark.parametrize("fam", list(FAMILIES))
def test_forward_batch_equals_one_forward_per_sequence(models, fam):
    target, _ = models[fam]
    lens = [5, 17, 1, 9]
    prompts = [_ids(n, i) for i, n in enumerate(lens)]
    one = [target.new_state() for _ in prompts]
    joined = [target.new_state() for _ in prompts]
    for step in range(2):  # a prefill, then a ragged verify batch with per-sequence rollback
        ids = prompts if step == 0 else [_ids(n % 4 + 1, 9 + n) for n in lens]
        ref = [target.forward(i, s) for i, s in zip(ids, one)]
        got = forward_batch(target, ids, joined)
        for r, g in zip(ref, got):
            assert_close(g.logits, r.logits, JOINED, op="forward_batch", case=fam)
        for s1, s2 in zip(one, joined):
            s1.rollback(s1.length - 1)
            s2.rollback(s2.length - 1)
    for s1, s2 in zip(one, joined):
        assert s2.tokens.tolist() == s1.tokens.tolist()


@pytest.mark.parametrize("fam", list(FAMILIES))
@settings(max_examples=4)
@given(data=st.data())
def test_each_sequence_equals_its_own_run(models, fam, data):
    target, drafter = models[fam]
    n_seq = data.draw(st.integers(1, 4))
    prompts = [_ids(data.draw(st.integers(1, 20)), data.draw(st.integers(0, 99)))
               for _ in range(n_seq)]
    B = data.draw(st.integers(1, 8))
    n = data.draw(st.integers(1, 12))
    stops = data.draw(st.lists(st.integers(0, 249), max_size=3))
    got = generate_batch(target, drafter, prompts, n, block_size=B, stop_token_ids=stops)
    for p, g in zip(prompts, got):
        ref = generate(target, drafter, p, n, block_size=B, stop_token_ids=stops)
        assert g.tokens == ref.tokens and g.acceptance_lengths == ref.acceptance_lengths


@settings(max_examples=4)
@given(data=st.data())
def test_features_never_leak_between_sequences(models, data):
    target, drafter, perm = models["copy"]
    n_seq = data.draw(st.integers(2, 4))
    prompts = []
    for _ in range(n_seq):  # prompts already on their permutation cycle, of mixed lengths
        p = [data.draw(st.integers(0, 250))]
        for _ in range(data.draw(st.integers(10, 24))):
            p.append(int(perm[p[-1]]))
        prompts.append(np.array(p))
    n = data.draw(st.integers(8, 30))
    got = generate_batch(target, drafter, prompts, n)
    for p, g in zip(prompts, got):
        ref = generate(target, drafter, p, n)
        assert g.tokens == ref.tokens and g.acceptance_lengths == ref.acceptance_lengths
        assert g.tau > 5.0  # the copy drafter only works on its own sequence's features


def test_sampled_batch_uses_one_seed_per_sequence(models):
    target, drafter = models["qwen3"]
    prompts = [_ids(6, 1), _ids(11, 2)]
    got = generate_batch(target, drafter, prompts, 10, sampling=SamplingParams(1.0), seeds=[5, 7])
    for p, seed, g in zip(prompts, [5, 7], got):
        assert g.tokens == generate(target, drafter, p, 10,
                                    sampling=SamplingParams(1.0, seed=seed)).tokens
