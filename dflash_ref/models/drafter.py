"""The DFlash block-diffusion drafter (z-lab/dflash ``dflash/model.py``; docs/drafter.md).

One forward drafts a whole block: given captured target features for the committed context and a
block ``[anchor, MASK x (B-1)]`` at positions ``s .. s+B-1``, it returns logits for all B rows;
rows 1..B-1 are the drafts for positions s+1 .. s+B-1. Shapes: C captures, H hidden,
nh / nkv heads, d head_dim, B block size, ctx context rows.

    c = RMSNorm_hidden_norm(features @ fc^T)                 [ctx, C*H] -> [ctx, H]   encode
    h = E_target[block] * scale                              [B, H]  (Gemma: sqrt(H)) embed
    per layer:
        u = RMSNorm_input(h)                                 noise rows only
        q = rope(q_norm((u Wq^T)[B, nh, d]), s..s+B-1)
        k = rope(k_norm([c Wk^T ; u Wk^T]), [p_ctx ; s..s+B-1])     context FIRST
        v = [c Wv^T ; u Wv^T]                                 no norm, no rope
        h = h + attention(q, k, v, drafter mask) Wo^T         non-causal (SWA: per option)
        h = h + W_down(swiglu(W_gate u', W_up u')),  u' = RMSNorm_post(h)
    logits = lm_head_target(RMSNorm_norm(h))  (+ target softcap)        [B, V]   head

The context rows are never queries; the embedding is the target's, borrowed, and so is the
lm_head unless the drafter has a reduced draft vocabulary of its own (models/draft_head.py). The
context K/V is recomputed every call (:meth:`DFlashDrafter.forward_block`, the oracle) or cached
(:class:`~dflash_ref.models.draft_cache.DraftCache`).
"""

from __future__ import annotations

import numpy as np

from dflash_ref.backend import Backend
from dflash_ref.config import DrafterConfig, drafter_expected_tensors
from dflash_ref.errors import ConfigError
from dflash_ref.models.draft_cache import DraftCache
from dflash_ref.models.draft_head import draft_head
from dflash_ref.models.drafter_loading import (
    bind_capture,
    checked_config,
    load_gguf,
    load_pretrained,
)
from dflash_ref.models.fixed_stores import FixedDraftCache, step_now
from dflash_ref.models.layers import Projections
from dflash_ref.models.target import TargetModel
from dflash_ref.ops.masks import MaskSpec, drafter_mask
from dflash_ref.ops.sampling import DraftProposal, SamplingParams


