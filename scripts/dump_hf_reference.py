"""A dumper for a stack that is not ours: HF transformers' model code for the target and the
authors' z-lab ``dflash`` package (``DFlashDraftModel``) for the drafter, in PyTorch.

It writes the golden-vector layout (docs/golden_vectors.md) for an exported reference case,
teacher-forced: every step starts from the reference's committed prefix and the reference's step
inputs (the anchor, the drafts), so a difference shows up at the tensor that first computes it and
does not snowball into different later steps. Each forward runs the whole sequence without a
cache (slow and simple: HF's own attention masks, its own GDN kernels), so the logits, the
captured features and the drafter's outputs are the foreign stack's. The verify decision is its
own (greedy argmax); sampled and DDTree steps keep only the tensors a greedy chain defines.

``--bug`` plants one of the classic integration bugs, to show that ``dflash-ref oracle compare``
locates it:

- ``layer_shift``: captures ``hidden_states[i]`` instead of ``hidden_states[i + 1]`` (the "+1");
- ``no_embed_scale``: Gemma's embedding scale left unapplied (HF's scaled embedding set to 1);
- ``swa_full``: sliding-window layers run as full attention.

    python scripts/dump_hf_reference.py REF_CASE OUT --target DIR --drafter DIR [--bug NAME]
    dflash-ref oracle compare REF_CASE OUT
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

BUGS = ("none", "layer_shift", "no_embed_scale", "swa_full")


def _np(x) -> np.ndarray:
    return x.detach().to("cpu").float().numpy().copy()


def load_models(target_dir, drafter_dir, bug: str = "none"):
    """(HF target, z-lab drafter or None), float32, eager attention."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32,
                                                  attn_implementation="eager").eval()
    inner = target.model
    if bug == "no_embed_scale" and hasattr(inner.embed_tokens, "embed_scale"):
        inner.embed_tokens.embed_scale.fill_(1.0)
    if bug == "swa_full":
        target.config.sliding_window = 1 << 30
        for layer in inner.layers:
            attn = getattr(layer, "self_attn", None)
            if attn is not None and getattr(attn, "sliding_window", None):
                attn.sliding_window = None
    drafter = None
    if drafter_dir is not None:
        try:
            from dflash.model import DFlashDraftModel
        except ImportError:  # the z-lab package is optional: the drafter tensors stay missing
            return target, None
        drafter = DFlashDraftModel.from_pretrained(str(drafter_dir), dtype=torch.float32).eval()
    return target, drafter


class _Hooks:
    """Per-layer intermediates of one HF forward, sliced to the step's rows (layout names)."""

    def __init__(self, target, rows: int):
        self.out: dict[tuple[int, str], np.ndarray] = {}
        self.handles, self.rows = [], rows
        for i, layer in enumerate(target.model.layers):
            self._on(layer, i, "h", lambda m, a, o: o[0] if isinstance(o, tuple) else o)
            self._on(layer.input_layernorm, i, "attn_norm")
            gemma = hasattr(layer, "pre_feedforward_layernorm")
            mixer = getattr(layer, "self_attn", None) or getattr(layer, "linear_attn", None)
            if gemma:
                self._on(layer.post_attention_layernorm, i, "attn_out")
                self._on(layer.pre_feedforward_layernorm, i, "mlp_norm")
                self._on(layer.post_feedforward_layernorm, i, "mlp_out")
            else:
                self._on(mixer, i, "attn_out", lambda m, a, o: o[0] if isinstance(o, tuple) else o)
                self._on(layer.post_attention_layernorm, i, "mlp_norm")
                self._on(layer.mlp, i, "mlp_out")
            if hasattr(mixer, "q_norm"):
                d = mixer.head_dim
                # HF Qwen3 norms q/k as [B, T, heads, d], Gemma 3 after the transpose
                heads_first = (lambda m, a, o: o.transpose(1, 2)) if gemma else (
                    lambda m, a, o: o)
                self._on(mixer.q_norm, i, "q", heads_first)
                self._on(mixer.k_norm, i, "k", heads_first)
                self._on(mixer.v_proj, i, "v", lambda m, a, o, d=d: o.unflatten(-1, (-1, d)))

    def _on(self, module, i, name, pick=lambda m, a, o: o):
        def hook(m, a, o):
            self.out[(i, name)] = _np(pick(m, a, o)[0, -self.rows:])
        self.handles.append(module.register_forward_hook(hook))

    def remove(self):
        for h in self.handles:
            h.remove()


