"""The target model: a causal LM whose forward also captures hidden states for the drafter.

One class serves every supported layout (Qwen3 dense, Qwen3.5 / Qwen3-Next hybrid, Qwen3.5 MoE,
Gemma 3 text, Gemma 4 text: dense, PLE + KV sharing, MoE; docs/target.md, "Families"), read
from a Hugging Face directory (``config.json`` + ``*.safetensors``, sharded or not) with HF
tensor names, or from a llama.cpp GGUF (not yet for Gemma 4 or MoE). The forward is written
once against a Backend::

    h = embed(ids)                          # [T, H] (Gemma: times its embedding scale)
    u = input_norm_0(h)                     # each layer is handed its normed input
    for layer in layers:                    # models/layers.py: norm, mixer, residual, norm, MLP
        h, u = layer(h, u, batch)           # u: the next layer's input norm of h (final last)
        if layer in target_layer_ids: capture h
    logits = lm_head(u)                     # [T, vocab] (Gemma: final softcap)

The layers are assembled once from the config, each family's components chosen there
(models/assemble.py), and so is each component's form: each residual add fused into the norm
after it and each attention layer's q/k norms and RoPE one ``qk_norm_rope`` op where they allow
it (models/fused.py; docs/backend.md, "Fused ops"), equal to the reference form (``fused=()``)
bit for bit on NumPy.

Feature capture: with ``target_layer_ids = [i0, i1, ...]`` (HF numbering) the forward returns,
per token, ``concat(h_i0, h_i1, ...)`` where ``h_i`` is the raw residual stream **after** decoder
layer i (HF ``hidden_states[i + 1]``), un-normed. GGUF stacks that store ``i + 1`` mean the same
layer: "input of layer i + 1" == "output of layer i" (docs/conventions.md, "Layer ids").

State: a :class:`~dflash_ref.models.state.TargetState` from :meth:`TargetModel.new_state` holds
the KV caches (or the KVFlash pool), GDN states and captured features; ``model.forward(ids,
state)`` appends ``ids`` at positions ``state.length ..``, so prefill, decode and verify batches
are all this one call, whose step runs through the state's step runner (``state.runner``).
Commit and rollback are the state's (``state.rollback``, ``state.commit_path``).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from dflash_ref.backend import Backend, as_backend
from dflash_ref.config import TargetConfig, expected_tensors
from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.compare import check_finite_weights
from dflash_ref.io.safetensors_io import check_tensor_shapes, load_checkpoint
from dflash_ref.models.assemble import FUSED_OPS, decoder_layers
from dflash_ref.models.batch import forward_batch
from dflash_ref.models.graphs import graph_runner
from dflash_ref.models.layers import RMSNorm, run_stack
from dflash_ref.models.moe import fuse_expert_tensors
from dflash_ref.models.output import TargetOutput
from dflash_ref.models.state import EagerRunner, StorePlan, TargetState


class TargetModel:
    """A causal LM target (see the module docstring). Construct with :meth:`from_pretrained`.

    ``fused``: the fused ops its layers use (:data:`~dflash_ref.models.assemble.FUSED_OPS`, the
    default: each residual add with the norm after it, each attention layer's q/k norms with its
    RoPE); ``()`` builds the reference form, with the same results (what the tests compare).
    """

    def __init__(self, config: TargetConfig, weights: dict, backend="numpy",
                 target_layer_ids=None, fused=FUSED_OPS):
        _check_supported(config)
        self.config = config
        self.be: Backend = as_backend(backend)
        self.target_layer_ids: list[int] = []
        self.set_target_layer_ids(target_layer_ids)
        weights = fuse_expert_tensors(weights) if config.moe is not None else weights
        self._check_weights(weights)
        xp = self.be.xp
        w = {name: xp.asarray(arr, dtype=xp.float32) for name, arr in weights.items()}
        p = config.weight_prefix
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

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_pretrained(cls, path, backend="numpy", target_layer_ids=None,
                        embedding_scale=None, check_finite: bool = False,
                        fused=FUSED_OPS) -> TargetModel:
        """Load ``config.json`` + ``*.safetensors`` (single or sharded) from directory ``path``.

        ``embedding_scale`` (Gemma only): None follows HF, sqrt(hidden_size) rounded to the
        checkpoint's ``torch_dtype`` (HF casts its normaliser to the dtype it computes in); a
        dtype name or a number overrides (:meth:`TargetConfig.with_embedding_scale
        <dflash_ref.config.TargetConfig.with_embedding_scale>`; docs/conventions.md).
        ``check_finite``: refuse weights holding NaN or inf, naming the tensors
        (:func:`~dflash_ref.io.compare.check_finite_weights`). ``fused``: as for the class.
        """
        path = Path(path)
        cfg_path = path / "config.json"
        if not cfg_path.exists():
            raise FormatError(f"{path} has no config.json; expected a Hugging Face model directory")
        config = TargetConfig.from_file(cfg_path)  # a malformed file is named in the error
        config = config.with_embedding_scale(embedding_scale)
        weights = load_checkpoint(path)
        if check_finite:
            check_finite_weights(weights, path)
        config = _match_weight_prefix(config, weights)
        return cls(config, weights, backend=backend, target_layer_ids=target_layer_ids,
                   fused=fused)

    @classmethod
    def from_gguf(cls, path, backend="numpy", target_layer_ids=None,
                  embedding_scale=None, check_finite: bool = False,
                  fused=FUSED_OPS) -> TargetModel:
        """Load a llama.cpp GGUF of arch ``qwen3``, ``qwen35`` or ``gemma3`` (a path, or a file
        already opened with :func:`~dflash_ref.io.gguf_io.open_gguf`).

        :func:`~dflash_ref.io.convert_target.read_gguf_target` undoes what llama.cpp's converter
        baked in (the +1 of (1+w) norms, ``ssm_a = -exp(A_log)``, the tiled GDN value heads) and
        dequantizes, so the forward is the safetensors one up to the storage error. Keys the
        file lacks take llama.cpp's values, each listed in ``config.defaults_used``.

        ``embedding_scale`` (Gemma only): None follows llama.cpp, whose format this is: the
        unrounded float32 ``sqrtf(n_embd)`` (25.298 for the 640-wide 270M, not HF's bf16 25.25);
        a dtype name or a number overrides (docs/conventions.md). ``check_finite``: refuse
        dequantized weights holding NaN or inf, naming the tensors. ``fused``: as for the class.
        """
        from dflash_ref.io.convert_target import read_gguf_target
        from dflash_ref.io.llama_cpp_defaults import LLAMA_CPP_DEFAULTS_KEY

        config_dict, weights = read_gguf_target(path)
        if check_finite:
            check_finite_weights(weights, path)
        config = TargetConfig.from_hf(config_dict)
        taken = tuple(config_dict.get(LLAMA_CPP_DEFAULTS_KEY, ()))
        config = replace(config, defaults_used=config.defaults_used + taken)
        config = config.with_embedding_scale(embedding_scale)
        return cls(config, weights, backend=backend, target_layer_ids=target_layer_ids,
                   fused=fused)

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
                  feature_window: int | None = None, pager=None, kv_capacity: int | None = None,
                  graphs: bool = False) -> TargetState:
        """A fresh per-sequence state (empty caches; features captured if layer ids are set).

        ``pager``: a :class:`~dflash_ref.kvflash.pager.KVFlashPager`; the full-attention layers
        then keep K/V in its bounded pool (it is attached and reset here, once per sequence).
        ``kv_capacity``: K/V in that many fixed rows (positions 0..kv_capacity-1) instead of
        growing caches; ``graphs=True`` (needs it) gives the state a step runner that captures
        each decode / verify (and draft) step shape as one CUDA graph and replays it
        (models/graphs.py); ``graphs=False`` runs every step eagerly.
        """
        width = len(self.target_layer_ids) * self.config.hidden_size
        runner = (graph_runner(self.be, kv_capacity, pager, self.store_plan.gdn) if graphs
                  else EagerRunner())  # the state's step runner, chosen here once
        return TargetState(self.store_plan, self.be, width, feature_capacity, feature_window,
                           pager, kv_capacity, runner)

    def attention_qk(self, ids, n_tail: int = 8, rope: bool = False, layers=None,
                     piece_tokens: int = 256) -> tuple[np.ndarray, np.ndarray]:
        """Tail queries and all keys of ``ids`` for the KVFlash scorer.

        See :func:`dflash_ref.models.qk_probe.attention_qk`, which this calls.
        """
        from dflash_ref.models.qk_probe import attention_qk

        return attention_qk(self, ids, n_tail=n_tail, rope=rope, layers=layers,
                            piece_tokens=piece_tokens)

    # ------------------------------------------------------------------ pieces the drafter shares

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

    def final_norm_apply(self, h):
        """The final norm of the last layer's output h [T, H] -> [T, H]."""
        return self.final_rms_norm(h)

    # ------------------------------------------------------------------ forward

    def forward(self, ids, state: TargetState, tap=None, logits_rows=None) -> TargetOutput:
        """Run ``ids`` [T] at positions state.length .. state.length+T-1; update ``state``.

        Returns logits and, when capture layers are set, features [T, C*hidden] (every row).
        ``logits_rows`` chooses the logits rows: None (default) returns all of them, [T, vocab];
        a slice or a 1-D integer index array (into 0..T-1) returns exactly those rows of that
        result, ``full[logits_rows]`` [R, vocab], and only those rows go through the lm_head
        (the final norm, fused into the last layer's add, runs on every row). Prefill asks for
        ``slice(-1, None)``: a 4k-token prompt on a 262k vocabulary would otherwise build a 4 GB
        float32 matrix to read one row of it.
        ``tap(layer, name, x)``, if given, sees intermediate tensors (the attention layers' q/k
        before and after RoPE and v: names "q", "k", "q_rope", "k_rope", "v"; MoE layers'
        "router_logits" [T, E], "experts" [T, k], "expert_weights" [T, k]); the KVFlash
        scorer's Q/K probe is one.
        """
        ids = self._check_ids(ids)
        rows = _logits_rows(logits_rows, ids.size)
        pager = state.pager
        if pager is not None and ids.size > pager.chunk_tokens:
            # A span longer than a chunk may evict its own first chunks once the pool is full:
            # run it one chunk-aligned piece at a time, as the public pooled prefill does.
            return self._forward_pieces(ids, state, tap, rows)
        return self._run(state.begin_batch(ids, tap=tap), state, rows)

    def forward_tree(self, ids, parents, state: TargetState) -> TargetOutput:
        """Verify a draft tree in one pass (docs/spec_decode.md, DDTree).

        Node i (token ``ids[i]``, parent ``parents[i]`` < i, -1 for the root) sits at position
        ``state.length + depth(i)`` and sees the committed prefix and its own ancestors only
        (:func:`~dflash_ref.ops.masks.tree_mask`); GDN layers run each node from its parent's
        state. The state is left pending: call ``state.commit_path(path)`` with the accepted
        node indices (root first) to keep exactly that branch.

        Returns logits [n, vocab] and features [n, C*hidden] (None without capture), node order.
        """
        ids = self._check_ids(ids)
        parents = np.asarray(parents, dtype=np.int64).reshape(-1)
        if parents.shape[0] != ids.shape[0]:
            raise ValueError("forward_tree: ids and parents must have the same length")
        if parents.size and (parents[0] != -1 or np.any(parents[1:] >= np.arange(1, parents.size))
                             or np.any(parents[1:] < 0)):
            raise ValueError("forward_tree: parents must be [-1, p1, p2, ...] with 0 <= p_i < i "
                             "(one root, node 0, topologically ordered)")
        return self._run(state.begin_batch(ids, parents=parents), state)

    def forward_batch(self, ids_list, states: list[TargetState], tap=None) -> list:
        """Several sequences in one forward, each appended to its own state (ragged; one
        output per sequence): :func:`dflash_ref.models.batch.forward_batch`."""
        return forward_batch(self, ids_list, states, tap)

    def _check_ids(self, ids) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.shape[0] == 0:
            raise ValueError("forward needs at least one token")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.config.vocab_size})")
        return ids

    def _run(self, batch, state: TargetState, rows=None) -> TargetOutput:
        """One batch: its step (:meth:`_step`) through the state's step runner, then the batch
        handed back to the state.

        ``rows``: None, a slice (prefill's last row: no index upload) or an integer index
        array: the logits rows to compute."""
        logits, features = state.runner.run(batch, rows, partial(self._step, batch, rows))
        state.end_batch(batch, features)
        return TargetOutput(logits=logits, features=features)

    def _step(self, batch, rows):
        """The forward itself (module docstring) over ``batch``'s arrays and stores: logits
        [R, vocab] of the chosen ``rows`` (every row for None) and features [T, C*H] (or
        None)."""
        normed, features = self.hidden_states(batch.arrays.ids, batch)  # ids on the backend
        if rows is not None:  # the final norm acts row by row: its rows are the chosen rows'
            normed = normed[rows if isinstance(rows, slice) else self.be.xp.asarray(rows)]
        return self.lm_head(normed), features

    def hidden_states(self, ids, batch):
        """Embed ``ids`` [T] and run every decoder layer over ``batch``'s stores.

        Returns the final-normed last hidden state ``final_norm(h)`` [T, H] (the lm_head's input)
        and the captured features [T, C*H] in target_layer_ids order (None without capture
        layers). The last layer hands over the final norm of its output (fused into its add by
        default, so it runs on every row). Shared by the single-sequence forward and the ragged
        one (models/batch.py).
        """
        h = self.embed(ids)  # [T, H]
        normed, captured = run_stack(self.layers, h, batch, self.target_layer_ids)
        features = None
        if self.target_layer_ids:  # [T, C*H], in target_layer_ids order
            features = self.be.xp.concatenate([captured[i] for i in self.target_layer_ids],
                                              axis=1)
        return normed, features

    def _forward_pieces(self, ids, state: TargetState, tap, rows=None) -> TargetOutput:
        """Forward ``ids`` in chunk-aligned pieces through the pager; outputs concatenated."""
        xp, T = self.be.xp, state.pager.chunk_tokens
        if isinstance(rows, slice):  # each piece computes its own rows: as indices
            rows = np.arange(ids.size)[rows]
        cuts = [0]
        while cuts[-1] < ids.size:
            pos = state.length + cuts[-1]
            cuts.append(min(ids.size, cuts[-1] + T - pos % T))
        need = None if rows is None else np.unique(rows)  # sorted; each piece computes its own
        outs = [self._run(state.begin_batch(ids[a:b], tap=tap), state,
                          None if need is None else need[(need >= a) & (need < b)] - a)
                for a, b in zip(cuts, cuts[1:])]
        feats = (None if outs[0].features is None
                 else xp.concatenate([o.features for o in outs], axis=0))
        logits = xp.concatenate([o.logits for o in outs], axis=0)
        if need is not None:  # back to the caller's order (and repeats)
            logits = logits[xp.asarray(np.searchsorted(need, rows))]
        return TargetOutput(logits=logits, features=feats)


