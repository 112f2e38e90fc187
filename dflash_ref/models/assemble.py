"""The decoder layers of a target, assembled once per model from its config.

Every layer is the reference block (:class:`~dflash_ref.models.layers.DecoderLayer`) or a
family's subclass of it; what differs between families is which components it holds, chosen
here from the config and never again in a forward (docs/target.md, "Families"):

===================  =====================================================================
part                 chosen by
===================  =====================================================================
norms                ``norm_offset`` (1 + w); ``use_pre_post_ffn_norms``: Gemma's sandwich
                     norms (:class:`~dflash_ref.models.gemma.PostNormed` around the mixer and
                     the feed-forward), else Qwen's ``post_attention_layernorm`` before the MLP
mixer                ``layer_types[i]``: a GDN mixer (linear_attention), else attention:
                     output-gated (``attn_output_gate``), KV-sharing (``kv_source_for(i)``),
                     k = v (no v_proj tensor), v-normed (``v_norm``), or the common one
RoPE                 the layer type's ``rope_type``: proportional, else the ``rope`` op; with
                     ``fused``, the q/k norms and the ``rope`` op as one ``qk_norm_rope``
                     (:class:`~dflash_ref.models.fused.FusedNormRope`)
feed-forward         ``moe``: Qwen3.5's sparse block in the MLP's place, Gemma 4's experts
                     beside it; else the gated MLP (the ``swiglu`` op, or the ``geglu`` op for
                     ``gelu_pytorch_tanh``)
layer class          ``gemma4``: :class:`~dflash_ref.models.gemma4.Gemma4DecoderLayer` (per-layer
                     input, layer scalar)
===================  =====================================================================

A new target family adds its components in its own module and its choice here.
"""

from __future__ import annotations

from dflash_ref.models.fused import FusedNormRope
from dflash_ref.models.gemma import PostNormed
from dflash_ref.models.gemma4 import (
    Gemma4DecoderLayer,
    KEqVAttention,
    LayerOutput,
    PerLayerEmbeddings,
    PerLayerInput,
    ProportionalRope,
    SharedKVAttention,
    VNormAttention,
    no_per_layer_input,
)
from dflash_ref.models.layers import Attention, DecoderLayer, GatedMLP, RMSNorm, Rope
from dflash_ref.models.moe import Gemma4MoE, QwenSparseMoE
from dflash_ref.models.qwen3_5 import GatedAttention, GDNMixer


def decoder_layers(cfg, be, weights: dict, embed, fused: bool = True) -> list[DecoderLayer]:
    """The ``cfg.num_hidden_layers`` decoder layers over ``weights`` (HF names, on the backend).

    ``embed``: the target's token embedding (ids -> [T, H]), which Gemma 4's per-layer
    embeddings read; they are made once per model and shared by its layers. ``fused``: the
    attention layers' q/k norms and RoPE as one op where :meth:`FusedNormRope.fits
    <dflash_ref.models.fused.FusedNormRope.fits>` (else the reference's four calls).
    """
    p = cfg.weight_prefix
    ple = None
    if cfg.gemma4 is not None and cfg.gemma4.hidden_size_per_layer_input:
        ple = PerLayerEmbeddings(cfg, be, weights, embed)
    return [decoder_layer(cfg, be, i, {k[len(f"{p}layers.{i}."):]: v for k, v in weights.items()
                                       if k.startswith(f"{p}layers.{i}.")}, ple, fused)
            for i in range(cfg.num_hidden_layers)]


def decoder_layer(cfg, be, idx: int, w: dict, ple=None, fused: bool = True) -> DecoderLayer:
    """Layer ``idx`` from its tensors ``w`` (names relative to ``layers.{idx}.``)."""

    def norm(name):
        return RMSNorm(be, w[name], cfg.rms_norm_eps, cfg.norm_offset)

    input_norm = norm("input_layernorm.weight")
    mixer, feed_forward = _mixer(cfg, be, idx, w, fused), _feed_forward(cfg, be, idx, w, norm)
    if cfg.use_pre_post_ffn_norms:  # Gemma: sandwich norms
        pre_mlp_norm = norm("pre_feedforward_layernorm.weight")
        mixer = PostNormed(mixer, norm("post_attention_layernorm.weight"))
        feed_forward = PostNormed(feed_forward, norm("post_feedforward_layernorm.weight"))
    else:  # Qwen: "post_attention_layernorm" is the norm before the MLP
        pre_mlp_norm = norm("post_attention_layernorm.weight")
    if cfg.gemma4 is None:
        return DecoderLayer(idx, w, input_norm, mixer, pre_mlp_norm, feed_forward)
    per_layer_input = (no_per_layer_input if ple is None
                       else PerLayerInput(be, idx, w, norm, ple))
    return Gemma4DecoderLayer(idx, w, input_norm, mixer, pre_mlp_norm, feed_forward,
                              LayerOutput(per_layer_input, w["layer_scalar"]))


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
