"""What Qwen3.5 / Qwen3-Next add to the reference decoder layer: the output-gated attention and
the Gated DeltaNet mixer of their hybrid stacks (docs/target.md, "Families"; docs/gdn.md).

Rules from huggingface/transformers ``models/qwen3_next/modeling_qwen3_next.py``
(``Qwen3NextAttention``, ``Qwen3NextGatedDeltaNet``), which ``models/qwen3_5/`` inherits:

- full-attention layers: ``q_proj`` packs, per head, the queries and a sigmoid output gate,
  ``[q (d) | gate (d)]``; ``o = attention(...) * sigmoid(gate)`` before ``o_proj``;
- ``linear_attention`` layers: a Gated DeltaNet (:class:`~dflash_ref.models.gdn_layer.GDNLayer`)
  in the mixer's place; its state lives in the batch's GDN store (``batch.gdn[i]``).
"""

from __future__ import annotations

from dflash_ref.models.gdn_layer import PROJECTION_LAYOUTS, GDNConfig, GDNLayer
from dflash_ref.models.layers import Attention

# config.gdn.projection_layout -> GDNConfig.layout (the inverse of PROJECTION_LAYOUTS)
GDN_LAYOUTS = {v: k for k, v in PROJECTION_LAYOUTS.items()}


def gdn_config(cfg) -> GDNConfig:
    """The GDN layer sizes of a hybrid target (docs/gdn.md; gated norm eps = rms_norm_eps)."""
    g = cfg.gdn
    return GDNConfig(hidden_size=cfg.hidden_size, num_k_heads=g.num_key_heads,
                     num_v_heads=g.num_value_heads, head_k_dim=g.key_head_dim,
                     head_v_dim=g.value_head_dim, conv_kernel=g.conv_kernel_dim,
                     rms_norm_eps=cfg.rms_norm_eps, layout=GDN_LAYOUTS[g.projection_layout])


class GatedAttention(Attention):
    """Attention with the per-head sigmoid output gate packed into ``q_proj`` (module docstring)::

        [q | gate] = u @ Wq^T                          # [T, nh, 2d], per head
        o = attend(q) * sigmoid(gate) @ Wo^T
    """

    def __call__(self, u, batch):
        """u [T, H] -> [T, H] over the layer's KV store in ``batch``."""
        T, nh, d = u.shape[0], self.n_heads, self.d
        q, *kv = self.project(u)  # q [T, nh*2d], k and v [T, nkv*d]
        q = q.reshape(T, nh, 2 * d)  # [T, nh, 2d]
        q, gate = q[..., :d], q[..., d:]  # [T, nh, d] each (views)
        o = self.attend(q, kv, batch).reshape(T, nh, d)  # [T, nh, d]
        o = self.be.ops.sigmoid_gate(o, gate)  # o * sigmoid(gate), the output gate
        return self.be.ops.linear(o.reshape(T, nh * d), self.w["self_attn.o_proj.weight"])


class GDNMixer:
    """A Gated DeltaNet token mixer; its state and rewind data live in the batch's GDN store."""

    def __init__(self, cfg, be, idx: int, w: dict):
        self.idx = idx
        gdn_w = {k[len("linear_attn."):]: v for k, v in w.items() if k.startswith("linear_attn.")}
        self.layer = GDNLayer(gdn_config(cfg), gdn_w, backend=be)
        for k, v in self.layer.w.items():  # the layer's arrays (stacked rows), not a second copy
            w["linear_attn." + k] = v

    def __call__(self, u, batch):
        """u [T, H] -> [T, H], from (and advancing) the layer's state in ``batch.gdn[i]``."""
        return batch.gdn[self.idx].run(self.layer, u)
