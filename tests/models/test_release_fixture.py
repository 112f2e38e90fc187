"""DFlash 2 and the draft law against values recorded from the authors' release (no torch).

``tests/models/data/release_dflash2.npz`` was written by ``scripts/record_release_dflash2.py``
with PyPI ``dflash==0.1.0`` (``DFlash2DraftModel``, ``CandidateSelector``, ``_sampling_probs``)
on the demo pair: the demo drafter with seeded convolutions and selector, two fixed prompts. The
expected values all come from the release; dflash-ref only replays the same inputs (the recorded
target features, the anchor, the recorded uniforms). ``tests/models/test_release_compat.py`` is
the live check where torch is installed; these run everywhere.

Each test is named for the bug it catches: the dynamic convolutions (which row the per-token
kernel is taken from, which half of the kernel projection is which, which base kernel the second
convolution uses), the selector (predecessor vs successor codebooks, the path advancing from row
to row), and the draft law q (temperature; top-p / top-k on DFlash rows, none on the selector's).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import dflash_ref
from dflash_ref.io.safetensors_io import load_checkpoint, write_safetensors
from dflash_ref.models import dflash2 as dflash2_module
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.ops.sampling import SamplingParams

FIXTURE = np.load(Path(__file__).parent / "data" / "release_dflash2.npz")
DEMO = Path(dflash_ref.__file__).parent / "data" / "demo"
CASES = ("a", "b")
TEMPERATURE, TOP_P, TOP_K = FIXTURE["law"]
LAW = SamplingParams(float(TEMPERATURE), float(TOP_P), int(TOP_K))
# float32 forward of three layers, summed in another order than torch: 1e-4 as in
# tests/models/test_release_compat.py
ATOL = RTOL = 1e-4


class ReplayedUniforms:
    """An ``rng`` whose ``random()`` returns the recorded uniforms in order."""

    def __init__(self, us):
        self.us = list(us)

    def random(self, size=None):
        if size is None:
            return self.us.pop(0)
        n = int(np.prod(size))
        out, self.us = np.array(self.us[:n]), self.us[n:]
        return out.reshape(size)


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    out = tmp_path_factory.mktemp("release_dflash2")
    weights = dict(load_checkpoint(DEMO / "drafter"))
    extra = {k[2:]: FIXTURE[k] for k in FIXTURE.files if k.startswith("w/")}
    # the published layout: codebooks without ".weight" (the loaders map them)
    for name in ("predecessor_codebook", "successor_codebook"):
        key = f"candidate_selector.{name}"
        extra[key] = extra.pop(key + ".weight")
    write_safetensors(out, {**weights, **extra}, config=json.loads(str(FIXTURE["config"])),
                      dtype="float32")
    target = TargetModel.from_pretrained(DEMO / "target")
    return DFlashDrafter.from_pretrained(out, target)


def block(drafter, case, monkeypatch=None):
    """Our (logits [B, V], normed rows [B, H], conv outputs [layers, 4, B, H] or None)."""
    conv = []
    if monkeypatch is not None:
        prepare, finish = dflash2_module.conv_prepare, dflash2_module.conv_finish

        def rec_prepare(*args):
            y, dyn = prepare(*args)
            conv.append(np.asarray(y))
            return y, dyn

        def rec_finish(*args):
            y = finish(*args)
            conv.append(np.asarray(y))
            return y

        monkeypatch.setattr(dflash2_module, "conv_prepare", rec_prepare)
        monkeypatch.setattr(dflash2_module, "conv_finish", rec_finish)
    ctx = FIXTURE[f"{case}/context"]
    N = ctx.shape[0]
    logits, z = drafter.forward_block(ctx, np.arange(N), int(FIXTURE[f"{case}/anchor"]), N,
                                      with_hidden=True)
    layers = drafter.config.num_hidden_layers
    conv = np.stack(conv).reshape(layers, 4, *z.shape) if conv else None
    return np.asarray(logits), np.asarray(z), conv


@pytest.mark.parametrize("case", CASES)
def test_dynamic_conv_rows_halves_and_base_kernels_match_the_release(drafter, case,
                                                                    monkeypatch):
    """Per layer: attention_conv.prepare, .finish, mlp_conv.prepare, .finish outputs."""
    _, _, conv = block(drafter, case, monkeypatch)
    expected = FIXTURE[f"{case}/conv"]
    for layer in range(expected.shape[0]):
        for j, what in enumerate(("attention prepare", "attention finish", "mlp prepare",
                                  "mlp finish")):
            np.testing.assert_allclose(conv[layer, j], expected[layer, j], atol=ATOL, rtol=RTOL,
                                       err_msg=f"case {case}, layer {layer}, {what}")


@pytest.mark.parametrize("case", CASES)
def test_dflash2_block_logits_and_normed_rows_match_the_release(drafter, case):
    logits, z, _ = block(drafter, case)
    np.testing.assert_allclose(z, FIXTURE[f"{case}/hidden"], atol=ATOL, rtol=RTOL)
    np.testing.assert_allclose(logits, FIXTURE[f"{case}/logits"], atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("case", CASES)
def test_selector_codebooks_and_path_advance_match_the_release(drafter, case):
    """Greedy path, candidates and every row's rescored candidates (the scores the release's
    argmax reads), each row given the path's previous token."""
    logits, z, _ = block(drafter, case)
    anchor = int(FIXTURE[f"{case}/anchor"])
    sel = drafter.selector.select(z[1:], logits[1:], anchor)
    np.testing.assert_array_equal(sel.candidates, FIXTURE[f"{case}/candidates"])
    np.testing.assert_allclose(sel.scores, FIXTURE[f"{case}/greedy_scores"], atol=ATOL,
                               rtol=RTOL)
    np.testing.assert_array_equal(sel.tokens, FIXTURE[f"{case}/greedy_path"])
    np.testing.assert_array_equal(drafter.propose(z, logits, anchor).tokens,
                                  FIXTURE[f"{case}/greedy_path"])