def _run_target(target, seq, rows: int, detail: bool):
    """Logits of the last ``rows`` rows, every hidden state, intermediates when ``detail``."""
    import torch

    hooks = _Hooks(target, rows) if detail else None
    with torch.no_grad():
        out = target(torch.tensor([seq]), output_hidden_states=True, use_cache=False)
    if hooks is not None:
        hooks.remove()
    return out, (hooks.out if hooks else {})


def _gdn_states(target, seq):
    """(layer -> (recurrent [HV, dk, dv], conv [conv_dim, W - 1])) after running ``seq``."""
    if "linear_attention" not in (getattr(target.config, "layer_types", None) or []):
        return {}
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=target.config)
    with torch.no_grad():
        target(torch.tensor([seq]), past_key_values=cache, use_cache=True)
    out = {}
    for i, t in enumerate(getattr(target.config, "layer_types", None) or []):
        if t == "linear_attention":
            conv = _np(cache.get_conv_state(i)[0])
            w = target.model.layers[i].linear_attn.conv_kernel_size
            out[i] = (_np(cache.get_recurrent_state(i)[0]), conv[:, -(w - 1):])
    return out


def dump(ref_dir, out_dir, target_dir, drafter_dir=None, bug: str = "none") -> Path:
    """Write the foreign stack's tensors for every step of the reference case ``ref_dir``."""
    import torch
    from safetensors.numpy import load_file, save_file

    if bug not in BUGS:
        raise ValueError(f"unknown bug {bug!r}; choose from {BUGS}")
    ref_dir, out_dir = Path(ref_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((ref_dir / "manifest.json").read_text())
    ref = {}
    for f in ref_dir.glob("*.safetensors"):
        ref.update(load_file(str(f)))
    target, drafter = load_models(target_dir, drafter_dir, bug)
    capture = manifest["conventions"]["Layer ids: which hidden state is captured"][
        "target_layer_ids"]
    hidden = target.config.get_text_config().hidden_size
    detail_steps = set(manifest["run"]["detail_steps"])
    greedy = not manifest["run"]["temperature"]
    produced = 0  # tokens emitted so far (max_new_tokens cuts the last step)
    prefix: list[int] = []  # the committed positions 0..start-1, as the reference kept them
    features = np.zeros((0, hidden * len(capture)), np.float32)  # committed, by position
    prompt = np.asarray(manifest["run"]["prompt_ids"], np.int64)
    _save(save_file, out_dir, None, {"input.prompt_ids": prompt,
                                     "input.prompt_positions": np.arange(prompt.size)})
    for s in manifest["steps"]:
        n, kind = s["step"], s["kind"]
        key = f"step{n:04d}."
        t: dict[str, np.ndarray] = {}
        start = s["start"]
        if key + "drafter.block_ids" in ref and drafter is not None:
            block = ref[key + "drafter.block_ids"]
            scale = float(manifest["conventions"]["The drafter's own embedding scale"][
                "noise_embedding_scale"])
            with torch.no_grad():
                emb = target.get_input_embeddings().weight[torch.tensor(block)] * scale
                ctx = torch.tensor(features[:start])[None]
                h = drafter(target_hidden=ctx, noise_embedding=emb[None],
                            position_ids=torch.arange(start + block.size)[None])
                logits = drafter.compute_logits(h[:, 1:], target.get_output_embeddings())
                enc = drafter.hidden_norm(drafter.fc(ctx))[0]
            ctx_pos = ref[key + "drafter.context_positions"]
            t[key + "drafter.context_positions"] = ctx_pos
            t[key + "drafter.encoder_out"] = _np(enc[torch.tensor(ctx_pos)])
            t[key + "drafter.block_ids"] = block
            t[key + "drafter.block_positions"] = np.arange(start, start + block.size)
            t[key + "drafter.draft_logits"] = _np(logits[0])
            t[key + "drafter.draft_tokens"] = _np(logits[0].argmax(-1)).astype(np.int64)
        if kind == "tree":  # a tree mask over HF's forward is beyond this dumper
            prefix += [int(ref[key + "target.input_ids"][0])] + s["committed"][:-1]
            features = _append_ref_features(features, ref, key, capture, len(s["committed"]))
            produced += len(s["committed"])
            _save(save_file, out_dir, n, t)
            continue
        ids = [int(x) for x in ref[key + "target.input_ids"]]
        out, inter = _run_target(target, prefix + ids, len(ids), n in detail_steps)
        logits = _np(out.logits[0, -len(ids):])
        t[key + "target.input_ids"] = np.asarray(ids, np.int64)
        t[key + "target.positions"] = np.arange(start, start + len(ids), dtype=np.int64)
        if n in detail_steps:
            t[key + "target.embed"] = _np(out.hidden_states[0][0, -len(ids):])
            for (i, name), x in inter.items():
                t[f"{key}target.layer{i:02d}.{name}"] = x
        t[key + "target.logits"] = logits[-1:] if kind == "prefill" else logits
        posterior = logits.argmax(-1)
        if kind == "prefill" or kind == "plain":
            committed = [int(posterior[-1])] if greedy else s["committed"]
            rows = len(ids) if kind == "prefill" else 1
        else:
            drafts = ids[1:]
            a = 0
            while greedy and a < len(drafts) and drafts[a] == posterior[a]:
                a += 1
            # the cache keeps rows 0..a (anchor + accepted drafts) even when max_new_tokens
            # then cuts what the step emits; sampled steps take the reference's decision
            rows = a + 1 if greedy else int(ref[key + "state.length"][0]) - start
            committed = drafts[:a] + [int(posterior[a])] if greedy else s["committed"]
        if greedy:
            committed = committed[: manifest["run"]["max_new_tokens"] - produced]
            if kind not in ("prefill", "plain"):
                t[key + "verify.accepted"] = np.asarray([len(committed) - 1], np.int64)
            t[key + "verify.bonus"] = np.asarray([committed[-1]], np.int64)
            t[key + "verify.committed"] = np.asarray(committed, np.int64)
        produced += len(committed)
        shift = 0 if bug == "layer_shift" else 1
        new = np.concatenate([_np(out.hidden_states[i + shift][0, -len(ids):][:rows])
                              for i in capture], axis=1)
        for c, i in enumerate(capture):
            t[f"{key}target.layer{i:02d}.features"] = new[:, c * hidden:(c + 1) * hidden]
        kept = len(ids) if kind == "prefill" else rows
        prefix += ids[:kept]
        features = np.concatenate([features, new[:kept]], axis=0)
        t[key + "state.length"] = np.asarray([len(prefix)], np.int64)
        for i, (rec, conv) in _gdn_states(target, prefix).items():
            t[f"{key}state.layer{i:02d}.gdn_recurrent"] = rec
            t[f"{key}state.layer{i:02d}.gdn_conv"] = conv
        _save(save_file, out_dir, n, t)
    return out_dir


def _append_ref_features(features, ref, key, capture, rows):
    new = np.concatenate([ref[f"{key}target.layer{i:02d}.features"] for i in capture], axis=1)
    return np.concatenate([features, new[:rows]], axis=0)


def _save(save_file, out_dir: Path, n: int | None, t: dict) -> None:
    name = "inputs" if n is None else f"step{n:04d}"
    if t:
        save_file({k: np.ascontiguousarray(v) for k, v in t.items()},
                  str(out_dir / f"{name}.safetensors"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("ref", help="reference case directory (dflash-ref oracle export)")
    p.add_argument("out", help="directory to write the dump into")
    p.add_argument("--target", required=True, help="the case's target directory (HF layout)")
    p.add_argument("--drafter", help="the case's drafter directory (z-lab layout)")
    p.add_argument("--bug", default="none", choices=BUGS)
    args = p.parse_args(argv)
    dump(args.ref, args.out, args.target, args.drafter, args.bug)
    print(f"wrote {args.out}; compare with: dflash-ref oracle compare {args.ref} {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
