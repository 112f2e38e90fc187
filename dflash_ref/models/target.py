"""The target model: forward pass over a KV cache and GDN state, with feature capture.

One class serves every supported layout (Qwen3 dense, Qwen3.5 / Qwen3-Next hybrid, Gemma 3 text),
read from a Hugging Face directory (``config.json`` + ``*.safetensors``, sharded or not) with HF
tensor names. The forward is written once against a Backend and runs on NumPy or CuPy.

Per decoder layer, in order (spec/dflash.md §3 for capture; spec/gdn.md §3 for GDN layers)::

    Qwen3 / Qwen3.5:  x += mixer(norm_in(x));  x += mlp(norm_post(x))
    Gemma 3:          x += norm_post_attn(attn(norm_in(x)));  x += norm_post_ff(mlp(norm_pre_ff(x)))

where ``mixer`` is attention (causal, or causal with a sliding window of W: query - key < W) or a
Gated DeltaNet layer. Norm weights are stored raw; (1 + w) families pass ``offset=1.0``.

Feature capture: with ``target_layer_ids = [i0, i1, ...]`` (HF numbering) the forward returns,
per token, ``concat(h_i0, h_i1, ...)`` where ``h_i`` is the raw residual stream **after** decoder
layer i (HF ``hidden_states[i + 1]``), un-normed. GGUF stacks that store ``i + 1`` mean the same
layer: "input of layer i + 1" == "output of layer i" (spec/dflash.md §3, §7.5).

State: :class:`TargetState` holds one :class:`~dflash_ref.models.cache.KVCache` per attention
layer, the GDN state per linear-attention layer, the captured :class:`FeatureBuffer`, and what is
needed to roll back the last batch. ``model.forward(ids, state)`` appends ``ids`` at positions
``state.length ..``; prefill, decode and verify batches are all this one call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from dflash_ref.backend import Backend, as_backend
from dflash_ref.config import TargetConfig, expected_tensors
from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.safetensors_io import check_tensor_shapes, load_checkpoint
from dflash_ref.models.cache import FeatureBuffer, KVCache
from dflash_ref.models.gdn_layer import GDNConfig, GDNLayer
from dflash_ref.ops.masks import causal_mask, committed_prefix_mask, tree_depths, tree_mask


@dataclass
class TargetOutput:
    """Result of one forward: ``logits`` [T, vocab] float32; ``features`` [T, C*hidden] or None."""

    logits: object
    features: object | None


@dataclass
class _BatchRecord:
    """What rollback needs from the last forward: its start and each GDN layer's rewind data."""

    start: int
    length: int
    gdn: dict = field(default_factory=dict)  # layer -> (state before, trace) | node states
    tree_features: object = None  # features of every tree node (tree verify only)


class QKProbe:
    """Records the queries and keys attention layers compute, for relevance scoring.

    Set ``state.qk_probe = QKProbe(layers, rope, n_tail)`` and run chain forwards: each listed
    layer appends its keys [T, Hkv, D] and keeps the queries of the last ``n_tail`` positions
    [n_tail, Hq, D], taken after the q/k norms and, with ``rope=False``, before RoPE (the public
    scorer's default "NoPE" Q and K, spec/kvflash_gate.md §2.2). :meth:`TargetModel.attention_qk`
    is the one user; the KVFlash tail-attention scorer consumes its output.
    """

    def __init__(self, layers, rope: bool, n_tail: int):
        self.layers, self.rope, self.n_tail = tuple(layers), bool(rope), int(n_tail)
        self._q = {i: None for i in self.layers}  # layer -> [<= n_tail, Hq, D]
        self._k = {i: [] for i in self.layers}  # layer -> pieces [T, Hkv, D]

    def record(self, layer: int, q, k, xp) -> None:
        if layer not in self._k:
            return
        held = self._q[layer]
        q = q if held is None else xp.concatenate([held, q], axis=0)
        self._q[layer] = q[-self.n_tail:]  # only the tail queries are kept
        self._k[layer].append(k)

    def arrays(self, be: Backend) -> tuple[np.ndarray, np.ndarray]:
        """``(q_tail [L, n_tail, Hq, D], keys [L, S, Hkv, D])`` as host float32 arrays."""
        q = np.stack([be.to_numpy(self._q[i]) for i in self.layers])
        k = np.stack([be.to_numpy(be.xp.concatenate(self._k[i], axis=0)) for i in self.layers])
        return q, k