def test_fixture_selector_path_leaves_the_row_argmax():
    """The recorded case b's path differs from the per-row argmax, so a selector that ignored
    its codebooks (or a path that did not advance) cannot pass the test above."""
    path, logits = FIXTURE["b/greedy_path"], FIXTURE["b/logits"]
    assert path.tolist() != logits[1:].argmax(-1).tolist()


@pytest.mark.parametrize("case", CASES)
def test_selector_draft_law_has_temperature_and_no_top_p_top_k(drafter, case):
    """The release's selector draws row i from q_i = softmax(score_i / T) over its candidates,
    without the top-p / top-k filters (which it applies to DFlash rows only)."""
    logits, z, _ = block(drafter, case)
    anchor = int(FIXTURE[f"{case}/anchor"])
    proposal = drafter.propose(z, logits, anchor, LAW, ReplayedUniforms(FIXTURE[f"{case}/u"]))
    np.testing.assert_array_equal(proposal.candidates, FIXTURE[f"{case}/candidates"])
    np.testing.assert_allclose(proposal.q, FIXTURE[f"{case}/sampled_q"], atol=1e-5, rtol=1e-4)
    np.testing.assert_array_equal(proposal.tokens, FIXTURE[f"{case}/sampled_path"])


@pytest.mark.parametrize("case", CASES)
def test_dflash_draft_law_has_temperature_top_p_and_top_k(drafter, case):
    """A DFlash drafter's rows: q = the release's ``_sampling_probs(rows, 0.7, 0.9, 5)``."""
    logits, z, _ = block(drafter, case)
    anchor = int(FIXTURE[f"{case}/anchor"])
    proposal = DFlashDrafter.propose(drafter, z, logits, anchor, LAW,
                                     ReplayedUniforms(FIXTURE[f"{case}/u"]))
    np.testing.assert_allclose(proposal.q, FIXTURE[f"{case}/dflash_q"], atol=1e-5, rtol=1e-4)
    np.testing.assert_array_equal(proposal.tokens, FIXTURE[f"{case}/dflash_tokens"])


def test_fixture_draft_law_filters_bind():
    """Both filters cut something in the recorded rows (else skipping one would pass): case b
    has rows with exactly top_k = 5 tokens left (top-p alone would keep more) and rows with
    fewer (top-p cut inside the top 5)."""
    kept = (FIXTURE["b/dflash_q"] > 0).sum(-1)
    assert (kept == TOP_K).any() and (kept < TOP_K).any()