def _logits_rows(logits_rows, n: int) -> slice | np.ndarray | None:
    """``forward``'s ``logits_rows`` checked: None (every row) or a slice as given, else an index
    array into 0..n-1."""
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
    if cfg.moe is not None and cfg.family == "qwen3_next":
        problems.append(f"Qwen3-Next mixture-of-experts MLPs ({cfg.moe.num_experts} experts; "
                        f"the block is implemented and checked for Qwen3.5 MoE and Gemma 4 only)")
    if cfg.attention_bias:
        problems.append("attention_bias")
    if cfg.hidden_act not in ("silu", "gelu_pytorch_tanh"):
        problems.append(f"hidden_act {cfg.hidden_act!r} (silu and gelu_pytorch_tanh are)")
    for i in range(cfg.num_hidden_layers):
        if cfg.layer_types[i] != "linear_attention" and cfg.rope_for(i).rope_type not in (
                "default", "linear", "proportional"):
            problems.append(f"rope_type {cfg.rope_for(i).rope_type!r} (layer {i})")
            break
    if problems:
        raise ConfigError(
            f"{cfg.family} target uses features the reference model does not implement: "
            f"{'; '.join(problems)}. Supported: Qwen3 dense, Qwen3.5 / Qwen3-Next dense-MLP "
            f"hybrids, Qwen3.5 MoE, Gemma 3 text, Gemma 4 text (dense, PLE + KV sharing, MoE)."
        )