class TargetState:
    """Per-sequence state: KV caches, GDN states, features, and the last batch's rewind record."""

    def __init__(self, model: TargetModel, feature_capacity: int | None = None,
                 feature_window: int | None = None, pager=None):
        cfg, be = model.config, model.be
        self.length = 0
        # KVFlash: full-attention layers keep their K/V in the pager's pool; sliding-window
        # layers (bounded anyway) and GDN layers are never paged.
        self.pager = pager
        pooled = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
        if pager is not None:
            if not pooled:
                raise ConfigError("this target has no full-attention layer to page; run it "
                                  "without a pager")
            dims = {(cfg.num_key_value_heads_for(i), cfg.head_dim_for(i)) for i in pooled}
            if len(dims) != 1:
                raise ConfigError(f"KVFlash pools one K/V shape; the full-attention layers "
                                  f"use {sorted(dims)}")
            (nkv, d), = dims
            pager.attach(be, pooled, nkv, d)
            pager.reset()
        self.pooled_layers = frozenset(pooled if pager is not None else ())
        self.kv: dict[int, KVCache] = {
            i: KVCache(be, cfg.num_key_value_heads_for(i), cfg.head_dim_for(i))
            for i, t in enumerate(cfg.layer_types)
            if t != "linear_attention" and i not in self.pooled_layers
        }
        self.gdn: dict[int, object] = {
            i: None for i, t in enumerate(cfg.layer_types) if t == "linear_attention"
        }
        width = len(model.target_layer_ids) * cfg.hidden_size
        self.features = (
            FeatureBuffer(be, width, capacity=feature_capacity, window=feature_window)
            if model.target_layer_ids else None
        )
        self._last: _BatchRecord | None = None
        self._pending: _BatchRecord | None = None  # an uncommitted tree verify
        self.qk_probe: QKProbe | None = None  # records attention q/k when set (scoring)
        self._model = model

    def commit_path(self, path) -> None:
        """Keep the accepted branch of the last :meth:`TargetModel.forward_tree` pass.

        ``path`` = node indices root first (node 0 is the root). Afterwards the state holds the
        committed prefix plus the path's nodes at positions start, start+1, ...: KV rows of the
        path, their features, and each GDN layer's state after the path's last node, exactly as
        if the path's tokens had been run as a chain.
        """
        rec = self._pending
        if rec is None:
            raise ValueError("commit_path: no tree verify is pending (call forward_tree first)")
        path = np.asarray(path, dtype=np.int64)
        if path.size == 0 or path[0] != 0 or np.any(path >= rec.length):
            raise ValueError(f"commit_path: path must start at the root 0 and index the "
                             f"{rec.length} tree nodes, got {path.tolist()}")
        start, xp = rec.start, self._model.be.xp
        for cache in self.kv.values():
            cache.keep_rows(start, start + path)  # the path's K/V, in path order
        for i, node_states in rec.gdn.items():
            self.gdn[i] = node_states[int(path[-1])]
        if self.features is not None:
            self.features.append(start, rec.tree_features[xp.asarray(path)])
        self.length = start + path.size
        self._pending = None
        self._last = None  # a tree commit cannot be rewound further

    def rollback(self, n_keep: int) -> None:
        """Drop positions >= n_keep from every cache and rewind GDN states to match.

        KV caches and features truncate. A GDN state cannot be truncated: it is rewound from the
        last forward's trace (``GDNLayer.rewind``), so ``n_keep`` must lie within the last batch
        ``[start, start + T]`` unless no GDN layer exists. Rolling back further is an error.
        """
        if self._pending is not None:
            raise ValueError("rollback: a tree verify is pending; call commit_path(path)")
        if not 0 <= n_keep <= self.length:
            raise ValueError(f"rollback({n_keep}): the state holds {self.length} positions")
        if n_keep == self.length:
            return
        if self.gdn:
            last = self._last
            if last is None or not last.start <= n_keep <= last.start + last.length:
                span = "none" if last is None else f"[{last.start}, {last.start + last.length}]"
                raise ValueError(
                    f"rollback({n_keep}): GDN layers can only rewind within the last forward "
                    f"batch (positions {span}); re-run the prefix from a saved state instead"
                )
            if len(last.gdn) != len(self.gdn):
                raise ValueError(
                    f"rollback({n_keep}): the last batch had {last.length} tokens, more than "
                    f"TRACE_MAX_TOKENS={TRACE_MAX_TOKENS}, so no GDN trace was kept; run long "
                    f"prefills before speculating, or in smaller batches"
                )
            n_accept = n_keep - last.start
            for i, (before, trace) in last.gdn.items():
                self.gdn[i] = self._model.layers[i].mixer.rewind(before, trace, n_accept)
        for cache in self.kv.values():
            cache.truncate(n_keep)
        if self.features is not None:
            self.features.truncate(n_keep)
        self.length = n_keep


