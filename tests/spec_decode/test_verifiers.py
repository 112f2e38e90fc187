"""Verify rules as objects and the observer (docs/spec_decode.md, "Verify rules as objects",
"Observers").

A rule written here, outside the package, runs through generate() unchanged and stays lossless
(the loop and dflash_ref/oracle only call the interface); observers see every step in order and
compose. Expected tokens are plain greedy decoding's (the loop's defining property); expected
event counts follow from the result's own statistics.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.errors import ConfigError
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.ops.sampling import SamplingParams
from dflash_ref.oracle.record import Recorder
from dflash_ref.spec_decode.arguments import make_verifier
from dflash_ref.spec_decode.ddtree import DDTreeOptions
from dflash_ref.spec_decode.extra_verifiers import (
    GreedyDraftChainVerifier,
    SampledTreeVerifier,
    TreeVerifier,
)
from dflash_ref.spec_decode.loop import generate
from dflash_ref.spec_decode.observe import Observer, Observers, Progress, Stream
from dflash_ref.spec_decode.verifiers import ChainVerifier, RejectionChainVerifier, Verifier
from dflash_ref.spec_decode.verify import verify_chain_greedy
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target
from tests.spec_decode.drafters import ScriptedDrafter

PROMPT = np.array([3, 17, 42, 99, 5])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("verifiers")
    t = write_tiny_target(root / "t", "qwen3", seed=21)
    target = TargetModel.from_pretrained(t)
    d = write_tiny_drafter(root / "d", t, seed=22, block_size=8)
    return target, DFlashDrafter.from_pretrained(d, target)


@pytest.fixture(scope="module")
def truth(pair):
    target, _ = pair
    return np.concatenate([PROMPT, generate(target, None, PROMPT, 60).tokens])


def test_make_verifier_reads_the_mode_once():
    greedy, sampled = SamplingParams(), SamplingParams(0.7, seed=0)
    assert type(make_verifier("chain", greedy)) is ChainVerifier
    assert type(make_verifier("chain", sampled)) is RejectionChainVerifier
    assert type(make_verifier("tree", greedy)) is TreeVerifier
    assert type(make_verifier("tree", sampled)) is SampledTreeVerifier
    mine = TreeVerifier(DDTreeOptions(budget=3))
    assert make_verifier(mine, greedy) is mine
    with pytest.raises(ConfigError, match="verify"):
        make_verifier("beam", greedy)
    with pytest.raises(ConfigError, match="draft_rows"):
        ChainVerifier(draft_rows="all")


def test_rules_refuse_what_they_cannot_run():
    sampled = SamplingParams(1.0, seed=0)
    with pytest.raises(ConfigError, match="greedy"):
        ChainVerifier().check(sampled, 4, 8)
    with pytest.raises(ConfigError, match="TreeVerifier .* verifies greedy decoding"):
        TreeVerifier().check(sampled, 4, 8)
    with pytest.raises(ConfigError, match="verifies sampled decoding"):
        SampledTreeVerifier().check(SamplingParams(), 4, 8)
    with pytest.raises(ConfigError, match="widths"):
        SampledTreeVerifier(widths=(2, 0))
    for v in (ChainVerifier(), RejectionChainVerifier(), GreedyDraftChainVerifier(),
              TreeVerifier()):
        with pytest.raises(ConfigError, match="draft_rows='verify'"):
            v.check(SamplingParams(), 9, 8)
    with pytest.raises(ConfigError, match="draft_rows='verify'"):
        SampledTreeVerifier().check(sampled, 9, 8)
    RejectionChainVerifier(draft_rows="verify").check(sampled, 9, 8)  # on request: allowed
    GreedyDraftChainVerifier().check(sampled, 8, 8)


class OneDraftAtMost(ChainVerifier):
    """A rule from outside the package: greedy chain verify that accepts at most one draft."""

    def draft(self, ctx):
        self.steps = getattr(self, "steps", 0) + 1
        return super().draft(ctx)

    def verify(self, block, logits, ctx):
        full = verify_chain_greedy(ctx.be, block.tokens, logits)
        a = min(full.a, 1)
        return type(full)(a=a, accepted=full.accepted[:a], bonus=int(full.posterior[a]),
                          posterior=full.posterior)


class PlainOnly(Verifier):
    """A rule that is not a chain at all: the block is the anchor alone (plain decoding)."""

    def draft(self, ctx):
        from dflash_ref.spec_decode.verifiers import ChainBlock

        return ChainBlock(np.array([ctx.anchor], np.int64))

    def verify(self, block, logits, ctx):
        return verify_chain_greedy(ctx.be, block.tokens, logits)

    def keep(self, state, start, result):
        state.rollback(start + 1)


def test_a_new_rule_is_one_class_and_stays_lossless(pair, truth):
    target, _ = pair
    plain = truth[PROMPT.size: PROMPT.size + 30].tolist()
    rule = OneDraftAtMost()
    res = generate(target, ScriptedDrafter(target, truth, 8, error_rate=0.0), PROMPT, 30,
                   verify=rule)
    assert res.tokens == plain
    assert set(res.acceptance_lengths[:-1]) == {2}  # a perfect drafter, capped at one draft
    assert rule.steps == len(res.acceptance_lengths)
    res = generate(target, ScriptedDrafter(target, truth, 8), PROMPT, 30, verify=PlainOnly())
    assert res.tokens == plain and set(res.acceptance_lengths) == {1}
    assert res.drafted == [0] * len(res.acceptance_lengths)


def test_the_recorder_follows_a_new_rule_without_change(pair, truth):
    target, drafter = pair
    rec = Recorder(target, drafter)
    res = generate(target, drafter, PROMPT, 6, block_size=4, verify=OneDraftAtMost(),
                   observer=rec)
    kinds = [s["kind"] for s in rec.steps]
    assert kinds[0] == "prefill" and set(kinds[1:]) == {"chain"}
    assert [t for s in rec.steps for t in s["committed"]][:6] == res.tokens
    assert rec.finished()["step0001.drafter.draft_tokens"].shape == (3,)


class Log(Observer):
    """Every event, in order."""

    def __init__(self):
        self.events = []
        self.forward_rows = []

    def on_start(self, state):
        self.events.append("start")

    def on_gate(self, observation, decision):
        self.events.append("gate")

    def on_draft_context(self, features, positions):
        self.events.append("context")

    def on_draft(self, anchor, positions, logits, proposal):
        self.events.append("draft")

    def before_forward(self, ids, positions, parents=None):
        self.events.append("tree" if parents is not None else "forward")
        return None

    def after_forward(self, logits):
        self.forward_rows.append(int(logits.shape[0]))

    def on_commit(self, tokens):
        self.events.append("commit")

    def on_emit(self, ids):
        self.events.append("emit")

    def on_finish(self, result):
        self.events.append("finish")


@pytest.mark.parametrize("verify", ["chain", "tree"])
def test_observers_see_every_step_in_order(pair, truth, verify):
    target, _ = pair
    log, ids, counts = Log(), [], []
    obs = Observers(log, Stream(ids.extend), Progress(counts.append), None)
    res = generate(target, ScriptedDrafter(target, truth, 8, seed=3), PROMPT, 20,
                   verify=verify, observer=obs)
    step = ["context", "draft", "tree" if verify == "tree" else "forward", "commit", "emit"]
    n = len(res.acceptance_lengths)
    assert log.events == ["start", "forward", "commit", "emit"] + step * n + ["finish"]
    assert log.forward_rows[0] == 1  # the prefill computes only the row it samples from
    assert ids == res.tokens and sum(counts) == len(res.tokens)
    assert {"prefill", "draft", "verify", "total"} <= set(res.timings)


def test_taps_compose_and_full_prefill_logits_is_asked_for(pair):
    target, _ = pair
    seen = {"a": 0, "b": 0}

    class Tap(Log):
        full_prefill_logits = True

        def __init__(self, name):
            super().__init__()
            self.name = name

        def before_forward(self, ids, positions, parents=None):
            return lambda layer, name, x: seen.__setitem__(self.name, seen[self.name] + 1)

    a, b = Tap("a"), Tap("b")
    res = generate(target, None, PROMPT, 3, observer=Observers(a, b))
    assert seen["a"] == seen["b"] > 0
    assert a.forward_rows[0] == PROMPT.size  # every prefill row, when an observer asks
    assert res.tokens == generate(target, None, PROMPT, 3).tokens


def test_an_unknown_verify_mode_is_refused_without_a_drafter_too(pair):
    # Plain decoding builds no verifier; a misspelt mode must still fail loudly rather than be
    # ignored (a run a user thinks is tree-verified would silently be plain decoding).
    target, _ = pair
    with pytest.raises(ConfigError, match="verify='trie' is unknown"):
        generate(target, None, [1, 2, 3], 2, verify="trie")
    assert len(generate(target, None, [1, 2, 3], 2, verify="tree").tokens) == 2
