"""Tree verify at T > 0 (dflash_ref/spec_decode/tree_sampling.py): hand cases with scripted
uniforms, the rule's law by exact enumeration, mutants the lossless harness rejects, and
``generate(verify="tree")`` at T > 0 end to end.

The exact enumeration sums over every draw of the children (weights from q) the closed-form
acceptance probabilities ``min(1, r/q)``: the law of the emitted token in float64, which must be
p itself (1e-12). The mutants run the package's code with one line changed (monkeypatched)
through dflash_ref.testing.lossless.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dflash_ref.ops.sampling import SamplingParams
from dflash_ref.spec_decode import tree_sampling
from dflash_ref.spec_decode.extra_verifiers import SampledTreeVerifier
from dflash_ref.spec_decode.loop import generate
from dflash_ref.spec_decode.tree_sampling import (
    children,
    draw_sampled_tree,
    residual,
    tree_widths,
    verify_tree_sampled,
)
from dflash_ref.testing.lossless import Law, check_lossless, toy_target
from tests.testing.policies import verifier_step


class Scripted:
    """A generator stand-in whose ``random()`` returns the given uniforms in order."""

    def __init__(self, *u):
        self.u = list(u)

    def random(self):
        return self.u.pop(0)


def test_widths_pad_with_one():
    assert tree_widths((3, 2), 4) == (3, 2, 1, 1)
    assert tree_widths((3, 2, 2), 2) == (3, 2)


def test_draw_without_replacement_hand_case():
    # q at depth 1 = [0.5, 0.3, 0.2]: u = 0.6 -> token 1 (cumsum 0.5, 0.8); q without 1 is
    # [5/7, 0, 2/7]: u = 0.9 -> token 2. Depth 2 (width 1): q = [0.1, 0.1, 0.8], u = 0.05 -> 0
    # under node 1, u = 0.5 -> 2 under node 2.
    q = np.array([[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]])
    tree = draw_sampled_tree(9, q, (2,), Scripted(0.6, 0.9, 0.05, 0.5))
    assert tree.tokens.tolist() == [9, 1, 2, 0, 2]
    assert tree.parents.tolist() == [-1, 0, 0, 1, 2]
    assert tree.depths.tolist() == [0, 1, 1, 2, 2]
    assert children(tree) == [[1, 2], [3], [4], [], []]
    assert np.isclose(tree.log_weights[3], np.log(0.3) + np.log(0.1))
    # With replacement the second draw sees q unchanged: u = 0.9 -> token 2 as well, 0.7 -> 1.
    assert draw_sampled_tree(9, q[:1], (2,), Scripted(0.6, 0.7), True).tokens.tolist() == [9, 1, 1]


def test_verify_hand_case():
    # Depth 1 from q_1 = [0.5, 0.3, 0.2] without replacement: u = 0.6 -> 1, then u = 0.9 on
    # [5/7, 0, 2/7] -> 2; depth 2 (width 1) from q_2 = [0.6, 0.2, 0.2]: u = 0 -> 0 under each.
    q = np.array([[0.5, 0.3, 0.2], [0.6, 0.2, 0.2]])
    tree = draw_sampled_tree(9, q, (2,), Scripted(0.6, 0.9, 0.0, 0.0))
    assert tree.tokens.tolist() == [9, 1, 2, 0, 0]
    # Root p = [0.2, 0.2, 0.6]. Child 1: u = 0.9, 0.9 * 0.3 < 0.2 fails: rejected; the residual
    # max(p - q_1, 0) = [0, 0, 0.4] -> e_2, q_1 without 1 = [5/7, 0, 2/7]. Child 2: 0.99 * 2/7
    # < 1: accepted. Node 2: p = [0.1, 0.1, 0.8]; its child (token 0): 0.5 * 0.6 < 0.1 fails;
    # the residual max(p - q_2, 0) = [0, 0, 0.6] -> e_2: the bonus is 2 (u = 0.3).
    p = np.array([[0.2, 0.2, 0.6], [1 / 3, 1 / 3, 1 / 3], [0.1, 0.1, 0.8], [1, 0, 0], [1, 0, 0]])
    res = verify_tree_sampled(tree, p, q, Scripted(0.9, 0.99, 0.5, 0.3))
    assert (res.path, res.accepted, res.bonus) == ((0, 2), (2,), 2)
    assert res.committed == (2, 2) and res.bonus_row == 2 and res.a == 1
    # The same uniforms with p_root = q_1 accept child 1 at once (u q < p for u < 1).
    res = verify_tree_sampled(tree, np.vstack([q[:1], p[1:]]), q, Scripted(0.9, 0.0, 0.7))
    assert res.path[:2] == (0, 1)


def _exact_first_token_law(p, q, width, replacement, update_q=True):
    """Closed form: sum over the ordered draws of the children of P(draws) x the probability each
    stage accepts, the leftover mass from the final residual."""
    V = len(p)
    law = np.zeros(V)
    for draws in itertools.product(range(V), repeat=width):
        qq, w = q.copy(), 1.0
        for t in draws:  # the probability of this ordered draw
            w *= qq[t]
            if not replacement and w > 0:
                qq[t] = 0.0
                qq = qq / qq.sum() if qq.sum() > 0 else qq
        if w == 0:
            continue
        r, qq, reach = p.copy(), q.copy(), w
        for t in draws:
            acc = min(1.0, r[t] / qq[t])
            law[t] += reach * acc
            reach *= 1 - acc
            r = residual(r, qq)
            if not replacement and update_q and qq.sum() > qq[t]:
                qq[t] = 0.0
                qq = qq / qq.sum()
        law += reach * r
    return law


@pytest.mark.parametrize("replacement", [False, True])
@pytest.mark.parametrize("width", [1, 2, 3])
def test_exact_enumeration_gives_the_target_law(width, replacement):
    rng = np.random.default_rng(width)
    for _ in range(20):
        p = rng.dirichlet(np.ones(4) * 0.7)
        q = rng.dirichlet(np.ones(4) * 0.7)
        if not replacement and width > 1:
            q[0] = 0.0  # a token q never draws: fewer candidates than width at times
            q /= q.sum()
        assert np.allclose(_exact_first_token_law(p, q, width, replacement), p, atol=1e-12)


def test_exact_enumeration_sees_a_stale_q():
    # Without replacement, verifying the second child against the q it was NOT drawn from (q
    # not updated after the first rejection) is not lossless.
    # (Two tokens above q are needed: with one, the residual is one-hot and any q accepts it.)
    p, q = np.array([0.1, 0.3, 0.4, 0.2]), np.array([0.5, 0.1, 0.2, 0.2])
    wrong = _exact_first_token_law(p, q, 2, replacement=False, update_q=False)
    assert np.abs(wrong - p).max() > 0.02  # token 1 gets 0.271, not 0.3


LAW = Law(1.0, top_p=0.9)
V, L = 4, 2


def _draft_logits():
    return 1.5 * np.random.default_rng(7).standard_normal((L, V))


def test_the_tree_rule_passes_the_harness_at_width_three():
    report = check_lossless(verifier_step(SampledTreeVerifier(widths=(3, 2)), LAW),
                            toy_target(V, seed=3), _draft_logits(), LAW, n_trials=3000)
    assert report.ok(), report.explain()


def test_harness_rejects_a_residual_not_updated_between_children(monkeypatch):
    monkeypatch.setattr(tree_sampling, "residual", lambda r, q: r)  # r stays p
    report = check_lossless(verifier_step(SampledTreeVerifier(widths=(3, 2)), LAW),
                            toy_target(V, seed=3), _draft_logits(), LAW, n_trials=3000)
    assert report.p_value < 1e-10, report.explain()


def test_harness_rejects_a_stale_q():
    # The case test_exact_enumeration_sees_a_stale_q computes: one level of two children drawn
    # without replacement, verified as if drawn with it; token 1 is emitted w.p. 0.271, not 0.3.
    p_root, q = np.log([0.1, 0.3, 0.4, 0.2]), np.log([[0.5, 0.1, 0.2, 0.2]])
    toy = toy_target(V, seed=3)

    def target(prefix):
        return p_root if prefix == () else toy(prefix)

    law = Law(1.0)
    good = check_lossless(verifier_step(SampledTreeVerifier(widths=(2,)), law), target, q, law,
                          n_trials=20_000)
    assert good.ok(), good.explain()
    bad = check_lossless(verifier_step(_DrawsWithoutVerifiesWith(widths=(2,)), law), target, q,
                         law, n_trials=20_000)
    assert bad.p_value < 1e-10, bad.explain()


class _DrawsWithoutVerifiesWith(SampledTreeVerifier):
    def verify(self, block, logits, ctx):
        from dflash_ref.ops.sampling import sampling_probs
        law = ctx.sampling
        p = sampling_probs(ctx.be, logits, law.temperature, law.top_p, law.top_k)
        return verify_tree_sampled(block.tree, p, block.q, ctx.rng, replacement=True)


def test_generate_tree_at_temperature_runs_and_is_reproducible(tmp_path):
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel
    from dflash_ref.tiny import write_tiny_drafter, write_tiny_target

    write_tiny_target(tmp_path / "t", "qwen3", seed=21)
    write_tiny_drafter(tmp_path / "d", tmp_path / "t", seed=22, block_size=4)
    target = TargetModel.from_pretrained(tmp_path / "t")
    drafter = DFlashDrafter.from_pretrained(tmp_path / "d", target)
    prompt = np.array([3, 17, 42, 99, 5])
    runs = [generate(target, drafter, prompt, 12, verify="tree",
                     sampling=SamplingParams(1.0, seed=4)) for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 12
    assert all(1 <= a <= 4 for a in runs[0].acceptance_lengths)


@pytest.mark.gpu
def test_sampled_tree_numpy_vs_cupy_on_the_shipped_pair():
    # The draws are host float64 on each side (ops/sampling.py), so with the same seed the
    # tokens agree unless float32 logits land across an inverse-CDF boundary (not on this prompt).
    from pathlib import Path

    import dflash_ref
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel

    demo = Path(dflash_ref.__file__).parent / "data" / "demo"
    runs = []
    for backend in ("numpy", "cupy"):
        target = TargetModel.from_pretrained(demo / "target", backend=backend)
        drafter = DFlashDrafter.from_pretrained(demo / "drafter", target)
        runs.append(generate(target, drafter, np.frombuffer(b"\tdef put(self, item):\n",
                                                            np.uint8).astype(np.int64), 32,
                             verify="tree", sampling=SamplingParams(0.7, seed=0)))
    assert runs[0].tokens == runs[1].tokens
    assert runs[0].acceptance_lengths == runs[1].acceptance_lengths
