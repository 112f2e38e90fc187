"""Record a tiny DFlash 2 drafter's outputs from the authors' release, for CPU tests without torch.

Run where torch, transformers and the release (PyPI ``dflash==0.1.0``) are installed::

    python scripts/record_release_dflash2.py   # writes tests/models/data/release_dflash2.npz

The drafter is the demo drafter (``dflash_ref/data/demo/drafter``) in the release's
``DFlash2DraftModel`` with seeded near-identity convolutions and a seeded selector (the same
construction as ``tests/models/test_release_compat.py``); the target is the demo target, run by
transformers. For each case (a fixed prompt and anchor) the file holds, all computed by the
release:

- ``w/<name>``: the DFlash 2 parameters the demo drafter lacks (convolutions, selector);
- ``{case}/context`` [N, 2H]: the target features the release reads (transformers' hidden
  states at the drafter's target layers), ``{case}/anchor``;
- ``{case}/logits`` [B, V], ``{case}/hidden`` [B, H]: the block's logits and final-normed rows;
- ``{case}/conv`` [layers, 4, B, H]: per layer, the outputs of ``attention_conv.prepare``,
  ``attention_conv.finish``, ``mlp_conv.prepare``, ``mlp_conv.finish``;
- ``{case}/greedy_path`` [B-1], ``{case}/candidates`` [B-1, k] (descending logit),
  ``{case}/greedy_scores`` [B-1, k]: ``CandidateSelector.select`` at temperature 0 and the
  scores its argmax reads;
- ``{case}/u`` [B-1]: uniforms; the release's draws are replaced by inverse-CDF sampling with
  them (``token = min{i : cumsum(q)_i > u * sum(q)}``, dflash-ref's ``sample_from_probs`` rule),
  so a test can replay the same draws;
- ``{case}/sampled_path``, ``{case}/sampled_q`` [B-1, k]: the selector at T = 0.7 (its q rows,
  on ``candidates``);
- ``{case}/dflash_q`` [B-1, V], ``{case}/dflash_tokens`` [B-1]: the release's DFlash draft law
  ``_sampling_probs(logits[1:], 0.7, top_p=0.9, top_k=5)`` and the drafts drawn from it.

The release's ``torch.topk(sorted=False)`` in the selector is run with ``sorted=True`` so the
candidates come in descending-logit order (the order changes no path and no law, only which index
a draw maps to).
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dflash_ref.io.safetensors_io import load_checkpoint  # noqa: E402

DEMO = ROOT / "dflash_ref" / "data" / "demo"
OUT = ROOT / "tests" / "models" / "data" / "release_dflash2.npz"
RELEASE_VERSION = "0.1.0"
DFLASH2_KEYS = {"conv_kernel_size": 3, "conv_group_size": 16, "selector_rank": 8,
                "selector_top_k": 6}
TEMPERATURE, TOP_P, TOP_K = 0.7, 0.9, 5
CASES = {"a": (1, 12), "b": (3, 7)}  # name: (seed, prompt length)


def release_drafter(release):
    """The demo drafter in ``DFlash2DraftModel``, the extra parameters seeded (float32)."""
    from transformers import Qwen3Config

    raw = json.loads((DEMO / "drafter" / "config.json").read_text())
    raw["torch_dtype"] = "float32"
    raw["architectures"] = ["DFlash2DraftModel"]
    raw["dflash_config"] = {**raw["dflash_config"], **DFLASH2_KEYS}
    model = release.DFlash2DraftModel(Qwen3Config(**raw)).float().eval()
    weights = {k: torch.from_numpy(v) for k, v in load_checkpoint(DEMO / "drafter").items()}
    model.load_state_dict(weights, strict=False)
    g = torch.Generator().manual_seed(7)
    extra = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in weights:
                continue
            if name.endswith("base_kernel"):  # [2, K, H]: tap 0 near 1, later taps small
                p.copy_(0.01 * torch.randn(p.shape, generator=g))
                p[:, 0] += 1.0
            elif "kernel_projection" in name:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            else:  # codebooks [V, r], hidden_projection [r, H]
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            extra[name] = p.detach().numpy().copy()
    return model, raw, extra


class _TorchProxy:
    """``torch`` for the selector's module namespace: topk sorted, argmax inputs recorded."""

    def __init__(self):
        self.argmax_inputs = []

    def __getattr__(self, name):
        return getattr(torch, name)

    def topk(self, x, k, dim=-1, sorted=False):  # noqa: A002 (torch's keyword)
        return torch.topk(x, k, dim=dim, sorted=True)

    def argmax(self, x, dim=-1):
        self.argmax_inputs.append(x.detach().clone())
        return torch.argmax(x, dim=dim)


