"""Lazy chain verify (spec_decode/lazy_verify.py, models/head_rows.py): the target's head only on
rows 0..a, the same tokens as plain decoding and as the eager rule, the sampled law unchanged.

Expected values: plain greedy decoding (the target one token at a time), the eager rules
(``ChainVerifier``, ``RejectionChainVerifier``, every row through the head), hand-built logits
whose argmax is chosen (tests/spec_decode/targets.py ``logits_for``), and the lossless harness's
own sampling law.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import dflash_ref
from dflash_ref.backend import get_backend
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.head_rows import HeadRows
from dflash_ref.models.target import TargetModel
from dflash_ref.ops.sampling import DraftProposal, SamplingParams
from dflash_ref.spec_decode.arguments import make_verifier
from dflash_ref.spec_decode.lazy_verify import (
    LazyChainVerifier,
    LazyRejectionChainVerifier,
    row_spans,
    verify_greedy_lazy,
    verify_sampled_lazy,
)
from dflash_ref.spec_decode.loop import generate
from dflash_ref.spec_decode.verifiers import ChainVerifier, RejectionChainVerifier
from dflash_ref.testing.lossless import Law, assert_lossless, toy_target
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target
from tests.spec_decode.drafters import FAMILIES, ScriptedDrafter, tiny_pairs
from tests.spec_decode.targets import logits_for
from tests.testing.policies import ANCHOR, params, toy_context

NP = get_backend("numpy")
DEMO = Path(dflash_ref.__file__).parent / "data" / "demo"
GROUPS = [(), (1,), (1, 1), (1,) * 7, (3, 2)]


class SpyHead:
    """A head over final-normed rows that are row indices: ``table[i]`` is row i's logits; each
    call's rows are recorded."""

    def __init__(self, table):
        self.table, self.calls = np.asarray(table, np.float32), []

    def __call__(self, h):  # h [r, 1] -> [r, V]
        idx = h[:, 0].astype(np.int64)
        self.calls.append(idx.tolist())
        return self.table[idx]


def spy_rows(table) -> tuple[HeadRows, SpyHead]:
    head = SpyHead(table)
    normed = np.arange(len(table), dtype=np.float32)[:, None]  # [n, 1]: row i is i
    return HeadRows(NP, head, normed, head.table.shape[1]), head


# -- the rows a step needs, by hand ------------------------------------------------------------

def test_row_spans_cut_the_rows_into_the_groups_then_the_rest():
    # Catches the last group dropped (rows after the groups never verified) or a group past n.
    assert row_spans(8, (1, 1)) == [(0, 1), (1, 2), (2, 8)]
    assert row_spans(8, ()) == [(0, 8)]
    assert row_spans(3, (1,) * 7) == [(0, 1), (1, 2), (2, 3)]
    assert row_spans(4, (3, 2)) == [(0, 3), (3, 4)]


def test_a_rejected_first_draft_puts_row_0_alone_through_the_head():
    # block [5, 7, 9, 2]: row 0's argmax is 4, not d_1 = 7, so a = 0 and the bonus is 4; rows
    # 1..3 are never reached. Catches an off-by-one in the rows needed (row 1 computed too).
    rows, head = spy_rows(logits_for([4, 9, 2, 6], 12))
    res = verify_greedy_lazy(NP, np.array([5, 7, 9, 2]), rows, groups=(1, 1))
    assert (res.a, res.committed) == (0, (4,))
    assert head.calls == [[0]]


def test_a_full_accept_computes_every_row_and_takes_the_bonus_from_the_last():
    # argmax rows [7, 9, 2, 6] accept all three drafts of [5, 7, 9, 2]; the bonus is row 3's 6.
    # Catches the bonus row skipped after a full accept (bonus read from row 2, or row 3 never
    # computed) and a group left out.
    for groups, calls in [((1, 1), [[0], [1], [2, 3]]), ((1,), [[0], [1, 2, 3]]),
                          ((), [[0, 1, 2, 3]])]:
        rows, head = spy_rows(logits_for([7, 9, 2, 6], 12))
        res = verify_greedy_lazy(NP, np.array([5, 7, 9, 2]), rows, groups)
        assert (res.a, res.committed) == (3, (7, 9, 2, 6))
        assert head.calls == calls, groups


