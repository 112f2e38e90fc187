"""The drafter's head (models/draft_head.py): a reduced draft vocabulary's scatter, its drafts
mapped through d2t, its sampled law on the d2t candidates; hand cases on a toy target, and the
lossless harness (dflash_ref/testing/lossless.py) on a step that drafts through a reduced head."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dflash_ref.backend import get_backend
from dflash_ref.errors import FormatError
from dflash_ref.io.draft_vocab import absolute_ids, check_d2t, offsets
from dflash_ref.models.draft_head import FILL, ReducedHead
from dflash_ref.ops.sampling import SamplingParams
from dflash_ref.spec_decode.drafting import DraftingContext
from dflash_ref.spec_decode.verifiers import RejectionChainVerifier
from dflash_ref.testing.lossless import Law, assert_lossless, check_lossless, toy_target
from tests.testing.policies import ANCHOR, block_logits, params

NP = get_backend("numpy")


def toy_head(ids, weight, V, cap=None, multiplier=None) -> ReducedHead:
    """A ReducedHead over a toy target of vocabulary V (no model: the head reads only these)."""
    ids = np.asarray(ids, dtype=np.int64)
    config = SimpleNamespace(draft_vocab_size=ids.size, output_multiplier=multiplier,
                             final_logit_softcapping=cap)
    target = SimpleNamespace(be=NP, config=SimpleNamespace(vocab_size=V,
                                                           final_logit_softcapping=None))
    return ReducedHead(config, target, np.asarray(weight, dtype=np.float32), ids)


# The hand case: V = 6 target ids, Vd = 3 draft rows, H = 2. The directory stores offsets
# d2t = [1, -1, 3]: draft row i is target id i + d2t[i] = [1, 0, 5].
D2T_OFFSETS = np.array([1, -1, 3])
IDS = np.array([1, 0, 5])
W = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])  # [Vd, H]
Z = np.array([[2.0, 3.0], [-1.0, 0.5]], dtype=np.float32)  # [n, H]: rows z W^T = [2, 3, 5],
ROWS = np.array([[2.0, 3.0, 5.0], [-1.0, 0.5, -0.5]])  # [-1, 0.5, -0.5] by hand


def test_offsets_are_the_eagle3_convention():
    # target id of draft row i = i + d2t[i] (SpecForge / llama.cpp's converter add arange);
    # catches reading the offsets as absolute ids, or subtracting the row index.
    assert absolute_ids(D2T_OFFSETS).tolist() == IDS.tolist()
    assert offsets(IDS).tolist() == D2T_OFFSETS.tolist()


def test_scatter_puts_each_draft_row_on_its_target_id():
    head = toy_head(IDS, W, V=6)
    full = head.logits(Z)  # [2, 6]
    # by hand: target 1 <- row 0, target 0 <- row 1, target 5 <- row 2; ids 2, 3, 4 FILL.
    expected = np.full((2, 6), FILL)
    expected[:, 1], expected[:, 0], expected[:, 5] = ROWS[:, 0], ROWS[:, 1], ROWS[:, 2]
    assert np.array_equal(full, expected.astype(np.float32))  # catches scatter by draft id
    assert np.all(np.isfinite(full))  # the fill is finite: the non-finite checks stay on
    minus_inf = head.scatter(head.draft_rows(Z), fill=-np.inf)  # llama.cpp's row
    assert np.isneginf(minus_inf[:, [2, 3, 4]]).all() and minus_inf[0, 5] == 5.0


def test_greedy_draft_is_the_target_id_of_the_best_draft_row():
    head = toy_head(IDS, W, V=6)
    # row 0's best draft row is 2 (logit 5) -> target 5; row 1's is 1 (0.5) -> target 0.
    assert head.argmax(head.logits(Z)).tolist() == [5, 0]  # catches returning draft ids [2, 1]


def test_softcap_and_multiplier_apply_to_the_draft_rows_not_the_fill():
    head = toy_head(IDS, W, V=6, cap=2.0, multiplier=0.5)
    full = head.logits(Z)
    assert np.allclose(full[0, 5], 2.0 * np.tanh(5.0 * 0.5 / 2.0))  # cap(0.5 * 5) by hand
    assert full[0, 2] == np.float32(FILL)  # catches capping after the scatter (fill -> -2)


def test_sampled_drafts_are_target_ids_with_q_on_the_d2t_candidates():
    head = toy_head(IDS, W, V=6)
    prop = head.sample(head.logits(Z), SamplingParams(1.0, seed=0), np.random.default_rng(0))
    assert set(prop.tokens.tolist()) <= {0, 1, 5}
    assert prop.q.shape == (2, 3) and np.allclose(prop.q.sum(axis=1), 1.0)
    assert (prop.candidates == IDS).all()  # catches candidates left as draft ids 0..Vd-1
    e = np.exp(ROWS[0] - ROWS[0].max())
    assert np.allclose(prop.q[0], e / e.sum())  # softmax over the draft rows, by hand


@pytest.mark.parametrize(("ids", "words"), [
    ([1, 0], "shape [2]"),  # one id short of Vd = 3
    ([1, 0, 6], "target id 6, outside"),  # == V: the edge of the vocabulary
    ([1, -1, 5], "target id -1"),
    ([1, 5, 5], "rows [1, 2] to the same target id 5"),
])
def test_bad_maps_are_one_line_each(ids, words):
    with pytest.raises(FormatError) as exc:
        check_d2t(np.asarray(ids, dtype=np.int64), 3, 6, "d")
    assert words in str(exc.value) and "\n" not in str(exc.value)


def test_a_map_at_the_edges_is_accepted():
    check_d2t(np.array([0, 5, 3]), 3, 6, "d")  # ids 0 and V - 1 are inside


# -- lossless: a toy step that drafts through a reduced head, verified by the loop's rule ------

V, L = 4, 2
SUBSET = np.array([3, 1])  # two of the four ids, in descending order


class ReducedProposer:
    """A proposer whose drafter's rows are the harness's draft logits at ``SUBSET`` (its own
    head over Vd = 2 rows), scattered and sampled as a reduced drafter does."""

    def __init__(self, draft_logits, head: ReducedHead):
        rows = np.concatenate([np.zeros((1, SUBSET.size)), draft_logits[:, SUBSET]])  # [B, Vd]
        self.head, self.block = head, head.scatter(rows.astype(np.float32))  # [B, V]

    def propose(self, anchor, position, block_size, law, rng, scored=None):
        return self.head.sample(self.block[1:block_size], law, rng)

    def draft_logits(self, anchor, position):
        return self.block


def reduced_step(law: Law, head: ReducedHead):
    verifier = RejectionChainVerifier()

    def step(target, draft_logits, rng):
        ctx = DraftingContext(anchor=ANCHOR, position=10, block_size=L + 1, remaining=100,
                              sampling=params(law, rng), rng=rng, be=NP,
                              proposer=ReducedProposer(draft_logits, head))
        block = verifier.draft(ctx)
        return verifier.verify(block, block_logits(target, block), ctx).committed

    return step


def draft_logits() -> np.ndarray:
    return 1.5 * np.random.default_rng(7).standard_normal((L, V))


@pytest.mark.parametrize("law", [Law(1.0), Law(0.9, top_k=1, top_p=0.9)])
def test_rejection_sampling_through_a_reduced_head_is_lossless(law):
    head = toy_head(SUBSET, np.eye(2), V=V)
    assert_lossless(reduced_step(law, head), toy_target(V, seed=11), draft_logits(), law,
                    n_trials=4000)


def test_the_harness_rejects_q_left_on_draft_ids():
    # The one-line bug: the proposal's candidates as draft ids 0..Vd-1 instead of d2t, so the
    # rule reads q at the wrong target ids.
    class Unmapped(ReducedHead):
        def sample(self, logits, law, rng):
            p = super().sample(logits, law, rng)
            return type(p)(p.tokens, p.q, np.broadcast_to(np.arange(SUBSET.size), p.q.shape))

    head = Unmapped(*_head_args())
    report = check_lossless(reduced_step(Law(1.0), head), toy_target(V, seed=11),
                            draft_logits(), Law(1.0), n_trials=4000)
    assert not report.ok()


def _head_args():
    h = toy_head(SUBSET, np.eye(2), V=V)
    return h.config, h.target, h.weight, h.ids