def _inverse_cdf(us):
    """A replacement for the release's ``_sample_probs`` drawing with the uniforms ``us``."""
    draws = iter(us)

    def sample(probs):
        flat = probs.reshape(-1, probs.shape[-1]).double()
        c = flat.cumsum(-1)
        out = []
        for row, ci in zip(flat, c):
            u = next(draws)
            idx = int((ci <= u * ci[-1]).sum())
            out.append(min(idx, int(torch.nonzero(row > 0).max())))
        return torch.tensor(out, dtype=torch.long).view(probs.shape[:-1])

    return sample


def record_case(release, hf_target, model, seed, n):
    prompt = np.random.default_rng(seed).integers(3, 250, size=n)
    anchor = int(prompt[-1]) ^ 1
    B = model.block_size
    rec = {}
    conv_out = []

    def wrap(conv):
        prepare, finish = conv.prepare, conv.finish

        def p(hidden):
            y, d = prepare(hidden)
            conv_out.append(y[0].detach().numpy().copy())
            return y, d

        def f(hidden, dynamic):
            y = finish(hidden, dynamic)
            conv_out.append(y[0].detach().numpy().copy())
            return y

        conv.prepare, conv.finish = p, f

    convs = [c for layer in model.layers for c in (layer.attention_conv, layer.mlp_conv)]
    for conv in convs:
        wrap(conv)
    with torch.no_grad():
        hs = hf_target(torch.tensor(prompt[None]), output_hidden_states=True).hidden_states
        ctx = release.extract_context_feature(hs, model.target_layer_ids)
        block = torch.tensor([[anchor] + [model.mask_token_id] * (B - 1)])
        noise = release._raw_input_embeddings(hf_target, block)
        z = model(target_hidden=ctx, noise_embedding=noise, position_ids=torch.arange(n + B)[None])
        head = release._output_head(hf_target)
        logits = model.compute_logits(z, head)
        rec["context"] = ctx[0].numpy()
        rec["anchor"] = np.array(anchor)
        rec["logits"], rec["hidden"] = logits[0].numpy(), z[0].numpy()
        rec["conv"] = np.stack(conv_out).reshape(len(model.layers), 4, B, -1)
        for conv in convs:  # the class's methods again
            del conv.prepare, conv.finish

        proxy = _TorchProxy()
        release.torch, sample_probs = proxy, release._sample_probs
        try:
            path, cand, _ = model.propose(z[:, 1:], torch.tensor([anchor]), head, 0.0)
            rec["greedy_path"], rec["candidates"] = path[0].numpy(), cand[0].numpy()
            rec["greedy_scores"] = torch.cat(proxy.argmax_inputs).numpy()
            us = np.random.default_rng(100 + seed).random(B - 1)
            rec["u"] = us
            release._sample_probs = _inverse_cdf(us)
            path, cand_s, q = model.propose(z[:, 1:], torch.tensor([anchor]), head, TEMPERATURE)
            assert torch.equal(cand_s, cand)
            rec["sampled_path"], rec["sampled_q"] = path[0].numpy(), q[0].numpy()
            release._sample_probs = _inverse_cdf(us)
            q1 = release._sampling_probs(logits[:, 1:], TEMPERATURE, TOP_P, TOP_K)
            rec["dflash_q"] = q1[0].numpy()
            rec["dflash_tokens"] = release._sample_probs(q1)[0].numpy()
        finally:  # the release's own torch and draws again
            release.torch, release._sample_probs = torch, sample_probs
    return rec


def main() -> None:
    import dflash.model as release
    from transformers import Qwen3ForCausalLM

    version = importlib.metadata.version("dflash")
    if version != RELEASE_VERSION:
        raise SystemExit(f"error: this records dflash=={RELEASE_VERSION}, found {version}")
    torch.manual_seed(0)
    hf_target = Qwen3ForCausalLM.from_pretrained(DEMO / "target", dtype=torch.float32).eval()
    model, raw, extra = release_drafter(release)
    out = {f"w/{k}": v for k, v in extra.items()}
    out["config"] = np.array(json.dumps(raw))
    out["law"] = np.array([TEMPERATURE, TOP_P, TOP_K])
    for name, (seed, n) in CASES.items():
        for k, v in record_case(release, hf_target, model, seed, n).items():
            out[f"{name}/{k}"] = v
    out = {k: (v.astype(np.float32) if v.dtype == np.float64 and k.split("/")[-1] != "u"
               and k != "law" else v) for k, v in out.items()}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **out)
    print(f"wrote {OUT.relative_to(ROOT)} ({OUT.stat().st_size} bytes, dflash {version})")


if __name__ == "__main__":
    main()