def test_a_rejection_inside_a_group_stops_at_that_group():
    # argmax [7, 9, 3, 6]: d_3 = 2 rejected at row 2 (a = 2, bonus 3); with groups (1, 1) the
    # third group (rows 2, 3) is computed in one product, nothing after it. Catches stopping
    # one group early (a < hi read as a <= hi: the bonus row never computed).
    rows, head = spy_rows(logits_for([7, 9, 3, 6], 12))
    res = verify_greedy_lazy(NP, np.array([5, 7, 9, 2]), rows, (1, 1))
    assert (res.a, res.committed) == (2, (7, 9, 3))
    assert head.calls == [[0], [1], [2, 3]]


def test_head_rows_equal_the_head_of_every_row_and_compute_each_row_once():
    # Catches a group's rows shifted by one (block[r - lo] read as block[r]) and a row
    # recomputed when asked again.
    table = np.random.default_rng(3).standard_normal((5, 9))
    rows, head = spy_rows(table)
    np.testing.assert_array_equal(rows[1:3], table[1:3].astype(np.float32))
    np.testing.assert_array_equal(rows[2:3], table[2:3].astype(np.float32))
    np.testing.assert_array_equal(np.asarray(rows), table.astype(np.float32))
    assert head.calls == [[1, 2], [0], [3, 4]]


def test_the_default_chain_rule_is_lazy_on_numpy_and_eager_elsewhere():
    # Catches the lazy rule chosen for a CuPy target (a graphed step needs every row) or lost
    # on NumPy.
    greedy, sampled = SamplingParams(), SamplingParams(temperature=0.7, seed=0)
    assert type(make_verifier("chain", greedy, "numpy")) is LazyChainVerifier
    assert type(make_verifier("chain", sampled, "numpy")) is LazyRejectionChainVerifier
    assert type(make_verifier("chain", greedy, "cupy")) is ChainVerifier
    assert type(make_verifier("chain", sampled, "cupy")) is RejectionChainVerifier
    assert type(make_verifier("chain", greedy)) is ChainVerifier  # no backend named: eager


def test_the_default_chain_rule_is_lazy_only_for_a_large_head():
    # Catches: the vocabulary threshold inverted or off by one (the demo pair's 259-id head would
    # run a forward per group for nothing, Gemma 3's 262 144-id head would pay for every row).
    from dflash_ref.spec_decode.arguments import LAZY_MIN_VOCAB

    greedy = SamplingParams()
    assert LAZY_MIN_VOCAB == 32768
    assert type(make_verifier("chain", greedy, "numpy", 259)) is ChainVerifier
    assert type(make_verifier("chain", greedy, "numpy", 32767)) is ChainVerifier
    assert type(make_verifier("chain", greedy, "numpy", 32768)) is LazyChainVerifier
    assert type(make_verifier("chain", greedy, "numpy", 262144)) is LazyChainVerifier
    assert type(make_verifier("chain", greedy, "cupy", 262144)) is ChainVerifier
    with pytest.raises(ValueError, match="head_groups"):
        LazyChainVerifier(head_groups=(1, 0))


# -- speculative == plain, lazy rows on and off -------------------------------------------------

@pytest.fixture(scope="module")
def demo():
    target = TargetModel.from_pretrained(DEMO / "target")
    drafter = DFlashDrafter.from_pretrained(DEMO / "drafter", target)
    prompts = json.loads((DEMO / "held_out_prompts.json").read_text())["prompts"][0:3:2]
    return target, drafter, [np.asarray(p, np.int64) for p in prompts]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    root = tmp_path_factory.mktemp("lazy")
    t = write_tiny_target(root / "t", "gemma3", seed=31, tie_word_embeddings=False)
    d = write_tiny_drafter(root / "d", t, seed=32, block_size=8)
    target = TargetModel.from_pretrained(t)
    return target, DFlashDrafter.from_pretrained(d, target)


VERIFIERS = [ChainVerifier()] + [LazyChainVerifier(head_groups=g, layers_later=False)
                                 for g in GROUPS] + [
    LazyChainVerifier(head_groups=g, layers_later=True) for g in [(1,), (1, 1), (1,) * 7]]


def test_the_demo_pair_emits_plain_greedy_with_lazy_rows_on_and_off(demo):
    # Catches any wrong row read by the lazy rule: the trained pair accepts long prefixes
    # (tau near 4), so every group boundary is crossed.
    target, drafter, prompts = demo
    for prompt in prompts:
        plain = generate(target, None, prompt, 24).tokens
        for v in VERIFIERS[:4] + VERIFIERS[-2:]:
            res = generate(target, drafter, prompt, 24, verify=v)
            assert res.tokens == plain, v
        assert res.tau > 1.5  # the accept paths were exercised


