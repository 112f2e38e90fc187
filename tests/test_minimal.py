"""dflash_ref/minimal.py, DFlash in one page, against the package (docs/overview.md, step 0).

Every expected value comes from the package's own ``generate()`` (an independent implementation),
never from the page itself: greedily, the same tokens and the same drafts at every step on the
shipped demo pair and on tiny Qwen3 checkpoints of other shapes and block sizes; sampled, the same
tokens for the same seed. The page's rejection rule passes the lossless harness, and each one-line
mutant of it is rejected by the same harness. And the page stays a page.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

import dflash_ref.minimal as minimal
from dflash_ref import DFlashDrafter, TargetModel, generate
from dflash_ref.demo_text import demo_held_out_prompts
from dflash_ref.ops.sampling import SamplingParams
from dflash_ref.spec_decode.observe import Observer
from dflash_ref.testing.lossless import Law, assert_lossless, check_lossless, toy_target
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "dflash_ref" / "minimal.py"
DEMO = ROOT / "dflash_ref" / "data" / "demo"
MAIN_TEXT = "\tdef put(self, item, block=True, timeout=None):\n\t\t'''Put an item into the queue.\n"


class Drafts(Observer):
    """The drafts the package's drafter proposed, one array per speculative step."""

    def __init__(self):
        self.steps = []

    def on_draft(self, anchor, positions, logits, proposal):
        self.steps.append([int(t) for t in proposal.tokens])


def page_greedy(target, drafter, prompt, n):
    """The page's greedy tokens and its drafts per step (its ``propose``, recorded)."""
    steps = []

    def propose(draft_logits):
        drafts, q = minimal.greedy_propose(draft_logits)
        steps.append([int(t) for t in drafts])
        return drafts, q

    return minimal.generate(target, drafter, prompt, n, propose=propose), steps


def assert_same_run(pair, page_pair, prompt, n):
    """Token for token and draft for draft, the page against ``generate()``; returns the
    package's result."""
    observed = Drafts()
    expected = generate(*pair, prompt, n, observer=observed)
    tokens, drafts = page_greedy(*page_pair, prompt, n)
    assert tokens == expected.tokens
    assert drafts == observed.steps
    return expected


def load_pair(target_dir, drafter_dir):
    target = TargetModel.from_pretrained(target_dir)
    return ((target, DFlashDrafter.from_pretrained(drafter_dir, target)),
            (minimal.load(target_dir), minimal.load(drafter_dir)))


@pytest.fixture(scope="module")
def demo():
    return load_pair(DEMO / "target", DEMO / "drafter")


# -- greedy: the shipped pair ------------------------------------------------------------------


@pytest.mark.parametrize("k", range(16))
def test_greedy_equals_generate_on_the_demo_pair(demo, k):
    prompt = demo_held_out_prompts(16)[k]
    expected = assert_same_run(*demo, prompt, 48)
    assert len(expected.tokens) == 48


def test_the_demo_prompts_accept_drafts(demo):
    # The equality above checks the drafter only where drafts are accepted and rolled back for
    # real: on the shipped pair most steps commit several tokens.
    taus = [generate(*demo[0], p, 48).tau for p in demo_held_out_prompts(16)[:4]]
    assert min(taus) > 2.0, taus


# -- greedy: tiny Qwen3 checkpoints of other shapes ---------------------------------------------

# (target config.json overrides, drafter config overrides, weight seed): other widths, head
# counts (GQA groups of 3, plain multi-head), head sizes (nh * d != H), layer counts, RoPE bases,
# tied and untied heads, block sizes 4 and 12, captures in either order. Small vocabularies and
# the seeds chosen so that a random drafter still has some drafts accepted.
SHAPES = {
    "H96-gqa3-B4": (
        dict(hidden_size=96, intermediate_size=160, num_hidden_layers=3, num_attention_heads=6,
             num_key_value_heads=2, head_dim=16, rope_theta=10000.0, vocab_size=40),
        dict(block_size=4, num_hidden_layers=1, target_layer_ids=(1, 0), num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, mask_token_id=39), 3),
    "H48-mha-B12": (
        dict(hidden_size=48, intermediate_size=96, num_hidden_layers=5, num_attention_heads=8,
             num_key_value_heads=8, head_dim=8, tie_word_embeddings=True, vocab_size=16),
        dict(block_size=12, num_hidden_layers=3, target_layer_ids=(1, 2, 3),
             num_attention_heads=4, num_key_value_heads=2, head_dim=12, mask_token_id=15,
             rope_theta=500000.0), 5),
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def tiny(request, tmp_path_factory):
    target_kw, drafter_kw, seed = SHAPES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    target_dir = write_tiny_target(root / "target", "qwen3", seed=seed, **target_kw)
    drafter_dir = write_tiny_drafter(root / "drafter", target_dir, seed=seed + 1, **drafter_kw)
    return load_pair(target_dir, drafter_dir)


def test_greedy_equals_generate_on_tiny_shapes(tiny):
    rng = np.random.default_rng(0)
    vocab = tiny[0][0].config.vocab_size
    accepted = 0
    for n_prompt in (5, 17, 30):
        prompt = rng.integers(0, vocab - 1, n_prompt).tolist()
        accepted += sum(a - 1 for a in assert_same_run(*tiny, prompt, 40).acceptance_lengths)
    assert accepted > 0  # some drafts are accepted, so rows are kept as well as rolled back


# -- sampled: the same tokens for the same seed ------------------------------------------------


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(0.7, 0, 1.0), (1.0, 20, 0.9)])
def test_sampled_equals_generate_on_the_demo_pair(demo, temperature, top_k, top_p):
    # The page draws its uniforms in the package's order (first token, drafts, accept, bonus),
    # so one seed gives one output.
    for k, prompt in enumerate(demo_held_out_prompts(4)):
        law = SamplingParams(temperature, top_p=top_p, top_k=top_k, seed=k)
        expected = generate(*demo[0], prompt, 48, sampling=law).tokens
        assert minimal.generate_sampled(*demo[1], prompt, 48, temperature, top_k, top_p,
                                        seed=k) == expected