class TargetModel:
    """A causal LM target (see module docstring). Construct with :meth:`from_pretrained`."""

    def __init__(self, config: TargetConfig, weights: dict, backend="numpy",
                 target_layer_ids=None):
        _check_supported(config)
        self.config = config
        self.be: Backend = as_backend(backend)
        self.target_layer_ids: list[int] = []
        self.set_target_layer_ids(target_layer_ids)
        self._check_weights(weights)
        xp = self.be.xp
        w = {name: xp.asarray(arr, dtype=xp.float32) for name, arr in weights.items()}
        p = config.weight_prefix
        self.embed_tokens = w[f"{p}embed_tokens.weight"]  # [vocab, H]
        self.final_norm = w[f"{p}norm.weight"]
        self.lm_head_weight = (
            self.embed_tokens if config.tie_word_embeddings else w[config.lm_head_name]
        )  # [vocab, H]
        self.layers = [
            _DecoderLayer(self, i, {k[len(f"{p}layers.{i}."):]: v for k, v in w.items()
                                    if k.startswith(f"{p}layers.{i}.")})
            for i in range(config.num_hidden_layers)
        ]

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_pretrained(cls, path, backend="numpy", target_layer_ids=None) -> TargetModel:
        """Load ``config.json`` + ``*.safetensors`` (single or sharded) from directory ``path``."""
        path = Path(path)
        cfg_path = path / "config.json"
        if not cfg_path.exists():
            raise FormatError(f"{path} has no config.json; expected a Hugging Face model directory")
        config = TargetConfig.from_hf(json.loads(cfg_path.read_text()))
        weights = load_checkpoint(path)
        config = _match_weight_prefix(config, weights)
        return cls(config, weights, backend=backend, target_layer_ids=target_layer_ids)

    @classmethod
    def from_gguf(cls, path, backend="numpy", target_layer_ids=None) -> TargetModel:
        """Load a llama.cpp GGUF of arch ``qwen3``, ``qwen35`` or ``gemma3``.

        :func:`~dflash_ref.io.convert_target.read_gguf_target` undoes what llama.cpp's converter
        baked in (the +1 of (1+w) norms, ``ssm_a = -exp(A_log)``, the tiled GDN value heads) and
        dequantizes, so the forward is the safetensors one up to the storage error.
        """
        from dflash_ref.io.convert_target import read_gguf_target

        config_dict, weights = read_gguf_target(path)
        config = TargetConfig.from_hf(config_dict)
        return cls(config, weights, backend=backend, target_layer_ids=target_layer_ids)

    def set_target_layer_ids(self, target_layer_ids) -> None:
        """Set the capture layers (HF numbering: the output of decoder layer i)."""
        ids = [] if target_layer_ids is None else [int(i) for i in target_layer_ids]
        n = self.config.num_hidden_layers
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise ConfigError(
                f"target_layer_ids {bad} are outside the target's layers 0..{n - 1}; ids use HF "
                f"numbering (output of layer i); a GGUF 'dflash' file stores i + 1, subtract 1"
            )
        self.target_layer_ids = ids

    def expected_tensors(self) -> dict[str, tuple[int, ...]]:
        return expected_tensors(self.config)

    def _check_weights(self, weights: dict) -> None:
        check_tensor_shapes(
            weights, expected_tensors(self.config), f"the {self.config.family} checkpoint",
            hint=f"is weight_prefix {self.config.weight_prefix!r} right and the checkpoint "
                 f"complete?")

    def new_state(self, feature_capacity: int | None = None,
                  feature_window: int | None = None, pager=None) -> TargetState:
        """A fresh per-sequence state (empty caches; features captured if layer ids are set).

        ``pager``: a :class:`~dflash_ref.kvflash.pager.KVFlashPager`; the full-attention layers
        then keep K/V in its bounded pool (it is attached and reset here, once per sequence).
        """
        return TargetState(self, feature_capacity, feature_window, pager)

    def attention_qk(self, ids, n_tail: int = 8, rope: bool = False, layers=None,
                     piece_tokens: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """Queries of the last ``n_tail`` positions and keys of every position of ``ids``.

        What the KVFlash tail-attention scorer needs (spec/kvflash_gate.md §2.2): the model is
        run over the whole history in a fresh, unpooled state (so chunks a pager has paged out
        are scored too), ``piece_tokens`` at a time to bound the attention's memory, and a
        :class:`QKProbe` records each layer's q and k after the q/k norms, before RoPE by
        default (the public scorer's "NoPE" choice) or after it with ``rope=True``.
        Cost: one forward over S = len(ids) tokens (O(S^2) attention) per call.

        Args:
            ids: [S] token ids, S >= n_tail.
            n_tail: tail queries kept (8 upstream).
            rope: record post-RoPE q and k (the scores the model's own attention computes).
            layers: attention layer ids to record (default: the full-attention layers, i.e. the
                layers a pager pools); they must share Hq, Hkv and D.
        Returns:
            ``(q_tail [L, n_tail, Hq, D], keys [L, S, Hkv, D])`` host float32 arrays.
        """
        cfg = self.config
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if layers is None:
            layers = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
        layers = [int(i) for i in layers]
        bad = [i for i in layers if not 0 <= i < cfg.num_hidden_layers
               or cfg.layer_types[i] == "linear_attention"]
        if not layers or bad:
            raise ConfigError(f"attention_qk: layers {layers or '[]'} must be a non-empty list of "
                              f"attention layers (GDN layers have no q/k); bad: {bad}")
        if len({(cfg.num_key_value_heads_for(i), cfg.head_dim_for(i)) for i in layers}) != 1:
            raise ConfigError(f"attention_qk: layers {layers} differ in kv heads or head_dim; "
                              f"score layers of one shape")
        if not 1 <= n_tail <= ids.size:
            raise ValueError(f"attention_qk: need 1 <= n_tail={n_tail} <= len(ids)={ids.size}")
        state = self.new_state(feature_capacity=1, feature_window=1)  # features unused here
        state.qk_probe = QKProbe(layers, rope, n_tail)
        for a in range(0, ids.size, piece_tokens):
            self.forward(ids[a:a + piece_tokens], state)
        return state.qk_probe.arrays(self.be)

    # ------------------------------------------------------------------ pieces the drafter shares

    def embed(self, ids):
        """Token embeddings [T, H] (times the embedding scale for Gemma: spec/dflash.md §4.2)."""
        e = self.embed_tokens[self.be.xp.asarray(ids)]
        scale = self.config.embedding_scale
        return e if scale is None else e * self.be.xp.float32(scale)

    def lm_head(self, h):
        """Logits [T, vocab] from final-normed hidden h [T, H], with the final softcap if any."""
        logits = h @ self.lm_head_weight.T
        cap = self.config.final_logit_softcapping
        if cap:
            logits = self.be.xp.float32(cap) * self.be.xp.tanh(logits / self.be.xp.float32(cap))
        return logits

    def final_norm_apply(self, h):
        cfg = self.config
        return self.be.ops.rms_norm(h, self.final_norm, cfg.rms_norm_eps, cfg.norm_offset)

    # ------------------------------------------------------------------ forward

    def forward(self, ids, state: TargetState) -> TargetOutput:
        """Run ``ids`` [T] at positions state.length .. state.length+T-1; update ``state``.

        Returns logits [T, vocab] and, when capture layers are set, features [T, C*hidden].
        """
        return self._forward(ids, state, parents=None)

    def forward_tree(self, ids, parents, state: TargetState) -> TargetOutput:
        """Verify a draft tree in one pass (spec/kvflash_gate.md §5a).

        Node i (token ``ids[i]``, parent ``parents[i]`` < i, -1 for the root) sits at position
        ``state.length + depth(i)`` and sees the committed prefix and its own ancestors only
        (:func:`~dflash_ref.ops.masks.tree_mask`); GDN layers run each node from its parent's
        state. The state is left pending: call ``state.commit_path(path)`` with the accepted
        node indices (root first) to keep exactly that branch.

        Returns logits [n, vocab] and features [n, C*hidden] (None without capture), node order.
        """
        parents = np.asarray(parents, dtype=np.int64).reshape(-1)
        if parents.shape[0] != np.asarray(ids).reshape(-1).shape[0]:
            raise ValueError("forward_tree: ids and parents must have the same length")
        if parents.size and (parents[0] != -1 or np.any(parents[1:] >= np.arange(1, parents.size))
                             or np.any(parents[1:] < 0)):
            raise ValueError("forward_tree: parents must be [-1, p1, p2, ...] with 0 <= p_i < i "
                             "(one root, node 0, topologically ordered)")
        return self._forward(ids, state, parents=parents)

    def _forward_pieces(self, ids, state: TargetState) -> TargetOutput:
        """Forward ``ids`` in chunk-aligned pieces through the pager; outputs concatenated."""
        xp, T = self.be.xp, state.pager.chunk_tokens
        cuts = [0]
        while cuts[-1] < ids.size:
            pos = state.length + cuts[-1]
            cuts.append(min(ids.size, cuts[-1] + T - pos % T))
        outs = [self._forward(ids[a:b], state, None) for a, b in zip(cuts, cuts[1:])]
        feats = (None if outs[0].features is None
                 else xp.concatenate([o.features for o in outs], axis=0))
        return TargetOutput(logits=xp.concatenate([o.logits for o in outs], axis=0),
                            features=feats)

    def _forward(self, ids, state: TargetState, parents) -> TargetOutput:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        T = ids.shape[0]
        if T == 0:
            raise ValueError("forward needs at least one token")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size})")
        if state._pending is not None:
            raise ValueError("the state holds an uncommitted tree verify; call "
                             "state.commit_path(path) first")
        pager = state.pager
        if pager is not None and parents is not None:
            raise ConfigError("tree verify over a KVFlash pool is not implemented; use "
                              "verify='chain' with a pager")
        if pager is not None and T > pager.chunk_tokens:
            # A span longer than a chunk may evict its own first chunks once the pool is full:
            # run it one chunk-aligned piece at a time, as the public pooled prefill does.
            return self._forward_pieces(ids, state)
        start = state.length
        if pager is not None:
            pager.alloc_span(start, T)  # slot_for each new position, evicting if needed
        depths = np.arange(T) if parents is None else tree_depths(parents)
        positions = (start + depths).astype(np.int64)  # [T]
        record = _BatchRecord(start, T)
        h = self.embed(ids)  # [T, H]
        captured = {}
        for i, layer in enumerate(self.layers):
            h = layer.forward(h, positions, state, record, parents)
            if i in self.target_layer_ids:
                captured[i] = h
        features = None
        if self.target_layer_ids:
            features = self.be.xp.concatenate([captured[i] for i in self.target_layer_ids], axis=1)
        logits = self.lm_head(self.final_norm_apply(h))
        if parents is None:
            if features is not None:
                state.features.append(start, features)
            state.length = start + T
            state._last = record
        else:
            record.tree_features = features
            state._pending = record
        return TargetOutput(logits=logits, features=features)


