"""Tensor schemas: every tensor name a config implies, with its PyTorch ``[out, in]`` shape.

- :func:`expected_tensors`: a target checkpoint in HF layout (decoder stack under
  ``TargetConfig.weight_prefix``; attention or GDN mixer per layer; lm_head unless tied).
- :func:`gdn_expected_tensors`: one Gated DeltaNet mixer, names relative to ``linear_attn.``, in
  either projection layout. :meth:`dflash_ref.models.gdn_config.GDNConfig.expected_shapes` returns
  this same schema.
- :func:`drafter_expected_tensors`: a DFlash drafter checkpoint (z-lab ``fc`` / ``hidden_norm``
  or the assistant layout's ``encoder.*`` names).

Loaders check a checkpoint against these before reading it, converters check shapes with them,
and the tiny test checkpoints are generated from them. Names and layouts: docs/formats.md
("DFlash drafter names"); public sources: z-lab/dflash ``dflash/model.py`` (drafter),
huggingface/transformers ``src/transformers/models/qwen3_next/modeling_qwen3_next.py`` (GDN).
"""

from __future__ import annotations

from dflash_ref.config.drafter import DrafterConfig
from dflash_ref.config.fields import FULL, LINEAR
from dflash_ref.config.qwen import GDNDims
from dflash_ref.config.target import TargetConfig
from dflash_ref.errors import ConfigError


def gdn_expected_tensors(gdn: GDNDims, hidden_size: int) -> dict[str, tuple[int, ...]]:
    """Tensor name (relative to ``linear_attn.``) -> shape of one GDN mixer.

    With key_dim = H dk, value_dim = HV dv and conv_dim = 2 key_dim + value_dim:
    ``qkvz_ba_grouped`` (Qwen3-Next) has ``in_proj_qkvz`` [2 key_dim + 2 value_dim, hidden] and
    ``in_proj_ba`` [2 HV, hidden]; ``qkv_z_b_a`` (Qwen3.5) has ``in_proj_qkv`` [conv_dim, hidden],
    ``in_proj_z`` [value_dim, hidden], ``in_proj_b`` / ``in_proj_a`` [HV, hidden]. Both have
    ``conv1d.weight`` [conv_dim, 1, K], ``dt_bias`` / ``A_log`` [HV], ``norm.weight`` [dv] and
    ``out_proj.weight`` [hidden, value_dim].
    """
    HV = gdn.num_value_heads
    if gdn.projection_layout == "qkvz_ba_grouped":
        proj = {
            "in_proj_qkvz.weight": (2 * gdn.key_dim + 2 * gdn.value_dim, hidden_size),
            "in_proj_ba.weight": (2 * HV, hidden_size),
        }
    else:
        proj = {
            "in_proj_qkv.weight": (gdn.conv_dim, hidden_size),
            "in_proj_z.weight": (gdn.value_dim, hidden_size),
            "in_proj_b.weight": (HV, hidden_size),
            "in_proj_a.weight": (HV, hidden_size),
        }
    return {
        **proj,
        "conv1d.weight": (gdn.conv_dim, 1, gdn.conv_kernel_dim),
        "dt_bias": (HV,),
        "A_log": (HV,),
        "norm.weight": (gdn.value_head_dim,),
        "out_proj.weight": (hidden_size, gdn.value_dim),
    }