# -- sampled: the rule is lossless, its one-line mutants are not -------------------------------

V, L = 4, 2  # the harness's toy sizes (tests/testing/test_lossless.py)
LAWS = {"T1": Law(1.0), "T0.9-topk3-topp0.9": Law(0.9, top_k=3, top_p=0.9),
        "T1.3-topp0.8": Law(1.3, top_p=0.8)}


def draft_logits(seed: int = 7, scale: float = 1.5) -> np.ndarray:
    return scale * np.random.default_rng(seed).standard_normal((L, V))


def page_step(page, law: Law):
    """One speculative step of ``page`` (the module or a mutant) for the harness: drafts drawn
    from the page's law of the draft rows, the target's law per verify row, the page's rule."""
    def law_of(logits):
        return page.probs(logits, law.temperature, law.top_k, law.top_p)

    def step(target, dl, rng):
        q = law_of(dl)  # [L, V]
        drafts = [page.draw(qj, u) for qj, u in zip(q, rng.random(len(q)))]
        p = np.stack([law_of(target(tuple(drafts[:j]))) for j in range(len(drafts) + 1)])
        a, bonus = page.accept_or_resample(np.array(drafts), q, p, rng)
        return (*drafts[:a], bonus)

    return step


@pytest.mark.parametrize("name", sorted(LAWS))
def test_the_sampling_rule_is_lossless(name):
    law = LAWS[name]
    report = assert_lossless(page_step(minimal, law), toy_target(V, seed=11), draft_logits(), law,
                             n_trials=4000)
    assert 1.0 < report.acceptance <= L + 1


MUTANTS = {  # one line of the rule, and what it becomes
    "accept with min(1, q/p)": ("if not u[j] * q[j, d] < p[j, d]:",
                                "if not u[j] * p[j, d] < q[j, d]:"),
    "residual max(q - p, 0)": ("draw(np.maximum(p[j] - q[j], 0.0), u_bonus)",
                               "draw(np.maximum(q[j] - p[j], 0.0), u_bonus)"),
    "bonus from q after a rejection": ("draw(np.maximum(p[j] - q[j], 0.0), u_bonus)",
                                       "draw(q[j], u_bonus)"),
    "bonus from p after a rejection": ("draw(np.maximum(p[j] - q[j], 0.0), u_bonus)",
                                       "draw(p[j], u_bonus)"),
}


def mutant(line: str, replacement: str) -> types.ModuleType:
    """The page with one line of its source changed, as a module of its own."""
    source = PAGE.read_text()
    assert source.count(line) == 1 and "\n" not in line
    module = types.ModuleType("minimal_mutant")
    exec(compile(source.replace(line, replacement), str(PAGE), "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_a_one_line_mutant_of_the_rule_is_rejected(name):
    law = LAWS["T1.3-topp0.8"]
    report = check_lossless(page_step(mutant(*MUTANTS[name]), law), toy_target(V, seed=11),
                            draft_logits(), law, n_trials=3000)
    assert not report.ok()
    assert report.p_value < 1e-10, report.explain()


# -- the page stays a page and runs ------------------------------------------------------------


def test_the_page_fits_its_budget():
    text = PAGE.read_bytes()
    assert text.count(b"\n") <= 200  # wc -l
    greedy = text[: text.index(b"# ---") ].count(b"\n")  # the sampling tail is marked
    assert b"sampling" in text[text.index(b"# ---"):].split(b"\n")[0]
    assert greedy <= 150


def test_python_m_runs_the_shipped_pair(demo):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "utf-8"}
    out = subprocess.run([sys.executable, "-m", "dflash_ref.minimal"], cwd=ROOT, env=env,
                         capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    target = demo[0][0]
    ids = list(MAIN_TEXT.encode())  # the demo's byte vocabulary: id b is byte b
    continuation = bytes(generate(target, demo[0][1], ids, 96).tokens).decode(errors="replace")
    assert out.stdout.decode() == MAIN_TEXT + continuation + "\n"