class _DecoderLayer:
    """One decoder layer: mixer (attention or GDN) + gated MLP, with the family's norm layout."""

    def __init__(self, model: TargetModel, idx: int, w: dict):
        cfg = model.config
        self.model, self.idx, self.w = model, idx, w
        self.kind = cfg.layer_types[idx]
        self.mixer = None
        if self.kind == "linear_attention":
            gdn_w = {k[len("linear_attn."):]: v for k, v in w.items()
                     if k.startswith("linear_attn.")}
            self.mixer = GDNLayer(gdn_config(cfg), gdn_w, backend=model.be)

    def _norm(self, x, name):
        cfg = self.model.config
        return self.model.be.ops.rms_norm(x, self.w[name], cfg.rms_norm_eps, cfg.norm_offset)

    def forward(self, x, positions, state: TargetState, record: _BatchRecord, parents=None):
        cfg = self.model.config
        u = self._norm(x, "input_layernorm.weight")
        if self.kind == "linear_attention" and parents is not None:
            y = self._gdn_tree(u, parents, state, record)
        elif self.kind == "linear_attention":
            before = state.gdn[self.idx] or self.mixer.initial_state()
            keep_trace = u.shape[0] <= TRACE_MAX_TOKENS
            y, new_state, trace = self.mixer.forward(u, before, return_trace=keep_trace)
            state.gdn[self.idx] = new_state
            if keep_trace:
                record.gdn[self.idx] = (before, trace)
        elif self.idx in state.pooled_layers:
            y = self._attention_pooled(u, positions, state.pager, state.qk_probe)
        else:
            probe = state.qk_probe if parents is None else None
            y = self._attention(u, positions, state.kv[self.idx], parents, probe)
        if cfg.use_pre_post_ffn_norms:  # Gemma: norm the attention output before the residual
            y = self._norm(y, "post_attention_layernorm.weight")
            x = x + y
            m = self._mlp(self._norm(x, "pre_feedforward_layernorm.weight"))
            return x + self._norm(m, "post_feedforward_layernorm.weight")
        x = x + y
        return x + self._mlp(self._norm(x, "post_attention_layernorm.weight"))

    def _gdn_tree(self, u, parents, state: TargetState, record: _BatchRecord):
        """GDN over tree nodes: node i runs one step from its parent's state (root: the layer's
        committed state). Returns [n, H]; per-node states go to the record for commit_path."""
        root = state.gdn[self.idx] or self.mixer.initial_state()
        node_states, ys = [], []
        for i, p in enumerate(parents):
            y, st, _ = self.mixer.forward(u[i:i + 1], root if p < 0 else node_states[p])
            node_states.append(st)
            ys.append(y)
        record.gdn[self.idx] = node_states
        return self.model.be.xp.concatenate(ys, axis=0)

    def _qkv(self, u, positions, probe: QKProbe | None = None):
        """Projections, q/k norms and RoPE: q [T, nh, d], k, v [T, nkv, d], gate or None.

        A ``probe`` records q and k before RoPE (``probe.rope`` False) or after it (True).
        """
        cfg, be = self.model.config, self.model.be
        xp, ops, w = be.xp, be.ops, self.w
        T, nh = u.shape[0], cfg.num_attention_heads
        nkv, d = cfg.num_key_value_heads_for(self.idx), cfg.head_dim_for(self.idx)
        q = u @ w["self_attn.q_proj.weight"].T  # [T, nh*d] (x2 with an output gate)
        gate = None
        if cfg.attn_output_gate:  # Qwen3.5 / Qwen3-Next: per head [q (d) | gate (d)]
            q = q.reshape(T, nh, 2 * d)
            q, gate = q[..., :d], q[..., d:].reshape(T, nh * d)
        q = q.reshape(T, nh, d)
        k = (u @ w["self_attn.k_proj.weight"].T).reshape(T, nkv, d)
        v = (u @ w["self_attn.v_proj.weight"].T).reshape(T, nkv, d)
        if cfg.qk_norm:  # per head over d, before RoPE
            q = ops.rms_norm(q, w["self_attn.q_norm.weight"], cfg.rms_norm_eps, cfg.norm_offset)
            k = ops.rms_norm(k, w["self_attn.k_norm.weight"], cfg.rms_norm_eps, cfg.norm_offset)
        if probe is not None and not probe.rope:
            probe.record(self.idx, q, k, xp)
        r = cfg.rope_for(self.idx)  # theta, rotary_dim and linear factor of this layer's type
        q = ops.rope(xp.ascontiguousarray(q), positions, r.theta, r.rotary_dim, r.factor)
        k = ops.rope(xp.ascontiguousarray(k), positions, r.theta, r.rotary_dim, r.factor)
        if probe is not None and probe.rope:
            probe.record(self.idx, q, k, xp)
        return q, k, v, gate

    def _attend_out(self, q, keys, values, mask, gate):
        """Attention, optional sigmoid output gate, o_proj: [T, H]."""
        cfg, xp = self.model.config, self.model.be.xp
        T, nh, d = q.shape
        o = self.model.be.ops.attention(q, keys, values, mask, scale=cfg.attention_scale,
                                        softcap=cfg.attn_logit_softcapping)  # [T, nh, d]
        o = o.reshape(T, nh * d)
        if gate is not None:
            o = o * (1.0 / (1.0 + xp.exp(-gate)))  # sigmoid output gate
        return o @ self.w["self_attn.o_proj.weight"].T

    def _attention_pooled(self, u, positions, pager, probe=None):
        """Attention over the KVFlash pool (spec/kvflash_gate.md §1.6, the strict rule).

        The batch's K/V are written into their slots first; then every query sees the slots
        whose position p satisfies ``p >= 0 and (p < base_pos or p <= q)`` (base_pos = the
        batch start): the committed prefix plus causal within the batch. Slots are in any order
        and rejected drafts left in slots at p >= base_pos stay hidden, so rollback needs nothing.
        """
        q, k, v, gate = self._qkv(u, positions, probe)
        pager.write(self.idx, positions, k, v)
        keys, values, k_pos = pager.kv(self.idx)  # [P, nkv, d] x2, [P]
        mask = committed_prefix_mask(positions, k_pos, base_pos=int(positions[0]))
        return self._attend_out(q, keys, values, mask, gate)

    def _attention(self, u, positions, kv: KVCache, parents=None, probe=None):
        """Self-attention of the batch over the cache + batch; returns [T, H].

        Chain batches use the causal (or sliding) mask over positions; tree batches the
        ancestor-only tree mask, with the nodes' K/V appended to the cache in node order until
        ``commit_path`` keeps the accepted branch.
        """
        cfg = self.model.config
        q, k, v, gate = self._qkv(u, positions, probe)
        base = kv.length
        kv.append(k, v)
        window = cfg.sliding_window if self.kind == "sliding_attention" else None
        if parents is None:
            mask = causal_mask(positions, np.arange(kv.length), window=window)
        else:
            mask = tree_mask(parents, base, window=window)
        return self._attend_out(q, kv.k, kv.v, mask, gate)

    def _mlp(self, u):
        cfg, be, w = self.model.config, self.model.be, self.w
        g = u @ w["mlp.gate_proj.weight"].T  # [T, F]
        up = u @ w["mlp.up_proj.weight"].T
        if cfg.hidden_act == "silu":
            a = be.ops.swiglu(g, up)
        else:  # gelu_pytorch_tanh (Gemma): 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up
            xp = be.xp
            c = xp.float32(np.sqrt(2.0 / np.pi))
            a = 0.5 * g * (1.0 + xp.tanh(c * (g + xp.float32(0.044715) * g * g * g))) * up
        return a @ w["mlp.down_proj.weight"].T


