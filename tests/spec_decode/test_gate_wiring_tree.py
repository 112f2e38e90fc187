"""How generate() feeds the gates on the tree (DDTree) step: the logits row the entropy gate
reads after a tree verify, and the commit count and verify width the commit-EMA gate is given.

tests/spec_decode/test_gate_wiring.py pins the chain step; the tree step reaches the gate through
its own ``bonus_row`` (the path's last node, not the last verify row) and its own width (the
tree's node count, not B), which no test read. Expected values come from outside the loop: p1
from one plain full forward of the committed sequence; the EMA by hand from
``ema <- ema / 2 + ratio / 2``, ``ratio = commit_n * t_ar / (drafter(B) + target(N))``.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.spec_decode.cost import CostModel
from dflash_ref.spec_decode.ddtree import DDTreeOptions
from dflash_ref.spec_decode.extra_verifiers import TreeVerifier
from dflash_ref.spec_decode.gate import CommitEmaGate, EntropyGate
from dflash_ref.spec_decode.loop import GateOptions, generate
from tests.spec_decode.test_gate_wiring import (  # noqa: F401
    PROMPT,
    B,
    _scripted,
    expected_p1s,
    target,
)


def test_tree_step_entropy_gate_sees_the_bonus_node_row(target):  # noqa: F811
    n = 40
    gate = EntropyGate(ar_p1=0.0, tie_p1=0.0)  # never floors: a decision before every step
    res = generate(target, _scripted(target, n, seed=5), PROMPT, n, gate=gate, verify="tree")
    assert res.floored_at is None
    assert len(res.gate_decisions) == len(res.acceptance_lengths)
    # the bonus node is rarely the tree's last node: the test can tell the rows apart
    assert any(d + 1 > a for d, a in zip(res.drafted, res.acceptance_lengths))
    for k, (d, expected) in enumerate(zip(res.gate_decisions, expected_p1s(target, res))):
        assert d.p1 == pytest.approx(expected, rel=1e-4, abs=1e-6), f"decision {k}"


def test_tree_step_commit_ema_counts_the_bonus_and_the_tree_width(target):  # noqa: F811
    n = 48
    cost = CostModel(target_fixed=0.010, target_per_row=0.001, drafter_fixed=0.004)
    gate = CommitEmaGate("v2", margin=1e-9)  # never floors: every step recorded
    tree = TreeVerifier(DDTreeOptions(budget=12))  # 13 nodes verified, B = 8 drafted
    res = generate(target, _scripted(target, n, seed=9), PROMPT, n,
                   gate=GateOptions(gate, cost), verify=tree)
    assert res.floored_at is None and len(res.acceptance_lengths) >= 4
    widths = [d + 1 for d in res.drafted]  # tree nodes verified per step, root included
    assert set(widths) == {13} != {B}  # a tree's width is not the block's
    ema, expected = 0.0, []
    for commit_n, width in zip(res.acceptance_lengths, widths):
        expected.append(ema)
        step_wall = 0.004 + (0.010 + 0.001 * width)  # drafter(B) + target(N), by hand
        ema = 0.5 * ema + 0.5 * (commit_n * 0.011 / step_wall)  # t_ar = target(1) = 0.011
    got = [d.ema for d in res.gate_decisions]
    assert len(got) == len(res.acceptance_lengths)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    assert gate.ema == pytest.approx(ema, rel=1e-12)