def test_a_tiny_gemma_emits_plain_greedy_with_lazy_rows_on_and_off(gemma):
    # A Gemma-shaped target (sandwich norms, sliding layers); a scripted drafter that errs
    # gives every acceptance length. Catches the lazy forward skipping the final norm or the
    # softcap (lm_head is the target's, on the final-normed rows).
    target, drafter = gemma
    prompt = np.array([3, 17, 42, 99, 5])
    plain = generate(target, None, prompt, 40).tokens
    truth = np.concatenate([prompt, generate(target, None, prompt, 60).tokens])
    for v in VERIFIERS:
        scripted = ScriptedDrafter(target, truth, 8, error_rate=0.3, seed=4)
        res = generate(target, scripted, prompt, 40, verify=v)
        assert res.tokens == plain, v
        assert generate(target, drafter, prompt, 40, verify=v).tokens == plain, v


def test_only_row_0_goes_through_the_target_head_when_every_first_draft_is_wrong(gemma):
    # An adversarial drafter (a token plain decoding never emits) is rejected at d_1 every step:
    # with lazy rows each verify puts one row through the target's lm_head (the prefill one too);
    # eager puts the whole block. Catches the lazy forward computing the head anyway.
    target, _ = gemma
    prompt = np.array([3, 17, 42, 99, 5])
    plain = generate(target, None, prompt, 12).tokens
    wrong = next(t for t in range(target.config.vocab_size) if t not in plain)
    for verifier, rows_per_verify in [(LazyChainVerifier(head_groups=(1,), layers_later=False), 1),
                                      (ChainVerifier(), 8)]:
        drafter = ScriptedDrafter(target, plain, 8, adversarial_token=wrong)
        seen = []
        head = target.lm_head
        target.lm_head = lambda h, head=head, seen=seen: (seen.append(h.shape[0]), head(h))[1]
        try:
            res = generate(target, drafter, prompt, 12, verify=verifier)
        finally:
            del target.lm_head
        assert res.tokens == plain
        assert seen == [1] + [rows_per_verify] * len(res.acceptance_lengths)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_layers_later_keeps_every_family_equal_to_plain(tmp_path_factory, family):
    # The layers group by group: each group a forward appended to the state, the rollback
    # within the last one (a Gated DeltaNet state rewinds only there: qwen3_5). Catches a
    # group forwarded from row 0 again (K/V appended twice) or a row skipped between groups.
    target, _ = tiny_pairs(tmp_path_factory.mktemp(family), 21, 22, block_size=8)[family]
    prompt = np.array([11, 250, 64, 9, 1, 30])
    plain = generate(target, None, prompt, 30).tokens
    truth = np.concatenate([prompt, generate(target, None, prompt, 50).tokens])
    for groups in [(1,), (1, 1), (2, 3)]:
        scripted = ScriptedDrafter(target, truth, 8, error_rate=0.25, seed=6)
        res = generate(target, scripted, prompt, 30,
                       verify=LazyChainVerifier(head_groups=groups, layers_later=True))
        assert res.tokens == plain, groups


def test_layers_later_runs_only_row_0_when_every_first_draft_is_wrong(gemma):
    # With the layers later too, a step whose d_1 is rejected runs one row through the layers
    # (and the head). Catches the whole block forwarded before the first decision.
    target, _ = gemma
    prompt = np.array([3, 17, 42, 99, 5])
    plain = generate(target, None, prompt, 12).tokens
    wrong = next(t for t in range(target.config.vocab_size) if t not in plain)
    drafter = ScriptedDrafter(target, plain, 8, adversarial_token=wrong)
    seen = []
    layers = target.hidden_states
    target.hidden_states = lambda ids, batch: (seen.append(int(ids.shape[0])),
                                               layers(ids, batch))[1]
    try:
        res = generate(target, drafter, prompt, 12,
                       verify=LazyChainVerifier(head_groups=(1,), layers_later=True))
    finally:
        del target.hidden_states
    assert res.tokens == plain
    assert seen == [prompt.size] + [1] * len(res.acceptance_lengths)