GDN_LAYOUTS = {"qkvz_ba_grouped": "qwen3_next", "qkv_z_b_a": "qwen3_5"}

# A batch of at most this many tokens keeps the GDN per-token trace (recurrent scan) so that
# rollback can rewind into it; longer batches (prefill) take the chunked scan and keep none.
TRACE_MAX_TOKENS = 64


def gdn_config(cfg: TargetConfig) -> GDNConfig:
    """The GDN layer sizes of a hybrid target (spec/gdn.md §3; gated norm eps = rms_norm_eps)."""
    g = cfg.gdn
    return GDNConfig(hidden_size=cfg.hidden_size, num_k_heads=g.num_key_heads,
                     num_v_heads=g.num_value_heads, head_k_dim=g.key_head_dim,
                     head_v_dim=g.value_head_dim, conv_kernel=g.conv_kernel_dim,
                     rms_norm_eps=cfg.rms_norm_eps, layout=GDN_LAYOUTS[g.projection_layout])


def _match_weight_prefix(cfg: TargetConfig, weights) -> TargetConfig:
    """Pick the decoder-tensor prefix the checkpoint actually uses among the layouts seen for
    this wrapper (multimodal checkpoints differ: ``model.language_model.`` vs
    ``language_model.model.``); the config's own guess when none matches (errors name it)."""
    for prefix in (cfg.weight_prefix, *cfg.weight_prefix_candidates):
        if f"{prefix}embed_tokens.weight" in weights:
            if prefix != cfg.weight_prefix:
                cfg = cfg.with_weight_prefix(prefix)
            break
    if not cfg.tie_word_embeddings and cfg.lm_head_name not in weights:
        for name in ("lm_head.weight", "language_model.lm_head.weight"):
            if name in weights:
                return replace(cfg, lm_head_name=name)
    return cfg


