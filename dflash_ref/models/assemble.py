"""The decoder layers of a target, assembled once per model from its config.

Every layer is the one block (:class:`~dflash_ref.models.layers.DecoderLayer`); what differs
between families is which components it holds, chosen here and never again in a forward
(docs/target.md, "Families"), and whether each takes its fused form (``fused``):

- norms: ``norm_offset`` (1 + w); the mixer add normed by the pre-MLP norm, the MLP add by the
  next layer's input norm (the final norm last);
- residual adds: Gemma's sandwich norms (``use_pre_post_ffn_norms``, PostNormAddNorm) or the add
  and the norm (AddNorm); Gemma 4 maps the stream after the MLP add (LayerOutputAdd);
- mixer: by ``layer_types[i]``, a GDN mixer or an attention of the config's kind; RoPE by the
  layer type's ``rope_type``;
- feed-forward: ``moe`` (Qwen3.5's sparse block in the MLP's place, Gemma 4's experts beside
  it), else the gated MLP (``swiglu``, or ``geglu`` for ``gelu_pytorch_tanh``).
"""

from __future__ import annotations

from dflash_ref.models.fused import FusedAddNorm, FusedNormRope, FusedPostNormAddNorm
from dflash_ref.models.gemma import PostNormAddNorm
from dflash_ref.models.gemma4 import (
    KEqVAttention,
    LayerOutputAdd,
    ProportionalRope,
    SharedKVAttention,
    VNormAttention,
    per_layer_embeddings,
)
from dflash_ref.models.layers import (
    AddNorm,
    Attention,
    DecoderLayer,
    GatedMLP,
    Identity,
    RMSNorm,
    Rope,
)
from dflash_ref.models.moe import Gemma4MoE, QwenSparseMoE
from dflash_ref.models.qwen3_5 import GatedAttention, GDNMixer

FUSED_OPS = ("add_rms_norm", "qk_norm_rope")
"""The fused ops a target's layers use by default (models/fused.py)."""


def decoder_layers(cfg, be, weights: dict, embed, final_norm,
                   fused=FUSED_OPS) -> list[DecoderLayer]:
    """The ``cfg.num_hidden_layers`` decoder layers over ``weights`` (HF names, on the backend).

    ``embed``: ids -> [T, H] (Gemma 4's per-layer embeddings read it); ``final_norm``: the norm
    after the last layer; ``fused``: a subset of :data:`FUSED_OPS` (``()``: the reference form).
    """
    unknown = set(fused) - set(FUSED_OPS)
    if unknown:
        raise ValueError(f"fused: unknown ops {sorted(unknown)}; choose from {FUSED_OPS}")
    p = cfg.weight_prefix
    ple = per_layer_embeddings(cfg, be, weights, embed)  # Gemma 4 E2B / E4B, else None
    ws = [{k[len(f"{p}layers.{i}."):]: v for k, v in weights.items()
           if k.startswith(f"{p}layers.{i}.")} for i in range(cfg.num_hidden_layers)]
    input_norms = [RMSNorm(be, w["input_layernorm.weight"], cfg.rms_norm_eps, cfg.norm_offset)
                   for w in ws]
    next_norms = [*input_norms[1:], final_norm]  # the norm that reads each layer's output
    return [decoder_layer(cfg, be, i, w, input_norms[i], next_norms[i], ple, fused)
            for i, w in enumerate(ws)]


def decoder_layer(cfg, be, idx: int, w: dict, input_norm, next_norm, ple=None,
                  fused=FUSED_OPS) -> DecoderLayer:
    """Layer ``idx`` from its tensors ``w`` (names relative to ``layers.{idx}.``), handing
    ``next_norm`` its output."""

    def norm(name):
        return RMSNorm(be, w[name], cfg.rms_norm_eps, cfg.norm_offset)

    mixer = _mixer(cfg, be, idx, w, "qk_norm_rope" in fused)
    feed_forward = _feed_forward(cfg, be, idx, w, norm)
    fuse = "add_rms_norm" in fused
    if cfg.use_pre_post_ffn_norms:  # Gemma: sandwich norms
        add = FusedPostNormAddNorm if fuse else PostNormAddNorm
        mixer_add = add(norm("post_attention_layernorm.weight"),
                        norm("pre_feedforward_layernorm.weight"))
        post_mlp = norm("post_feedforward_layernorm.weight")
        mlp_add = add(post_mlp, next_norm)
    else:  # Qwen: "post_attention_layernorm" is the norm before the MLP
        add = FusedAddNorm if fuse else AddNorm
        mixer_add, post_mlp = add(norm("post_attention_layernorm.weight")), Identity()
        mlp_add = add(next_norm)
    if cfg.gemma4 is not None:  # the stream is mapped after the MLP add: the next norm alone
        mlp_add = LayerOutputAdd.of(be, idx, w, norm, ple, post_mlp, next_norm)
    return DecoderLayer(idx, w, input_norm, mixer, mixer_add, feed_forward, mlp_add)


def _mixer(cfg, be, idx: int, w: dict, fused: bool):
    """The layer's token mixer: attention of the right kind, or a GDN mixer."""
    if cfg.layer_types[idx] == "linear_attention":
        return GDNMixer(cfg, be, idx, w)
    spec = cfg.rope_for(idx)
    rope = ProportionalRope(be, spec) if spec.rope_type == "proportional" else Rope(be, spec)
    if cfg.attn_output_gate:
        kind = GatedAttention
    elif cfg.kv_source_for(idx) is not None:
        kind = SharedKVAttention
    elif "self_attn.v_proj.weight" not in w:
        kind = KEqVAttention
    elif cfg.v_norm:
        kind = VNormAttention
    else:
        kind = Attention
    attention = kind(cfg, be, idx, w, rope)
    if fused and FusedNormRope.fits(attention.norm_rope):
        attention.norm_rope = FusedNormRope(attention.norm_rope)
    return attention


def _feed_forward(cfg, be, idx: int, w: dict, norm):
    """The layer's feed-forward (before any post norm): MLP, MoE block, or both."""
    sparse = cfg.moe is not None and cfg.moe.is_moe_layer(idx)
    if sparse and cfg.moe.kind == "qwen":
        return QwenSparseMoE(cfg, be, idx, w)
    act = be.ops.swiglu if cfg.hidden_act == "silu" else be.ops.geglu
    mlp = GatedMLP(be, w, act)  # its width is the tensors' (Gemma 4 double-wide too)
    return Gemma4MoE(cfg, be, idx, w, norm, mlp) if sparse else mlp