def expected_tensors(cfg: TargetConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name (HF layout) the config implies, with its PyTorch [out, in] shape."""
    p, H = cfg.weight_prefix, cfg.hidden_size
    nh = cfg.num_attention_heads
    t = {f"{p}embed_tokens.weight": (cfg.vocab_size, H), f"{p}norm.weight": (H,)}
    if not cfg.tie_word_embeddings:
        t[cfg.lm_head_name] = (cfg.vocab_size, H)
    for i, kind in enumerate(cfg.layer_types):
        L = f"{p}layers.{i}."
        d, nkv = cfg.head_dim_for(i), cfg.num_key_value_heads_for(i)
        t[L + "input_layernorm.weight"] = (H,)
        t[L + "post_attention_layernorm.weight"] = (H,)
        if cfg.use_pre_post_ffn_norms:
            t[L + "pre_feedforward_layernorm.weight"] = (H,)
            t[L + "post_feedforward_layernorm.weight"] = (H,)
        if kind == LINEAR:
            for name, shape in gdn_expected_tensors(cfg.gdn, H).items():
                t[L + "linear_attn." + name] = shape
        else:
            q_out = nh * d * (2 if cfg.attn_output_gate else 1)
            t[L + "self_attn.q_proj.weight"] = (q_out, H)
            t[L + "self_attn.k_proj.weight"] = (nkv * d, H)
            t[L + "self_attn.v_proj.weight"] = (nkv * d, H)
            t[L + "self_attn.o_proj.weight"] = (H, nh * d)
            if cfg.qk_norm:
                t[L + "self_attn.q_norm.weight"] = (d,)
                t[L + "self_attn.k_norm.weight"] = (d,)
        F = cfg.mlp_width_for(i)
        if F is not None:
            t[L + "mlp.gate_proj.weight"] = (F, H)
            t[L + "mlp.up_proj.weight"] = (F, H)
            t[L + "mlp.down_proj.weight"] = (H, F)
        if cfg.moe is not None and cfg.moe.is_moe_layer(i):
            t.update({L + k: v for k, v in moe_expected_tensors(cfg).items()})
        if cfg.gemma4 is not None:
            t.update(_gemma4_layer_tensors(cfg, i, L))
    if cfg.gemma4 is not None and cfg.gemma4.hidden_size_per_layer_input:
        g, n = cfg.gemma4, cfg.num_hidden_layers
        t[f"{p}embed_tokens_per_layer.weight"] = (g.vocab_size_per_layer_input,
                                                  n * g.hidden_size_per_layer_input)
        t[f"{p}per_layer_model_projection.weight"] = (n * g.hidden_size_per_layer_input, H)
        t[f"{p}per_layer_projection_norm.weight"] = (g.hidden_size_per_layer_input,)
    return _drop_gemma4_kv(cfg, t) if cfg.gemma4 is not None else t


def moe_expected_tensors(cfg: TargetConfig) -> dict[str, tuple[int, ...]]:
    """The sparse block of one layer, names relative to the layer (models/moe.py).

    Qwen3.5 MoE: router ``mlp.gate`` [E, H], fused experts ``mlp.experts.gate_up_proj``
    [E, 2I, H] and ``mlp.experts.down_proj`` [E, H, I] (transformers' in-memory layout; its
    ``save_pretrained`` writes per-expert ``mlp.experts.{e}.{gate,up,down}_proj.weight``, which
    the loader stacks into these: :func:`dflash_ref.models.moe.fuse_expert_tensors`), the shared
    expert ``mlp.shared_expert.*`` [Is, H] and its gate ``mlp.shared_expert_gate`` [1, H].
    Gemma 4: ``router.{proj [E, H], scale [H], per_expert_scale [E]}``, ``experts.gate_up_proj``
    [E, 2I, H], ``experts.down_proj`` [E, H, I] and three more norms.
    """
    m, H = cfg.moe, cfg.hidden_size
    E, F = m.num_experts, m.moe_intermediate_size
    if m.kind == "gemma4":
        return {"router.proj.weight": (E, H), "router.scale": (H,),
                "router.per_expert_scale": (E,), "experts.gate_up_proj": (E, 2 * F, H),
                "experts.down_proj": (E, H, F), "pre_feedforward_layernorm_2.weight": (H,),
                "post_feedforward_layernorm_1.weight": (H,),
                "post_feedforward_layernorm_2.weight": (H,)}
    t = {"mlp.gate.weight": (E, H), "mlp.experts.gate_up_proj": (E, 2 * F, H),
         "mlp.experts.down_proj": (E, H, F)}
    S = m.shared_expert_intermediate_size
    if S:
        t.update({"mlp.shared_expert.gate_proj.weight": (S, H),
                  "mlp.shared_expert.up_proj.weight": (S, H),
                  "mlp.shared_expert.down_proj.weight": (H, S),
                  "mlp.shared_expert_gate.weight": (1, H)})
    return t


def _gemma4_layer_tensors(cfg: TargetConfig, i: int, L: str) -> dict[str, tuple[int, ...]]:
    """Gemma 4 per-layer extras: the layer scalar, PLE gate / projection / norm; KV-sharing
    layers drop k/v projections and k norm, k_eq_v full layers drop v_proj."""
    H, g = cfg.hidden_size, cfg.gemma4
    t = {L + "layer_scalar": (1,)}
    if g.hidden_size_per_layer_input:
        P = g.hidden_size_per_layer_input
        t.update({L + "per_layer_input_gate.weight": (P, H),
                  L + "per_layer_projection.weight": (H, P),
                  L + "post_per_layer_input_norm.weight": (H,)})
    return t


def _drop_gemma4_kv(cfg: TargetConfig, t: dict) -> dict:
    """Remove the K/V tensors a Gemma 4 layer does not have (KV sharing, k_eq_v)."""
    p = cfg.weight_prefix
    for i, kind in enumerate(cfg.layer_types):
        L = f"{p}layers.{i}.self_attn."
        if cfg.kv_source_for(i) is not None:
            for name in ("k_proj.weight", "v_proj.weight", "k_norm.weight"):
                t.pop(L + name, None)
        elif cfg.attention_k_eq_v and kind == FULL:
            t.pop(L + "v_proj.weight", None)
    return t


def drafter_expected_tensors(cfg: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Tensor names and PyTorch [out, in] shapes of a drafter checkpoint (docs/formats.md,
    "DFlash drafter names"; z-lab/dflash ``dflash/model.py``); with ``draft_vocab_size`` Vd
    also ``lm_head.weight`` [Vd, H] and the int64 map ``d2t`` [Vd]."""
    H, d, F = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    t = {cfg.fc_name: (H, cfg.n_capture * H), cfg.hidden_norm_name: (H,), "norm.weight": (H,)}
    for i in range(cfg.num_hidden_layers):
        L = f"layers.{i}."
        t.update({
            L + "input_layernorm.weight": (H,),
            L + "self_attn.q_proj.weight": (nh * d, H),
            L + "self_attn.k_proj.weight": (nkv * d, H),
            L + "self_attn.v_proj.weight": (nkv * d, H),
            L + "self_attn.o_proj.weight": (H, nh * d),
            L + "self_attn.q_norm.weight": (d,),
            L + "self_attn.k_norm.weight": (d,),
            L + "post_attention_layernorm.weight": (H,),
            L + "mlp.gate_proj.weight": (F, H),
            L + "mlp.up_proj.weight": (F, H),
            L + "mlp.down_proj.weight": (H, F),
        })
        if cfg.kind == "dflash2":
            K, G = cfg.dflash2["conv_kernel_size"], H // cfg.dflash2["conv_group_size"]
            for conv in ("attention_conv", "mlp_conv"):
                t[L + conv + ".base_kernel"] = (2, K, H)
                t[L + conv + ".kernel_projection.weight"] = (2 * K * G, H)
    if cfg.draft_vocab_size is not None:  # a reduced draft vocabulary: its own head and d2t
        t["lm_head.weight"] = (cfg.draft_vocab_size, H)
        t["d2t"] = (cfg.draft_vocab_size,)
    if cfg.kind == "dflash2":
        r, V = cfg.dflash2["selector_rank"], cfg.vocab_size
        if V is None:
            raise ConfigError("a DFlash 2 drafter config needs vocab_size (the selector's "
                              "codebooks have one row per token).")
        t["candidate_selector.predecessor_codebook.weight"] = (V, r)
        t["candidate_selector.successor_codebook.weight"] = (V, r)
        t["candidate_selector.hidden_projection.weight"] = (r, H)
    return t
