"""The target model: a causal LM whose forward also captures hidden states for the drafter::

    h = embed(ids)                          # [T, H] (Gemma: times its embedding scale)
    u = input_norm_0(h)                     # each layer is handed its normed input
    for layer in layers:                    # models/layers.py: norm, mixer, residual, norm, MLP
        h, u = layer(h, u, batch)           # u: the next layer's input norm of h (final last)
        if layer in target_layer_ids: capture h
    logits = lm_head(u)                     # [T, vocab] (Gemma: final softcap)

One class serves every family (docs/target.md, "Families"); the layers and the forms of their
components are chosen once, from the config (models/assemble.py). Loading is models/loading.py.

Feature capture: with ``target_layer_ids = [i0, i1, ...]`` (HF numbering) the forward returns,
per token, ``concat(h_i0, h_i1, ...)``, ``h_i`` the raw residual stream **after** decoder layer
i (HF ``hidden_states[i + 1]``), un-normed (docs/conventions.md, "Layer ids").

``forward(ids, state)`` appends ``ids`` to a :class:`~dflash_ref.models.state.TargetState`
(prefill, decode and verify alike) through the state's step runner.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from dflash_ref.backend import Backend, as_backend
from dflash_ref.config import TargetConfig
from dflash_ref.errors import ConfigError
from dflash_ref.models.assemble import FUSED_OPS, decoder_layers
from dflash_ref.models.batch import forward_batch
from dflash_ref.models.graphs import graph_runner
from dflash_ref.models.head_rows import forward_head_later
from dflash_ref.models.layers import RMSNorm, run_stack
from dflash_ref.models.loading import from_gguf, from_pretrained, target_weights
from dflash_ref.models.output import TargetOutput
from dflash_ref.models.pooled import forward_pieces
from dflash_ref.models.qk_probe import attention_qk
from dflash_ref.models.state import EagerRunner, StorePlan, TargetState
from dflash_ref.models.tree import forward_tree


class TargetModel:
    """A causal LM target; ``fused=()`` builds the reference form, with the same results."""

    def __init__(self, config: TargetConfig, weights: dict, backend="numpy",
                 target_layer_ids=None, fused=FUSED_OPS):
        weights = target_weights(config, weights)  # checked; MoE experts fused
        self.config = config
        self.be: Backend = as_backend(backend)
        self.target_layer_ids: list[int] = []
        self.set_target_layer_ids(target_layer_ids)
        xp, p = self.be.xp, config.weight_prefix
        w = {name: xp.asarray(arr, dtype=xp.float32) for name, arr in weights.items()}
        self.embed_tokens = w[f"{p}embed_tokens.weight"]  # [vocab, H]
        self.final_norm = w[f"{p}norm.weight"]
        self.final_rms_norm = RMSNorm(self.be, self.final_norm, config.rms_norm_eps,
                                      config.norm_offset)
        self.lm_head_weight = (
            self.embed_tokens if config.tie_word_embeddings else w[config.lm_head_name]
        )  # [vocab, H]
        self.fused = tuple(fused)
        self.layers = decoder_layers(config, self.be, w, self.embed, self.final_rms_norm,
                                     self.fused)
        self.store_plan = StorePlan.of(config)  # which store each layer gets, for new_state

    from_pretrained = classmethod(from_pretrained)
    from_gguf = classmethod(from_gguf)
    attention_qk = attention_qk  # the KVFlash scorer's Q/K probe (models/qk_probe.py)
    forward_batch = forward_batch  # several sequences in one forward (models/batch.py)
    forward_tree = forward_tree  # a draft tree verified in one pass (models/tree.py)
    forward_head_later = forward_head_later  # the head only on rows asked for (head_rows.py)

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

    def new_state(self, feature_capacity: int | None = None,
                  feature_window: int | None = None, pager=None, kv_capacity: int | None = None,
                  graphs: bool = False) -> TargetState:
        """A fresh per-sequence state. ``pager``: a KVFlash pager whose pool holds the
        full-attention K/V; ``kv_capacity``: K/V in fixed rows; ``graphs=True`` (needs it): a
        step runner that replays each step shape as a CUDA graph (models/graphs.py)."""
        width = len(self.target_layer_ids) * self.config.hidden_size
        runner = (graph_runner(self.be, kv_capacity, pager, self.store_plan.gdn) if graphs
                  else EagerRunner())  # the state's step runner, chosen here once
        return TargetState(self.store_plan, self.be, width, feature_capacity, feature_window,
                           pager, kv_capacity, runner)

    def embed(self, ids):
        """Token embeddings [T, H] (times the embedding scale for Gemma; docs/conventions.md)."""
        e = self.embed_tokens[self.be.xp.asarray(ids)]
        scale = self.config.embedding_scale
        return e if scale is None else e * self.be.xp.float32(scale)

    def lm_head(self, h):
        """Logits [T, vocab] from final-normed hidden h [T, H], with the final softcap if any."""
        logits = self.be.ops.linear(h, self.lm_head_weight)  # h @ W^T [T, vocab]
        cap = self.config.final_logit_softcapping
        if cap:
            logits = self.be.xp.float32(cap) * self.be.xp.tanh(logits / self.be.xp.float32(cap))
        return logits

    def forward(self, ids, state: TargetState, tap=None, logits_rows=None) -> TargetOutput:
        """Run ``ids`` [T] at positions state.length .. state.length+T-1; update ``state``.

        Returns logits and, with capture layers, features [T, C*hidden]. ``logits_rows``: None
        for every row, or a slice or 1-D index array for exactly ``full[logits_rows]`` [R, vocab],
        only those rows through the lm_head (prefill asks for ``slice(-1, None)``).
        ``tap(layer, name, x)`` sees intermediates ("q", "k", "q_rope", "k_rope", "v"; MoE's
        "router_logits", "experts", "expert_weights"; DecoderLayer's).
        """
        ids = self._check_ids(ids)
        rows = _logits_rows(logits_rows, ids.size)
        pager = state.pager
        if pager is not None and ids.size > pager.chunk_tokens:
            # A span longer than a chunk may evict its own first chunks once the pool is full.
            return forward_pieces(self, ids, state, tap, rows)
        return self._run(state.begin_batch(ids, tap=tap), state, rows)

    def _check_ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.shape[0] == 0:
            raise ValueError("forward needs at least one token")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size})")
        return ids

    def _run(self, batch, state: TargetState, rows=None) -> TargetOutput:
        """One batch's step through the state's step runner, then the batch handed back."""
        logits, features = state.runner.run(batch, rows, partial(self._step, batch, rows))
        state.end_batch(batch, features)
        return TargetOutput(logits=logits, features=features)

    def _step(self, batch, rows):
        """The forward itself: logits [R, vocab] of ``rows`` (None: every row), features."""
        normed, features = self.hidden_states(batch.arrays.ids, batch)  # ids on the backend
        if rows is not None:  # the final norm acts row by row: its rows are the chosen rows'
            normed = normed[rows if isinstance(rows, slice) else self.be.xp.asarray(rows)]
        return self.lm_head(normed), features

    def hidden_states(self, ids, batch):
        """ids [T] -> (final_norm(h_L) [T, H], features [T, C*H] in target_layer_ids order or
        None), every layer run over ``batch``'s stores."""
        h = self.embed(ids)  # [T, H]
        normed, captured = run_stack(self.layers, h, batch, self.target_layer_ids)
        features = None
        if self.target_layer_ids:  # [T, C*H], in target_layer_ids order
            features = self.be.xp.concatenate([captured[i] for i in self.target_layer_ids],
                                              axis=1)
        return normed, features


def _logits_rows(logits_rows, n: int) -> slice | np.ndarray | None:
    """``forward``'s ``logits_rows`` checked: None or a slice as given, else indices in 0..n-1."""
    if logits_rows is None or isinstance(logits_rows, slice):
        return logits_rows
    rows = np.asarray(logits_rows)
    if rows.ndim != 1 or (rows.size and not np.issubdtype(rows.dtype, np.integer)):
        raise ValueError(f"logits_rows must be None, a slice or a 1-D integer array, got "
                         f"{logits_rows!r}")
    rows = rows.astype(np.int64)
    if rows.size and (rows.min() < -n or rows.max() >= n):
        raise ValueError(f"logits_rows {rows.tolist()} index outside the batch's {n} rows")
    return np.where(rows < 0, rows + n, rows)
