"""dflash-ref against the authors' release itself: PyPI ``dflash`` 0.1.0 (``dflash/model.py``).

The drafters are built with the release's own classes (``DFlashDraftModel``,
``DFlash2DraftModel``), saved with ``save_pretrained`` and loaded by both sides; the target is the
shipped demo Qwen3 run by transformers' ``Qwen3ForCausalLM``. The expected values are the
release's outputs (an independent implementation in torch), never dflash-ref's. The shipped demo
drafter is also loaded from its directory, unchanged, by ``DFlashDraftModel.from_pretrained``.

Needs torch, transformers and ``dflash==0.1.0`` (the ``compat`` extra); skipped without them.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
release = pytest.importorskip("dflash.model")

import dflash_ref  # noqa: E402
from dflash_ref.io.safetensors_io import load_checkpoint, write_safetensors  # noqa: E402
from dflash_ref.models.drafter import DFlashDrafter  # noqa: E402
from dflash_ref.models.target import TargetModel  # noqa: E402
from dflash_ref.spec_decode.loop import generate  # noqa: E402
from dflash_ref.spec_decode.verifiers import ChainVerifier  # noqa: E402

RELEASE_VERSION = "0.1.0"
if importlib.metadata.version("dflash") != RELEASE_VERSION:
    pytest.skip(f"these tests pin dflash=={RELEASE_VERSION}", allow_module_level=True)

DEMO = Path(dflash_ref.__file__).parent / "data" / "demo"
DFLASH2_KEYS = {"conv_kernel_size": 3, "conv_group_size": 16, "selector_rank": 8,
                "selector_top_k": 6}
KINDS = ("dflash", "dflash_swa", "dflash2")
PROMPTS = [np.random.default_rng(s).integers(3, 250, size=n) for s, n in ((1, 12), (2, 20),
                                                                           (3, 7))]


def _release_drafter(kind: str, out: Path):
    """The demo drafter's weights in a release class; DFlash 2 adds near-identity convolutions and
    a random selector. Saved in the z-lab layout (codebooks without ``.weight``, as published)."""
    from transformers import Qwen3Config

    raw = json.loads((DEMO / "drafter" / "config.json").read_text())
    raw["torch_dtype"] = "float32"
    if kind == "dflash_swa":  # layer 0 sliding: causal by default in the release
        n = raw["num_hidden_layers"]
        raw.update(layer_types=["sliding_attention"] + ["full_attention"] * (n - 1),
                   sliding_window=8, use_sliding_window=True, max_window_layers=n)
    if kind == "dflash2":
        raw["architectures"] = ["DFlash2DraftModel"]
        raw["dflash_config"] = {**raw["dflash_config"], **DFLASH2_KEYS}
    config = Qwen3Config(**raw)
    cls = release.DFlash2DraftModel if kind == "dflash2" else release.DFlashDraftModel
    model = cls(config).float().eval()
    weights = {k: torch.from_numpy(v) for k, v in load_checkpoint(DEMO / "drafter").items()}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in weights:
                continue
            if name.endswith("base_kernel"):  # [2, K, H]: tap 0 near 1, later taps small
                p.copy_(0.01 * torch.randn(p.shape, generator=g))
                p[:, 0] += 1.0
            elif "kernel_projection" in name:
                p.copy_(0.005 * torch.randn(p.shape, generator=g))
            else:  # codebooks [V, r], hidden_projection [r, H]
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    assert {n for n in missing} == {n for n, _ in model.named_parameters() if n not in weights}
    model.save_pretrained(out)
    if kind == "dflash2":  # the published layout: the loaders map the codebook keys
        sd = load_checkpoint(out)
        for name in ("predecessor_codebook", "successor_codebook"):
            sd[f"candidate_selector.{name}"] = sd.pop(f"candidate_selector.{name}.weight")
        cfg = json.loads((out / "config.json").read_text())
        for f in out.glob("*.safetensors*"):
            f.unlink()
        write_safetensors(out, sd, config=cfg, overwrite=True)
        model = cls.from_pretrained(out, dtype=torch.float32).eval()
    return model


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from transformers import Qwen3ForCausalLM

    hf_target = Qwen3ForCausalLM.from_pretrained(DEMO / "target", dtype=torch.float32).eval()
    out = {}
    for kind in KINDS:
        d = tmp_path_factory.mktemp(kind)
        rel = _release_drafter(kind, d)
        ours_target = TargetModel.from_pretrained(DEMO / "target")
        out[kind] = (hf_target, rel, ours_target, DFlashDrafter.from_pretrained(d, ours_target))
    return out


def _block_logits(hf_target, rel, target, drafter, prompt, anchor):
    """One draft block after ``prompt``: (release logits [B, V], release hidden z [1, B, H],
    our logits [B, V], our final-normed rows z [B, H]); the release sees transformers'
    hidden states of the target, dflash-ref its own captured features."""
    N, B = prompt.size, drafter.block_size
    with torch.no_grad():
        hs = hf_target(torch.tensor(prompt[None]), output_hidden_states=True).hidden_states
        ctx = release.extract_context_feature(hs, rel.target_layer_ids)
        block = torch.tensor([[anchor] + [rel.mask_token_id] * (B - 1)])
        noise = release._raw_input_embeddings(hf_target, block)
        z_rel = rel(target_hidden=ctx, noise_embedding=noise,
                    position_ids=torch.arange(N + B)[None])
        l_rel = rel.compute_logits(z_rel, hf_target.lm_head)[0].numpy()
    feats = target.forward(prompt, target.new_state()).features
    logits, z = drafter.forward_block(feats, np.arange(N), anchor, N, with_hidden=True)
    return l_rel, z_rel, logits, z


@pytest.mark.parametrize("kind", KINDS)
def test_block_logits_and_selector_path_match_the_release(pair, kind):
    hf_target, rel, target, drafter = pair[kind]
    assert drafter.is_dflash2 == (kind == "dflash2")
    differs = False
    for prompt in PROMPTS:
        anchor = int(prompt[-1]) ^ 1
        l_rel, z_rel, logits, z = _block_logits(hf_target, rel, target, drafter, prompt, anchor)
        np.testing.assert_allclose(logits, l_rel, atol=1e-4, rtol=1e-4)
        ours = drafter.propose(z, logits, anchor).tokens
        if kind == "dflash2":
            with torch.no_grad():
                path, cand, _ = rel.propose(z_rel[:, 1:], torch.tensor([anchor]),
                                            hf_target.lm_head, 0.0)
            assert ours.tolist() == path[0].tolist()
            sel = drafter.selector.select(z[1:], logits[1:], anchor)
            assert sorted(sel.candidates[0].tolist()) == sorted(cand[0, 0].tolist())
            differs |= ours.tolist() != logits[1:].argmax(-1).tolist()
        else:
            assert ours.tolist() == l_rel[1:].argmax(-1).tolist()
    if kind == "dflash2":
        assert differs, "the selector should move some path away from the per-row argmax"


def test_the_shipped_drafter_loads_unchanged_with_the_release(pair):
    """``dflash.model.DFlashDraftModel.from_pretrained`` on the shipped directory as it is (no
    key mapping, no config edit): its block logits are ours within 1e-4."""
    hf_target = pair["dflash"][0]
    rel = release.DFlashDraftModel.from_pretrained(DEMO / "drafter", dtype=torch.float32).eval()
    assert type(rel) is release.DFlashDraftModel and rel.target_layer_ids == [1, 2]
    target = TargetModel.from_pretrained(DEMO / "target")
    drafter = DFlashDrafter.from_pretrained(DEMO / "drafter", target)
    prompt = PROMPTS[1]
    l_rel, _, logits, _ = _block_logits(hf_target, rel, target, drafter, prompt,
                                        int(prompt[-1]) ^ 1)
    np.testing.assert_allclose(logits, l_rel, atol=1e-4, rtol=1e-4)
    assert np.abs(l_rel).max() > 1.0  # real logits, not a zeroed head


def _release_generate(monkeypatch, rel, hf_target, prompt, n, stops=None):
    import time

    monkeypatch.setattr(release, "_cuda_time", time.perf_counter)  # CPU: no cuda synchronize
    out = release.dflash_generate(rel, hf_target, torch.tensor(prompt[None]), n, stops,
                                  return_stats=True)
    return out.output_ids[0, prompt.size:].tolist(), out.acceptance_lengths


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_generate_equals_the_release_token_for_token(pair, kind, monkeypatch):
    hf_target, rel, target, drafter = pair[kind]
    longest = 1
    for prompt, n in zip(PROMPTS, (40, 33, 25)):
        tokens, acc = _release_generate(monkeypatch, rel, hf_target, prompt, n)
        res = generate(target, drafter, prompt, n, verify=ChainVerifier(draft_rows="verify"))
        assert res.tokens == tokens
        assert res.acceptance_lengths == acc
        longest = max(longest, *acc)
        # A stop token cuts a step: the release counts what was produced up to it.
        stop = tokens[n // 2]
        tokens, acc = _release_generate(monkeypatch, rel, hf_target, prompt, n, [stop])
        res = generate(target, drafter, prompt, n, verify=ChainVerifier(draft_rows="verify"),
                       stop_token_ids=[stop])
        assert res.tokens == tokens and res.acceptance_lengths == acc
    assert longest > 1, "the drafter must be accepted sometimes for this to be a test"