def _check_supported(cfg: TargetConfig) -> None:
    """Refuse, by name, config features the model code does not implement (never run them wrong)."""
    problems = []
    if cfg.family == "gemma4":
        problems.append("Gemma 4 model code (config parsing only; see docs/target.md)")
    if cfg.moe is not None:
        problems.append(f"mixture-of-experts MLPs ({cfg.moe.num_experts} experts)")
    if cfg.v_norm or cfg.attention_k_eq_v:
        problems.append("v_norm / shared k=v attention")
    if cfg.attention_bias:
        problems.append("attention_bias")
    if cfg.hidden_act not in ("silu", "gelu_pytorch_tanh"):
        problems.append(f"hidden_act {cfg.hidden_act!r} (silu and gelu_pytorch_tanh are)")
    for i in range(cfg.num_hidden_layers):
        if cfg.layer_types[i] != "linear_attention" and cfg.rope_for(i).rope_type not in (
                "default", "linear"):
            problems.append(f"rope_type {cfg.rope_for(i).rope_type!r} (layer {i})")
            break
    if problems:
        raise ConfigError(
            f"{cfg.family} target uses features the reference model does not implement: "
            f"{'; '.join(problems)}. Supported: Qwen3 dense, Qwen3.5 / Qwen3-Next dense-MLP "
            f"hybrids, Gemma 3 text."
        )