def test_a_full_accept_runs_every_row_once_in_the_groups(gemma):
    # A drafter that knows the continuation is accepted whole every step: with groups (1, 1)
    # each verify runs rows 0, 1, then 2..7 through the layers and the head, each row once.
    # Catches the bonus row (row 7) left out after a full accept, or a group run twice.
    target, _ = gemma
    prompt = np.array([3, 17, 42, 99, 5])
    truth = np.concatenate([prompt, generate(target, None, prompt, 40).tokens])
    heads, layers = [], []
    head, run = target.lm_head, target.hidden_states
    target.lm_head = lambda h: (heads.append(h.shape[0]), head(h))[1]
    target.hidden_states = lambda ids, batch: (layers.append(int(ids.shape[0])),
                                               run(ids, batch))[1]
    try:
        res = generate(target, ScriptedDrafter(target, truth, 8, error_rate=0.0), prompt, 17,
                       verify=LazyChainVerifier(head_groups=(1, 1), layers_later=True))
    finally:
        del target.lm_head, target.hidden_states
    assert res.tokens == truth[prompt.size: prompt.size + 17].tolist()
    assert res.acceptance_lengths == [8, 8]
    assert heads == [1, 1, 1, 6, 1, 1, 6] and layers == [prompt.size, 1, 1, 6, 1, 1, 6]


# -- sampled: the same draws, the same law ------------------------------------------------------

@pytest.mark.parametrize(("groups", "layers_later"), [((1,), False), ((1, 1), True), ((), True)])
def test_sampled_lazy_emits_the_eager_rules_tokens_with_the_same_seed(demo, gemma, groups,
                                                                      layers_later):
    # The lazy rule draws n-1 accept uniforms, then the bonus's, as the eager one does. Catches
    # the uniforms drawn per row (another stream: other tokens) or the bonus row after a full
    # accept read from the wrong row.
    law = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=7)
    for target, drafter, prompt in [(*demo[:2], demo[2][0]), (*gemma, np.array([3, 17, 42]))]:
        eager = generate(target, drafter, prompt, 16, sampling=law,
                         verify=RejectionChainVerifier())
        lazy = generate(target, drafter, prompt, 16, sampling=law,
                        verify=LazyRejectionChainVerifier(head_groups=groups,
                                                          layers_later=layers_later))
        assert lazy.tokens == eager.tokens
        assert lazy.acceptance_lengths == eager.acceptance_lengths


def test_sampled_lazy_reads_the_rows_up_to_the_rejection_only():
    # Row 0 gives p(d_1 = 1) = 0 (logit -inf-like): d_1 is rejected whatever the uniform, so
    # only row 0 is computed and the bonus comes from its residual, never token 1. Catches
    # every row's p computed before the first decision.
    table = np.zeros((4, 3), np.float32)
    table[0, 1] = -60.0  # p_0(1) ~ 1e-26 < u q
    rows, head = spy_rows(table)
    q = np.full((3, 3), 1 / 3)
    prop = DraftProposal(np.array([1, 2, 0]), q)
    res = verify_sampled_lazy(NP, np.array([0, 1, 2, 0]), rows, prop,
                              SamplingParams(temperature=1.0, seed=0), np.random.default_rng(0),
                              groups=(1, 1))
    assert res.a == 0 and res.bonus != 1
    assert head.calls == [[0]]


LAW = Law(0.9, top_k=3, top_p=0.9)


def lazy_sampled_step(groups, sparse=False):
    """A harness step: the lazy rule over the toy target's rows, each row evaluated only when
    the rule asks for it (and checked: rows 0..a, no more)."""

    def step(target, draft_logits, rng):
        ctx = toy_context(draft_logits, LAW, rng, sparse)
        block = LazyRejectionChainVerifier(head_groups=groups).draft(ctx)
        drafts = tuple(int(t) for t in block.tokens[1:])
        table = np.stack([target(drafts[:j]) for j in range(len(block.tokens))])
        rows, head = spy_rows(table)
        res = verify_sampled_lazy(NP, block.tokens, rows, block.proposal, params(LAW, rng), rng,
                                  groups)
        computed = sorted(i for call in head.calls for i in call)
        assert computed[: res.a + 1] == list(range(res.a + 1))
        assert groups != (1,) * 7 or computed == list(range(res.a + 1))
        return res.committed

    return step


@pytest.mark.parametrize(("groups", "sparse"), [((1,) * 7, False), ((1,), True)])
def test_sampled_lazy_is_lossless(groups, sparse):
    # The harness's own law (dflash_ref/testing/lossless.py), small. Catches a row's p paired
    # with the next row's draft (a p_{j+1}(d_{j+1}) acceptance) or the residual taken from q.
    draft_logits = 1.5 * np.random.default_rng(7).standard_normal((2, 4))
    report = assert_lossless(lazy_sampled_step(groups, sparse), toy_target(4, seed=11),
                             draft_logits, LAW, n_trials=3000)
    assert 1.0 <= report.acceptance <= 3
    assert ANCHOR == 0
