"""Build tiny HF-saved target checkpoints and HF's reference outputs (tests/models/fixtures/hf).

How (needs torch and transformers; the tests that read the result do not)::

    python -m venv /tmp/venv-torch && /tmp/venv-torch/bin/pip install torch transformers
    /tmp/venv-torch/bin/python scripts/build_hf_fixtures.py [--out tests/models/fixtures/hf]

For each case below the script builds the config with transformers' own config class, builds
the model with transformers' own ``*ForCausalLM`` class (seeded), replaces every weight with
seeded random values (norm weights, layer scalars and router scales too, so that none of them
is the identity HF's initialiser leaves), saves it with ``save_pretrained`` (float32
safetensors, the layout transformers writes), then runs HF's forward **in float64** over one
prompt of ``PROMPT_LEN`` tokens and records in ``reference.npz``:

- ``ids`` [T]: the prompt;
- ``logits`` [T, V]: HF's logits;
- ``hidden`` [L + 1, T, H]: HF's ``hidden_states`` (``[0]`` the scaled embeddings, ``[i + 1]``
  the output of decoder layer i; the last entry is final-normed, as HF returns it);
Arrays are stored as float32 (HF ran in float64; the rounding is ~1e-7 relative).

- ``router_<i>`` [T, E] for every MoE layer i: what HF's router records as ``router_logits``
  (Qwen3.5 MoE: the gate's logits; Gemma 4: the router's softmax probabilities).

Cases (docs/target.md, "Families"): ``gemma4_dense`` (sliding + full layers with distinct head
dims and KV-head counts, attention_k_eq_v, proportional partial RoPE, final softcap),
``gemma4_ple_kvshare`` (per-layer embeddings, the last 2 layers sharing KV, double-wide MLP on
the shared layers), ``gemma4_moe`` (MoE block beside the dense MLP, k_eq_v), ``qwen35_moe``
(Qwen3.5 MoE hybrid: GDN + gated attention, routed experts + sigmoid-gated shared expert).
The transformers version used is written to ``tests/models/fixtures/hf/VERSION``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PROMPT_LEN = 80  # longer than every sliding window here (8) and the GDN trace limit (64)
SEED = 1234
# Weights scaled after the fan-in rule. Gemma 4's per-layer-input gate at full scale drives its
# GELU to u ~ -10, where float32 ``1 + tanh(z)`` keeps no correct digit: the fixture measured
# float32 cancellation (one ulp of tanh moved the logits 5e-4), not the model. At 1/4 the gate
# stays within |u| < 3 (tests/models/test_hf_fixtures.py::test_ple_fixture_is_well_conditioned).
GATE_SCALE = {"per_layer_input_gate": 0.25}


def _gemma4_common() -> dict:
    return dict(vocab_size=48, hidden_size=24, intermediate_size=16, num_hidden_layers=6,
                num_attention_heads=2, num_key_value_heads=2, head_dim=8, global_head_dim=16,
                sliding_window=8, max_position_embeddings=256, final_logit_softcapping=30.0,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
                hidden_size_per_layer_input=0, vocab_size_per_layer_input=48,
                rope_parameters={"sliding_attention": {"rope_type": "default",
                                                       "rope_theta": 10_000.0},
                                 "full_attention": {"rope_type": "proportional",
                                                    "partial_rotary_factor": 0.25,
                                                    "rope_theta": 1_000_000.0}},
                initializer_range=0.2)


CASES = {
    "gemma4_dense": dict(_gemma4_common(), attention_k_eq_v=True, num_global_key_value_heads=1),
    "gemma4_ple_kvshare": dict(_gemma4_common(), hidden_size_per_layer_input=4,
                               num_kv_shared_layers=2, use_double_wide_mlp=True),
    "gemma4_moe": dict(_gemma4_common(), attention_k_eq_v=True, num_global_key_value_heads=1,
                       enable_moe_block=True, num_experts=4, top_k_experts=2,
                       moe_intermediate_size=8),
    "qwen35_moe": dict(vocab_size=48, hidden_size=24, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, linear_num_key_heads=2,
                       linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
                       linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=8, shared_expert_intermediate_size=12,
                       max_position_embeddings=256, initializer_range=0.2),
}


def _randomize(model, torch, gen) -> None:
    """Seeded random values for every parameter and persistent buffer (norms around their
    identity, so that a missing (1 + w) or a dropped scale changes the outputs)."""
    for name, p in list(model.named_parameters()) + list(model.named_buffers()):
        if not p.is_floating_point() or "inv_freq" in name or "embed_scale" in name:
            continue
        noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
        if p.ndim == 1 and ("norm" in name or "scale" in name or "layer_scalar" in name):
            if "A_log" in name or "dt_bias" in name:
                p.data.copy_(0.3 * noise)
            elif "Qwen3_5" in type(model).__name__ and "norm" in name and "linear_attn" not in name:
                p.data.copy_(0.2 * noise)  # (1 + w) norms: w around 0
            else:
                p.data.copy_(1.0 + 0.2 * noise)  # plain-w norms and scales: around 1
        elif p.ndim == 1:
            p.data.copy_(0.3 * noise)
        else:
            fan_in = p.shape[-1]
            p.data.copy_(noise / fan_in ** 0.5 * GATE_SCALE.get(name.rsplit(".", 2)[-2], 1.0))


def build(name: str, out: Path) -> None:
    import numpy as np
    import torch
    import transformers as tf

    kw = CASES[name]
    if name.startswith("gemma4"):
        cfg, cls = tf.Gemma4TextConfig(**kw), tf.Gemma4ForCausalLM
    else:
        cfg, cls = tf.Qwen3_5MoeTextConfig(**kw), tf.Qwen3_5MoeForCausalLM
    torch.manual_seed(SEED)
    model = cls(cfg).eval()
    _randomize(model, torch, torch.Generator().manual_seed(SEED))
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d)
    ids = torch.randint(0, kw["vocab_size"], (1, PROMPT_LEN),
                        generator=torch.Generator().manual_seed(SEED + 1))
    model = cls.from_pretrained(d, dtype=torch.float64,  # reload: what the file holds
                                experts_implementation="eager").eval()
    with torch.no_grad():
        res = model(ids, output_hidden_states=True, output_router_logits=True, use_cache=False)
    ref = {"ids": ids[0].numpy().astype(np.int64),
           "logits": res.logits[0].numpy().astype(np.float32),
           "hidden": np.stack([h[0].numpy() for h in res.hidden_states]).astype(np.float32)}
    routers = getattr(res, "router_logits", None) or ()
    moe_layers = [i for i in range(kw["num_hidden_layers"])] if routers else []
    for i, r in zip(moe_layers, routers):
        ref[f"router_{i}"] = r.reshape(PROMPT_LEN, -1).numpy().astype(np.float32)
    np.savez_compressed(d / "reference.npz", **ref)
    size = sum(f.stat().st_size for f in d.iterdir())
    print(f"{name}: {size / 1024:.0f} KiB, {len(routers)} router records, config "
          f"{json.loads((d / 'config.json').read_text())['model_type']}")


def main() -> None:
    import transformers

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/models/fixtures/hf")
    ap.add_argument("cases", nargs="*", default=list(CASES))
    args = ap.parse_args()
    out = Path(args.out)
    for name in args.cases:
        build(name, out)
    (out / "VERSION").write_text(f"transformers {transformers.__version__}\n")


if __name__ == "__main__":
    main()
