"""The loop's data flows one way (docs/architecture.md, "The loop"): a verifier sees a
DraftingContext, never the request; the token cursor has one stop cut; a run given no gate holds
ALWAYS_SPECULATE and records no decision.

Expected tokens are plain greedy decoding's (the loop's defining property); cursor values are
worked out by hand next to each assertion.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from dflash_ref.kvflash.pager import KVFlashPager
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode import extra_verifiers, verifiers
from dflash_ref.spec_decode.decoding import Decoding, TokenCursor
from dflash_ref.spec_decode.drafting import DraftingContext, Proposer
from dflash_ref.spec_decode.gate import EntropyGate
from dflash_ref.spec_decode.gating import ALWAYS_SPECULATE, GateObservation
from dflash_ref.spec_decode.loop import generate
from dflash_ref.spec_decode.observe import Observer
from dflash_ref.spec_decode.verifiers import ChainVerifier
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target
from tests.spec_decode.drafters import ScriptedDrafter

PROMPT = np.array([3, 17, 42, 99, 5])


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("decoding")
    t = write_tiny_target(root / "t", "qwen3", seed=21)
    target = TargetModel.from_pretrained(t)
    d = write_tiny_drafter(root / "d", t, seed=22, block_size=4)
    return target, DFlashDrafter.from_pretrained(d, target)


def _held(ctx) -> list:
    """What a context holds: its fields and its proposer's."""
    return list(vars(ctx).values()) + list(vars(ctx.proposer).values())


class Watching(ChainVerifier):
    """Greedy chain verify that keeps what it was handed."""

    def draft(self, ctx):
        self.seen = getattr(self, "seen", []) + [ctx]
        return super().draft(ctx)

    def verify(self, block, logits, ctx):
        self.seen.append(ctx)
        return super().verify(block, logits, ctx)


def test_a_verifier_sees_the_step_not_the_request(pair):
    target, _ = pair
    truth = np.concatenate([PROMPT, generate(target, None, PROMPT, 40).tokens])
    rule = Watching()
    res = generate(target, ScriptedDrafter(target, truth, 4), PROMPT, 20, verify=rule)
    assert res.tokens == truth[PROMPT.size: PROMPT.size + 20].tolist()
    assert rule.seen and all(type(ctx) is DraftingContext for ctx in rule.seen)
    assert not any(isinstance(x, Decoding) for ctx in rule.seen for x in _held(ctx))
    # Each step's anchor sits at s = N + (tokens emitted before it) - 1; the first at N.
    drafts = rule.seen[::2]
    emitted = 1 + np.concatenate([[0], np.cumsum(res.acceptance_lengths)[:-1]])
    assert [c.position for c in drafts] == [PROMPT.size - 1 + int(e) for e in emitted]
    assert [c.anchor for c in drafts] == [truth[c.position] for c in drafts]
    assert {c.block_size for c in drafts} == {4}


def test_no_verifier_method_takes_run():
    rules = {c for module in (verifiers, extra_verifiers) for c in vars(module).values()
             if isinstance(c, type) and issubclass(c, verifiers.Verifier)}
    assert len(rules) >= 6
    takes_run = [f"{c.__name__}.{name}" for c in rules for name, f in vars(c).items()
                 if inspect.isfunction(f) and "run" in inspect.signature(f).parameters]
    assert takes_run == []


def test_decoding_holds_ten_attributes_after_a_gated_paged_run(pair, monkeypatch):
    target, drafter = pair
    runs = []
    finish = Decoding.finish

    def keep(self):
        runs.append(self)
        return finish(self)

    monkeypatch.setattr(Decoding, "finish", keep)
    gate = EntropyGate(ar_p1=0.0, tie_p1=0.0)  # never floors: every step is judged
    res = generate(target, drafter, PROMPT, 12, gate=gate, pager=KVFlashPager(64, chunk_tokens=4))
    assert len(res.gate_decisions) == len(res.acceptance_lengths)
    (run,) = runs
    assert len(vars(run)) <= 10, sorted(vars(run))
    assert isinstance(run.proposer, Proposer) and run.state.pager is not None


def test_the_cursor_cuts_at_remaining_and_after_a_stop():
    c = TokenCursor(np.array([1, 2, 3]), max_new_tokens=5, stops=frozenset({7}), position=2,
                    remaining=5)
    # The prefill's token: the anchor at N = 3.
    assert c.commit([4], 0, "row0") == [4] and (c.anchor, c.position, c.remaining) == (4, 3, 4)
    # Three accepted drafts and the bonus, cut after the stop 7: [5, 7]; s = 3 + 2.
    assert c.commit([5, 7, 8, 9], 3, "row1") == [5, 7]
    assert (c.anchor, c.anchor_logits, c.position, c.remaining) == (7, "row1", 5, 2) and c.done
    assert c.emitted == [4, 5, 7] and c.from_draft == [False, True, True]
    assert c.tokens() == [4, 5, 7]
    # max_new_tokens cuts a step as it cuts the finish: 2 of [1, 1, 1] with 2 wanted.
    d = TokenCursor(np.array([1]), max_new_tokens=2, stops=frozenset(), position=0, remaining=2)
    assert d.commit([1, 1, 1], 2, None) == [1, 1] and d.done and d.from_draft == [True, True]
    assert d.cut([3, 7, 7]) == [3, 7, 7] and c.cut([3, 7, 7]) == [3, 7]


def test_a_run_given_no_gate_speculates_every_step_and_records_nothing(pair):
    target, drafter = pair
    seen = []

    class Gates(Observer):
        def on_gate(self, observation, decision):
            seen.append(decision)

    res = generate(target, drafter, PROMPT, 10, observer=Gates())
    assert res.gate_decisions == [] and res.floored_at is None and seen == []
    assert len(res.acceptance_lengths) == res.target_forward_passes - 1  # every step drafted
    g = ALWAYS_SPECULATE
    assert g.start_turn(10, sampled=False) == 0
    assert not g.check(GateObservation(None, None, 0)).floor
