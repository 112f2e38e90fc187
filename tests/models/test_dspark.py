"""DSpark drafters (models/dspark.py): the Markov chain, the anchor-first block, the confidence
head, GGUF both ways, and the unchanged loop driving it.

Expected values: float64 loops written here from llama.cpp's equations (src/models/dflash.cpp,
``build_dspark_markov_head``), and planted heads whose drafts are known by construction.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.convert_drafter import convert_drafter
from dflash_ref.io.safetensors_io import load_checkpoint, write_safetensors
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.dspark import DSparkDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.ops.sampling import SamplingParams
from dflash_ref.spec_decode.loop import generate

DEMO = Path(__file__).resolve().parents[2] / "dflash_ref" / "data" / "demo"
V, R, H = 259, 8, 128
PROMPT = list(b"def handle(self, request):\n    return self.")


def write_dspark(path, *, scale=0.5, seed=0, planted=None, conf=True):
    """The demo drafter's weights as a DSpark checkpoint with a Markov head: random, or
    ``planted`` {prev: next} with a bias of 50 on ``next`` after ``prev``."""
    w = load_checkpoint(DEMO / "drafter")
    cfg = json.loads((DEMO / "drafter" / "config.json").read_text())
    cfg["architectures"] = ["DSparkDraftModel"]
    rng = np.random.default_rng(seed)
    if planted is None:
        w1 = rng.standard_normal((V, R)).astype(np.float32) * scale
        w2 = rng.standard_normal((V, R)).astype(np.float32) * scale
    else:
        w1, w2 = np.zeros((V, R), np.float32), np.zeros((V, R), np.float32)
        for k, (prev, nxt) in enumerate(planted.items()):
            w1[prev, k] = 1.0
            w2[nxt, k] = 50.0
    w["markov_head.markov_w1.weight"], w["markov_head.markov_w2.weight"] = w1, w2
    if conf:
        w["confidence_head.proj.weight"] = rng.standard_normal((1, H + R)).astype(np.float32)
        w["confidence_head.proj.bias"] = np.array([0.25], np.float32)
    return write_safetensors(path, w, config=cfg)


@pytest.fixture(scope="module")
def target():
    return TargetModel.from_pretrained(DEMO / "target")


def _drafter(path, target):
    d = DFlashDrafter.from_pretrained(path, target)
    assert type(d) is DSparkDrafter
    return d


def _block(d, target):
    state = target.new_state()
    out = target.forward(np.asarray(PROMPT), state)
    feats = np.asarray(out.features)
    n = len(PROMPT)
    return d.forward_block(feats[: n - 1], np.arange(n - 1), PROMPT[-1], n - 1, with_hidden=True)


def test_chain_is_the_biased_argmax_keyed_on_the_previous_draft(tmp_path, target):
    d = _drafter(write_dspark(tmp_path / "d", scale=1.5), target)
    logits, hidden = _block(d, target)
    assert logits.shape == (d.block_size - 1, V)  # anchor first: 7 rows draft 7 tokens
    w1 = np.asarray(d.markov_w1, np.float64)
    w2 = np.asarray(d.markov_w2, np.float64)
    prev, want = PROMPT[-1], []
    for i in range(logits.shape[0]):  # float64, from the equations
        row = np.asarray(logits[i], np.float64) + w2 @ w1[prev]
        prev = int(np.argmax(row))
        want.append(prev)
    biased, tokens = d.chain(logits, PROMPT[-1])
    assert tokens.tolist() == want
    assert d.propose(hidden, logits, PROMPT[-1]).tokens.tolist() == want
    unbiased = np.argmax(np.asarray(logits), axis=1).tolist()
    assert want != unbiased  # the head changed the drafts: the test sees the bias


def test_planted_successors_are_drafted_from_the_anchor_row(tmp_path, target):
    a = PROMPT[-1]  # "."
    planted = {a: ord("x"), ord("x"): ord("y"), ord("y"): ord("z"), ord("z"): ord("x")}
    d = _drafter(write_dspark(tmp_path / "p", planted=planted, conf=False), target)
    logits, hidden = _block(d, target)
    assert bytes(d.propose(hidden, logits, a).tokens.tolist()) == b"xyzxyzx"
    assert d.confidence(hidden, logits, a) is None


def test_confidence_head(tmp_path, target):
    d = _drafter(write_dspark(tmp_path / "c"), target)
    logits, hidden = _block(d, target)
    _, tokens = d.chain(logits, PROMPT[-1])
    prev = [PROMPT[-1], *tokens[:-1].tolist()]
    w = np.asarray(d.conf_w, np.float64)[0]
    want = [1 / (1 + np.exp(-(np.concatenate([np.asarray(hidden[i], np.float64),
                                              np.asarray(d.markov_w1[p], np.float64)]) @ w
                              + 0.25))) for i, p in enumerate(prev)]
    np.testing.assert_allclose(np.asarray(d.confidence(hidden, logits, PROMPT[-1])), want,
                               rtol=1e-5, atol=1e-6)


def test_the_loop_is_lossless_and_gguf_round_trips(tmp_path, target):
    src = write_dspark(tmp_path / "d")
    d = _drafter(src, target)
    plain = generate(target, None, PROMPT, 40).tokens
    spec = generate(target, d, PROMPT, 40)
    assert spec.tokens == plain
    path = convert_drafter(src, tmp_path / "d.gguf", "f32", "llama.cpp", target=DEMO / "target",
                           progress=False)
    g_target = TargetModel.from_pretrained(DEMO / "target")
    g = DFlashDrafter.from_gguf(path, g_target)
    assert type(g) is DSparkDrafter and g.has_confidence_head
    again = generate(g_target, g, PROMPT, 40)
    assert again.tokens == spec.tokens and again.acceptance_lengths == spec.acceptance_lengths


def test_bad_heads_and_laws_are_refused(tmp_path, target):
    d = _drafter(write_dspark(tmp_path / "d"), target)
    logits, hidden = _block(d, target)
    with pytest.raises(ConfigError, match="greedily"):
        d.propose(hidden, logits, 0, SamplingParams(temperature=0.7, seed=1),
                  np.random.default_rng(0))
    w = load_checkpoint(tmp_path / "d")
    w["markov_head.markov_w2.weight"] = w["markov_head.markov_w2.weight"][:, :4]
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    write_safetensors(tmp_path / "bad", w, config=cfg)
    with pytest.raises(FormatError, match=r"\[vocab, rank\]"):
        DFlashDrafter.from_pretrained(tmp_path / "bad", target)


@pytest.mark.gpu
def test_dspark_on_cupy_runs_the_same_ops(tmp_path, target):
    """The CuPy backend runs DSpark through the same code: lossless, and about as accepted (a
    near-tie in the chained argmax may move under the kernels' float32 rounding)."""
    src = write_dspark(tmp_path / "d")
    ref = generate(target, _drafter(src, target), PROMPT, 40)
    gpu_target = TargetModel.from_pretrained(DEMO / "target", backend="cupy")
    got = generate(gpu_target, _drafter(src, gpu_target), PROMPT, 40)
    assert got.tokens == ref.tokens
    assert abs(np.mean(got.acceptance_lengths) - np.mean(ref.acceptance_lengths)) <= 0.5