class DFlashDrafter:
    """A DFlash drafter bound to its target; load with :meth:`from_pretrained`. ``kind``: the
    ``DrafterConfig.kind`` a class runs."""

    kind = "dflash"

    def __init__(self, config: DrafterConfig, weights: dict, target: TargetModel):
        config = checked_config(type(self), config, weights, target)
        self.config, self.target = config, target
        self.be: Backend = target.be
        xp = self.be.xp
        w = {k: xp.asarray(v, dtype=xp.float32) for k, v in weights.items()}
        self.fc = w[config.fc_name]  # [H, C*H]
        self.hidden_norm = w[config.hidden_norm_name]  # [H]
        self.norm = w["norm.weight"]  # [H]
        self.layers = [
            {k[len(f"layers.{i}."):]: v for k, v in w.items() if k.startswith(f"layers.{i}.")}
            for i in range(config.num_hidden_layers)
        ]
        self.products = [self.stack_products(w) for w in self.layers]
        self.embedding_scale = config.noise_embedding_scale(target.config)
        self.block_size = config.block_size  # B, the block drafted by default
        # each layer's key-visibility rule (DrafterConfig.visibility), read once for every draft
        self.visibility = [config.visibility(i) for i in range(config.num_hidden_layers)]
        self.draft_head = draft_head(config, weights, target)  # FullHead or ReducedHead
        bind_capture(config, target)

    def stack_products(self, w: dict) -> dict:
        """One layer's stacked projections: the block's q, k, v; the context's k, v (the same
        rows); the MLP's gate and up."""
        a = "self_attn."
        qkv = Projections.stacked(self.be, w, [f"{a}{p}_proj.weight" for p in "qkv"])
        gate_up = Projections.stacked(self.be, w, ["mlp.gate_proj.weight", "mlp.up_proj.weight"])
        return {"qkv": qkv, "kv": qkv.rows(1, 3), "gate_up": gate_up}

    @classmethod
    def from_pretrained(cls, path, target: TargetModel, backend=None,
                        swa_convention: str | None = None,
                        check_finite: bool = False) -> DFlashDrafter:
        """Load a drafter directory for ``target`` (models/drafter_loading.py)."""
        return load_pretrained(cls, path, target, backend, swa_convention, check_finite)

    @classmethod
    def from_gguf(cls, path, target: TargetModel,
                  swa_convention: str | None = None) -> DFlashDrafter:
        """Load a drafter GGUF for ``target`` (models/drafter_loading.py)."""
        return load_gguf(cls, path, target, swa_convention)

    @classmethod
    def class_for(cls, config: DrafterConfig) -> type[DFlashDrafter]:
        """The class that runs ``config.kind``: this class when it runs that kind, else the
        subclass that declares it (DFlash 2, defined when ``dflash_ref.models`` is imported)."""
        if cls.kind == config.kind:
            return cls
        for klass in DFlashDrafter.__subclasses__():
            if vars(klass).get("kind") == config.kind:
                return klass
        raise ConfigError(f"no drafter class runs kind {config.kind!r}")

    def expected_tensors(self) -> dict[str, tuple[int, ...]]:
        """Every tensor name of this drafter's layout with its PyTorch [out, in] shape."""
        return drafter_expected_tensors(self.config)

    @property
    def is_dflash2(self) -> bool:
        """Whether this is a DFlash 2 drafter (convolutions + candidate selector)."""
        return self.config.kind == "dflash2"

    # ------------------------------------------------------------------ the pieces

    def encode(self, features):
        """Encode: ``c = RMSNorm_hidden_norm(features @ fc^T)``: [ctx, C*H] -> [ctx, H]."""
        cfg = self.config
        width = self.fc.shape[1]
        if features.ndim != 2 or features.shape[1] != width:
            raise ValueError(
                f"context features have shape {tuple(features.shape)}, expected [ctx, {width}] "
                f"(C={cfg.n_capture} captured layers x hidden {cfg.hidden_size})"
            )
        c = self.be.ops.linear(features, self.fc)  # features @ fc^T [ctx, H]
        return self.be.ops.rms_norm(c, self.hidden_norm, cfg.rms_norm_eps)

    def embed_block(self, anchor_token: int, n_rows: int | None = None):
        """Embed: the block [anchor, mask x (n-1)] through the target's embedding: [n, H]
        (``n_rows`` defaults to B)."""
        ids = self.block_ids(anchor_token, self.block_rows(n_rows))
        return self.embed_ids(self.be.xp.asarray(ids))

    def block_ids(self, anchor_token: int, n: int) -> np.ndarray:
        """The block's token ids ``[anchor, mask x (n-1)]``: host int64 [n]."""
        ids = np.full(n, self.config.mask_token_id, dtype=np.int64)
        ids[0] = int(anchor_token)
        return ids

    def embed_ids(self, ids):
        """Block ids [n] on the backend -> the target's embedding rows [n, H] * scale."""
        e = self.target.embed_tokens[ids]
        return e if self.embedding_scale == 1.0 else e * self.be.xp.float32(self.embedding_scale)

    def context_kv(self, layer: int, c, positions):
        """Context K/V of one layer: k_norm + RoPE at absolute ``positions``; [ctx, nkv, d] each."""
        cfg, w = self.config, self.layers[layer]
        n = c.shape[0]
        k, v = self.products[layer]["kv"](c)  # c @ Wk^T, c @ Wv^T: one product
        k = k.reshape(n, cfg.num_key_value_heads, cfg.head_dim)
        v = v.reshape(n, cfg.num_key_value_heads, cfg.head_dim)
        r = cfg.rope_by_type[cfg.layer_types[layer]]
        _, k = self.be.ops.qk_norm_rope(None, k, positions, None, w["self_attn.k_norm.weight"],
                                        cfg.rms_norm_eps, 0.0, r.theta, r.rotary_dim,
                                        r.factor)  # rope(k_norm(k)): keys only, one op
        return k, v

    def layer_mask(self, layer: int, ctx_pos, noise_pos) -> MaskSpec:
        """One layer's mask: non-causal; sliding layers follow ``swa_convention``
        (docs/conventions.md, SWA)."""
        cfg = self.config
        vis = self.visibility[layer]
        causal = vis.max_ahead == 0
        n = max(cfg.block_size, len(noise_pos))  # the block drafted (past B: on request)
        if vis.max_ahead not in (0, None) and vis.max_ahead < n - 1:
            raise ConfigError(
                f"drafter layer {layer}: a window of {cfg.sliding_window} smaller than the block "
                f"({n}) would hide later noise keys; not supported"
            )
        if vis.max_back is None:
            return drafter_mask(ctx_pos, noise_pos, causal=causal)
        if cfg.swa_convention == "bidirectional":  # |q - k| <= W
            return drafter_mask(ctx_pos, noise_pos, window=vis.max_back, causal=causal,
                                window_mode="bidirectional")
        # q - k <= W - 1, i.e. q - k < W (HF convention, the window includes the current token)
        return drafter_mask(ctx_pos, noise_pos, window=vis.max_back + 1, causal=causal)

    def decoder_layer(self, i: int, h, join_kv, ctx_pos, noise_pos):
        """One decoder layer over the noise rows h [B, H]: two residual lines (module
        docstring). ``join_kv(nk, nv)``: the block's K/V [B, nkv, d] -> this layer's context
        K/V followed by them, [ctx + B, nkv, d] each (a copy, or a cache's views)."""
        w, ops, eps = self.layers[i], self.be.ops, self.config.rms_norm_eps
        u = ops.rms_norm(h, w["input_layernorm.weight"], eps)  # noise only
        m = self.attention(i, u, join_kv, ctx_pos, noise_pos)
        h, u = ops.add_rms_norm(m, h, w["post_attention_layernorm.weight"], eps)  # h += m; norm
        return h + self.mlp(i, u)

    def attention(self, i: int, u, join_kv, ctx_pos, noise_pos):
        """Attention of the noise rows u [B, H] over the context and the block: [B, H]."""
        cfg, w, ops = self.config, self.layers[i], self.be.ops
        B, nh, nkv, d = u.shape[0], cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        eps = cfg.rms_norm_eps
        q, nk, nv = self.products[i]["qkv"](u)  # u @ Wq^T, u @ Wk^T, u @ Wv^T: one product
        r = self.config.rope_by_type[self.config.layer_types[i]]
        # q = rope(q_norm(q)), nk = rope(k_norm(nk)) at the block's positions: one op
        q, nk = ops.qk_norm_rope(q.reshape(B, nh, d), nk.reshape(B, nkv, d), noise_pos,
                                 w["self_attn.q_norm.weight"], w["self_attn.k_norm.weight"], eps,
                                 0.0, r.theta, r.rotary_dim, r.factor)
        nv = nv.reshape(B, nkv, d)
        k, v = join_kv(nk, nv)  # [ctx + B, nkv, d] each: context FIRST
        mask = self.layer_mask(i, ctx_pos, noise_pos)
        o = ops.attention(q, k, v, mask, scale=d ** -0.5)  # [B, nh, d]
        return ops.linear(o.reshape(B, nh * d), w["self_attn.o_proj.weight"])

    def mlp(self, i: int, u):
        """The SwiGLU MLP: ``W_down(swiglu(W_gate u, W_up u))``, [B, H] -> [B, H]."""
        g, up = self.products[i]["gate_up"](u)  # u @ Wg^T, u @ Wu^T: one product
        return self.be.ops.linear(self.be.ops.swiglu(g, up), self.layers[i]["mlp.down_proj.weight"])

    def logits(self, z):
        """Draft logits [n, V] from final-normed rows z [n, H]: the target's head, or the
        drafter's reduced head scattered over V (models/draft_head.py; docs/drafter.md, "Head")."""
        return self.draft_head.logits(z)

    def head(self, h, with_hidden: bool = False):
        """Head: ``z = RMSNorm_norm(h)``, then the logits (and z with ``with_hidden``)."""
        z = self.be.ops.rms_norm(h, self.norm, self.config.rms_norm_eps)
        return (self.logits(z), z) if with_hidden else self.logits(z)

    def run_block(self, h, joins, ctx_pos, noise_pos, with_hidden: bool = False):
        """The embedded block h [n, H] through every layer (``joins``: each layer's
        ``join_kv``, read as the layers run), then the head: logits [n, V]."""
        for i, join_kv in enumerate(joins):
            h = self.decoder_layer(i, h, join_kv, ctx_pos, noise_pos)
        return self.head(h, with_hidden)

    def block_rows(self, n_rows: int | None) -> int:
        """The rows of a drafted block: ``n_rows``, or the block size B when None."""
        if n_rows is None:
            return self.block_size
        if n_rows < 1:  # past block_size: positions never trained on (generate asks for opt-in)
            raise ValueError(f"n_rows must be >= 1 (the anchor row), got {n_rows}")
        return int(n_rows)

    def propose(self, hidden, logits, anchor_token: int, law: SamplingParams | None = None,
                rng=None) -> DraftProposal:
        """The drafts of rows 1..n-1 (``logits`` [n, V]): the argmax per row for greedy ``law``
        (or None), else one draw per row with its law q [n-1, V]. ``hidden`` [n, H] and
        ``anchor_token`` are what DFlash 2's selector reads."""
        if law is None or law.greedy:
            return DraftProposal(self.draft_tokens(logits))
        return self.draft_head.sample(logits[1:], law, rng)

    def draft_probs(self, logits, drafts, top_k: int) -> np.ndarray:
        """The drafter's probability of each draft ``drafts`` [n-1] in rows 1..n-1 of
        ``logits`` [n, V], renormalised over each row's ``top_k`` best (host float64 [n-1];
        syncs; models/draft_head.py, ``draft_probs``)."""
        return self.draft_head.probs_of(logits[1:], drafts, top_k)

    # ------------------------------------------------------------------ stateless entry point

    def forward_block(self, context_features, context_positions, anchor_token: int,
                      anchor_position: int, n_rows: int | None = None,
                      with_hidden: bool = False):
        """Draft logits [n, vocab] (n = n_rows, default B; with_hidden: and the final-normed
        rows [n, H]) from context_features [ctx, C*H] at context_positions [ctx] and the anchor
        token t_s at anchor_position s, recomputing the context K/V."""
        xp = self.be.xp
        feats = xp.asarray(context_features, dtype=xp.float32)
        ctx_pos = np.asarray(self.be.to_numpy(context_positions), dtype=np.int64)
        if ctx_pos.shape != (feats.shape[0],):
            raise ValueError(
                f"context_positions has shape {ctx_pos.shape}, expected ({feats.shape[0]},)"
            )
        n = self.block_rows(n_rows)
        noise_pos = np.arange(anchor_position, anchor_position + n)
        c = self.encode(feats)
        joins = (context_then_block(self.be.xp, *self.context_kv(i, c, ctx_pos))
                 for i in range(self.config.num_hidden_layers))  # each made as its layer runs
        return self.run_block(self.embed_block(anchor_token, n), joins, ctx_pos, noise_pos,
                              with_hidden)

    def draft_tokens(self, logits) -> np.ndarray:
        """Greedy drafts: argmax of rows 1..B-1, host int64 [B-1]; a non-finite row raises
        (docs/conventions.md, "Non-finite logits")."""
        return self.draft_head.argmax(logits[1:], first_row=1)

    # ------------------------------------------------------------------ cached form

    def cache_for(self, state) -> DraftCache:
        """An empty draft cache over the target ``state``, as its step runner hands it out."""
        return state.runner.draft_cache(self)

    def new_cache(self, window=None) -> DraftCache:
        """An empty draft cache; with ``window`` it drafts over the last W context positions."""
        return DraftCache(self, window)

    def fixed_cache(self, capacity: int, window=None, run_step=step_now) -> FixedDraftCache:
        """An empty draft cache in fixed rows (models/fixed_stores.py)."""
        return FixedDraftCache(self, capacity, window, run_step)


def context_then_block(xp, ctx_k, ctx_v):
    """The stateless form's ``join_kv``: ``(nk, nv) -> ([ctx_k ; nk], [ctx_v ; nv])``, new
    arrays [ctx + B, nkv, d]."""
    def join_kv(nk, nv):
        return xp.concatenate([ctx_k, nk], axis=0), xp.concatenate([ctx_v, nv], axis=0)
    return join_kv

