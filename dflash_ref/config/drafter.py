"""DrafterConfig: a DFlash drafter's config.json (z-lab or transformers-assistant layout), the
key-visibility rule of each layer (:class:`KeyVisibility`), and the checks against a target
(:meth:`DrafterConfig.validate_against`).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from dflash_ref.config.drafter_keys import (
    _dflash2_sizes,
    _dflash_value,
    _draft_vocab_size,
    _drafter_kind,
    _drafter_layout,
    _drafter_swa,
    _head_keys,
    _pos_int,
    build_target_layer_ids,
)
from dflash_ref.config.fields import (
    FULL,
    SLIDING,
    SWA_CONVENTIONS,
    _Fields,
    _int_list,
    _is_int,
    _read_json,
)
from dflash_ref.config.rope import (
    RopeSpec,
    _make_rope,
    _rope_params,
    _rope_scaling,
    _theta_value,
    resolve_rope_theta,
)
from dflash_ref.config.target import TargetConfig
from dflash_ref.errors import ConfigError


@dataclass(frozen=True)
class KeyVisibility:
    """Which keys a drafter noise query sees in one layer, by absolute positions.

    A key at k is visible from a query at q iff
    ``(max_back is None or q - k <= max_back) and (max_ahead is None or k - q <= max_ahead)``.
    Context keys always lie before the block, so only max_back can hide them; noise keys are hidden
    by ``max_ahead`` (0 = causal within the block) or, for huge blocks, by the window.
    """

    max_back: int | None
    max_ahead: int | None

    def visible(self, q: int, k: int) -> bool:
        if self.max_back is not None and q - k > self.max_back:
            return False
        return self.max_ahead is None or k - q <= self.max_ahead


@dataclass(frozen=True)
class DrafterConfig:
    """A DFlash drafter config (docs/config.md, "DrafterConfig"; z-lab/dflash ``dflash/model.py``).

    Two layouts: ``"zlab"`` (z-lab ``DFlashDraftModel`` checkpoints: ``fc`` / ``hidden_norm``
    tensors, DFlash keys at the top level or under ``dflash_config``) and ``"hf_assistant"``
    (transformers-native assistant models such as ``muse_glimmer_assistant``: ``encoder.fc`` /
    ``encoder.output_norm_enc``, keys at the top level, all layers sliding by default, window
    2048).

    Attention in sliding layers follows ``swa_convention`` (see :meth:`visibility` and
    docs/config.md): ``"causal_block"`` (default for zlab: the z-lab reference, vLLM and lucebox),
    ``"noncausal_window"``, ``"bidirectional"`` (default for hf_assistant) or ``"ignore"``.
    ``causal_override`` (``is_causal`` / ``dflash_config.causal``) sets causality for every layer.

    ``kind`` is "dflash", "dspark" (models/dspark.py) or "dflash2" (``DFlash2DraftModel``:
    ``dflash2`` holds conv_kernel_size, conv_group_size, selector_rank, selector_top_k).
    ``output_multiplier`` and ``final_logit_softcapping`` are the release's draft-head keys
    (docs/drafter.md, "Head"). ``draft_vocab_size`` Vd (None: the target's full head) is a
    reduced draft vocabulary: the drafter's own ``lm_head.weight`` [Vd, H] and ``d2t``
    (docs/drafter.md, "A reduced draft vocabulary").
    """

    layout: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    hidden_act: str
    rms_norm_eps: float
    vocab_size: int | None
    attention_bias: bool
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    target_layer_ids_source: str
    num_target_layers: int | None
    layer_types: tuple[str, ...]
    sliding_window: int | None
    swa_convention: str
    causal_override: bool | None
    rope_by_type: Mapping[str, RopeSpec]
    input_embedding_scale: float | None
    attention_sink_bias: bool
    max_position_embeddings: int | None
    defaults_used: tuple[str, ...] = ()
    raw: Mapping = field(default_factory=dict, repr=False, compare=False)
    kind: str = "dflash"
    dflash2: Mapping[str, int] | None = None
    output_multiplier: float | None = None
    final_logit_softcapping: float | None = None
    draft_vocab_size: int | None = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_hf(cls, config: Mapping, *, layout: str | None = None,
                swa_convention: str | None = None) -> DrafterConfig:
        """Parse a drafter ``config.json`` dict.

        Args:
            config: the drafter's config.json.
            layout: "zlab" or "hf_assistant"; detected when None (``dflash_config`` or a
                ``DFlashDraftModel`` architecture -> zlab; a ``*_assistant`` model_type or
                ``*AssistantModel`` architecture -> hf_assistant).
            swa_convention: one of :data:`SWA_CONVENTIONS`; None picks the layout's default.
        """
        if not isinstance(config, Mapping):
            raise ConfigError(f"drafter config: expected a dict parsed from config.json, got "
                              f"{type(config).__name__}.")
        where = "drafter config.json"
        layout = _drafter_layout(config, layout, where)
        dc = config.get("dflash_config")
        if dc is not None and not isinstance(dc, Mapping):
            raise ConfigError(f"{where}: dflash_config must be a dict, got {dc!r}.")
        f = _Fields(config, where)
        hidden = f.int("hidden_size")
        n_layers = f.int("num_hidden_layers")
        n_heads, n_kv = f.head_counts()
        head_dim = f.int("head_dim")
        hidden_act = f.str("hidden_act", "silu", choices=("silu",))

        block_size, _ = _dflash_value(config, where, "block_size", "draft_block_size")
        if block_size is None:
            raise ConfigError(f"{where}: block_size is missing (looked for dflash_config."
                              f"block_size and top-level block_size); it is the number of tokens "
                              f"per draft block (16 for the published drafters).")
        block_size = _pos_int(block_size, "block_size", where)
        mask_id, _ = _dflash_value(config, where, "mask_token_id")
        if mask_id is None:
            raise ConfigError(f"{where}: mask_token_id is missing (looked for dflash_config."
                              f"mask_token_id and top level); it is the target-vocabulary id whose "
                              f"embedding row fills the block (151669 for Qwen3, 248070 for "
                              f"Qwen3.5).")
        mask_id = _pos_int(mask_id, "mask_token_id", where, minimum=0)
        vocab = f.int("vocab_size", None)
        if vocab is not None and mask_id >= vocab:
            raise ConfigError(f"{where}: mask_token_id {mask_id} is outside vocab_size {vocab}.")

        n_target, _ = _dflash_value(config, where, "num_target_layers", "n_target_layers")
        n_target = None if n_target is None else _pos_int(n_target, "num_target_layers", where)
        ids, ids_key = _dflash_value(config, where, "target_layer_ids",
                                     "aux_hidden_state_layer_ids")
        if ids is not None:
            ids = _int_list(ids, ids_key, where)
            if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
                raise ConfigError(f"{where}: {ids_key} must be distinct non-negative layer ids, "
                                  f"got {list(ids)}.")
            if n_target is not None and max(ids) >= n_target:
                raise ConfigError(f"{where}: {ids_key} {list(ids)} reaches layer {max(ids)} but "
                                  f"num_target_layers is {n_target}.")
            source = "config"
        elif n_target is not None:
            ids = tuple(build_target_layer_ids(n_target, n_layers))
            source = "formula"
        else:
            raise ConfigError(f"{where}: no target_layer_ids and no num_target_layers, so the "
                              f"captured target layers are unknown. Add dflash_config."
                              f"target_layer_ids, or num_target_layers for the default formula "
                              f"(docs/config.md, \"target_layer_ids\").")

        layer_types, window = _drafter_swa(config, f, layout, n_layers, where)
        causal, _ = _dflash_value(config, where, "causal", "is_causal")
        if causal is not None and not isinstance(causal, bool):
            raise ConfigError(f"{where}: is_causal / dflash_config.causal must be true or false, "
                              f"got {causal!r}.")
        if swa_convention is None:
            swa_convention = "bidirectional" if layout == "hf_assistant" else "causal_block"
        elif swa_convention not in SWA_CONVENTIONS:
            raise ConfigError(f"swa_convention {swa_convention!r} is unknown; choose one of "
                              f"{SWA_CONVENTIONS} (docs/config.md explains each).")

        rope = {}
        for t in dict.fromkeys(layer_types):
            theta = resolve_rope_theta(config, where, layer_type=t)
            rope[t] = _make_rope(theta, _rope_params(config, t) or _rope_scaling(config),
                                 head_dim, where)
        scale, _ = _dflash_value(config, where, "input_embedding_scale")
        if scale is not None:
            scale = _theta_value(scale, "input_embedding_scale", where)
        sink, _ = _dflash_value(config, where, "attention_sink_bias")
        kind = _drafter_kind(config, where)
        sizes = _dflash2_sizes(config, where, hidden, vocab) if kind == "dflash2" else None
        multiplier, softcap = _head_keys(config, where)
        draft_vocab = _draft_vocab_size(config, where, kind, vocab)
        return cls(
            layout=layout, hidden_size=hidden, num_hidden_layers=n_layers,
            num_attention_heads=n_heads, num_key_value_heads=n_kv, head_dim=head_dim,
            intermediate_size=f.int("intermediate_size"), hidden_act=hidden_act,
            rms_norm_eps=f.float("rms_norm_eps"), vocab_size=vocab,
            attention_bias=f.bool("attention_bias", False), block_size=block_size,
            mask_token_id=mask_id, target_layer_ids=ids, target_layer_ids_source=source,
            num_target_layers=n_target, layer_types=layer_types, sliding_window=window,
            swa_convention=swa_convention, causal_override=causal,
            rope_by_type=MappingProxyType(rope), input_embedding_scale=scale,
            attention_sink_bias=bool(sink), max_position_embeddings=f.int(
                "max_position_embeddings", None),
            defaults_used=tuple(f.defaults_used), raw=MappingProxyType(dict(config)),
            kind=kind, dflash2=None if sizes is None else MappingProxyType(sizes),
            output_multiplier=multiplier, final_logit_softcapping=softcap,
            draft_vocab_size=draft_vocab)

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kwargs: Any) -> DrafterConfig:
        """:meth:`from_hf` on a config.json file, or on the config.json inside a directory."""
        return cls.from_hf(_read_json(path, "drafter"), **kwargs)

    # ------------------------------------------------------------------ queries

    @property
    def n_capture(self) -> int:
        """C: captured target layers; the fc input width is C * hidden_size."""
        return len(self.target_layer_ids)

    @property
    def fc_name(self) -> str:
        return "encoder.fc.weight" if self.layout == "hf_assistant" else "fc.weight"

    @property
    def hidden_norm_name(self) -> str:
        return ("encoder.output_norm_enc.weight" if self.layout == "hf_assistant"
                else "hidden_norm.weight")

    def rope_theta_for(self, layer_idx: int) -> float:
        return self.rope_by_type[self._layer_type(layer_idx)].theta

    @property
    def rope_theta(self) -> float:
        """The RoPE base, when every layer shares one (all published drafters)."""
        thetas = {r.theta for r in self.rope_by_type.values()}
        if len(thetas) != 1:
            raise ConfigError(f"drafter layer types use different RoPE bases {sorted(thetas)}; "
                              f"ask rope_theta_for(layer_idx).")
        return thetas.pop()

    def _layer_type(self, layer_idx: int) -> str:
        if not _is_int(layer_idx) or not 0 <= layer_idx < self.num_hidden_layers:
            raise IndexError(f"drafter layer {layer_idx} out of range "
                             f"0..{self.num_hidden_layers - 1}")
        return self.layer_types[layer_idx]

    def is_causal_for(self, layer_idx: int) -> bool:
        """Whether noise queries of this layer are causal within the block.

        ``causal_override`` wins for every layer. Otherwise only sliding layers under
        "causal_block" are causal; full layers are non-causal (docs/drafter.md, "Sliding-window
        drafter layers"; z-lab/dflash ``dflash/model.py``).
        """
        t = self._layer_type(layer_idx)
        if self.causal_override is not None:
            return self.causal_override
        return t == SLIDING and self.swa_convention == "causal_block"

    def visibility(self, layer_idx: int) -> KeyVisibility:
        """The key-visibility rule of one layer (absolute positions; W = sliding_window).

        ===================  ====================================  ==========================
        convention           sliding layer: max_back / max_ahead   default causality
        ===================  ====================================  ==========================
        causal_block         W - 1 / (0 if causal else W - 1)      sliding causal
        noncausal_window     W - 1 / (0 if causal else W - 1)      non-causal
        bidirectional        W / (0 if causal else W)              non-causal
        ignore               None / (0 if causal else None)        non-causal
        ===================  ====================================  ==========================

        Full layers: max_back None, max_ahead 0 if causal else None.
        """
        causal = self.is_causal_for(layer_idx)
        ahead_if_open = None
        back = None
        if self.layer_types[layer_idx] == SLIDING and self.swa_convention != "ignore":
            w = self.sliding_window
            back = w if self.swa_convention == "bidirectional" else w - 1
            ahead_if_open = back
        return KeyVisibility(max_back=back, max_ahead=0 if causal else ahead_if_open)

    def noise_embedding_scale(self, target: TargetConfig) -> float:
        """Scale for the block's embedding rows: the drafter's input_embedding_scale if the
        config gives one, else the target's embedding scale (Gemma: bf16-rounded sqrt(H);
        docs/drafter.md), else 1.0."""
        if self.input_embedding_scale is not None:
            return self.input_embedding_scale
        return 1.0 if target.embedding_scale is None else target.embedding_scale

    # ------------------------------------------------------------------ validation

    def validate_against(self, target: TargetConfig,
                         fc_shape: Sequence[int] | None = None) -> DrafterConfig:
        """Check this drafter fits ``target`` (and its ``fc`` weight); return the config to use.

        Checks: equal hidden size and vocabulary (the drafter borrows the target's embedding and
        lm_head); every target_layer_id inside the target and not its last layer (HF's last
        hidden state is the final-normed one); mask_token_id inside the target vocabulary; the fc
        weight [H, C*H]. Shapes are ground truth: when fc implies another capture count C than
        the config and the ids came from the default formula, the ids are recomputed for C with a
        warning; explicit ids that disagree with fc are an error.

        Returns:
            self, or a corrected copy (use the return value).
        """
        where = "drafter vs target"
        if self.hidden_size != target.hidden_size:
            raise ConfigError(f"{where}: drafter hidden_size {self.hidden_size} != target "
                              f"hidden_size {target.hidden_size}. The drafter reuses the target's "
                              f"embedding and lm_head, so they must match: use the drafter "
                              f"trained for this target.")
        if self.vocab_size is not None and self.vocab_size != target.vocab_size:
            raise ConfigError(f"{where}: drafter vocab_size {self.vocab_size} != target "
                              f"vocab_size {target.vocab_size}; the drafter predicts over the "
                              f"target's vocabulary, so pair it with the target it was trained "
                              f"for.")
        if self.mask_token_id >= target.vocab_size:
            raise ConfigError(f"{where}: mask_token_id {self.mask_token_id} is outside the "
                              f"target vocabulary ({target.vocab_size}); fix dflash_config."
                              f"mask_token_id.")
        n = target.num_hidden_layers
        cfg = self
        if self.num_target_layers is not None and self.num_target_layers != n:
            msg = (f"{where}: the drafter was configured for a {self.num_target_layers}-layer "
                   f"target (num_target_layers) but the target has {n} layers")
            if self.target_layer_ids_source == "formula":
                raise ConfigError(msg + "; the default target_layer_ids depend on it, so this "
                                  "pairing is wrong (or add explicit target_layer_ids).")
            warnings.warn(msg + "; the explicit target_layer_ids are used.", stacklevel=2)
        if fc_shape is not None:
            cfg = cfg._reconcile_fc(fc_shape, n)
        bad = [i for i in cfg.target_layer_ids if i >= n]
        if bad:
            raise ConfigError(f"{where}: target_layer_ids {list(cfg.target_layer_ids)} include "
                              f"{bad}, beyond the target's layers 0..{n - 1}; this drafter "
                              f"belongs to a deeper target.")
        if n - 1 in cfg.target_layer_ids:
            raise ConfigError(f"{where}: target_layer_ids include the last layer {n - 1}. HF's "
                              f"hidden_states entry for it is the final-normed output, not the "
                              f"raw layer output dflash-ref captures (docs/target.md, \"Which "
                              f"hidden state is captured\"); the ids are probably shifted by "
                              f"one (GGUF '+1' ids?).")
        return cfg

    def _reconcile_fc(self, fc_shape: Sequence[int], n_target: int) -> DrafterConfig:
        if (not isinstance(fc_shape, Sequence) or len(fc_shape) != 2
                or not all(_is_int(x) and x > 0 for x in fc_shape)):
            raise ConfigError(f"fc weight shape must be two positive ints [H, C*H], got "
                              f"{fc_shape!r}.")
        out_dim, in_dim = (int(x) for x in fc_shape)
        H = self.hidden_size
        if out_dim != H:
            raise ConfigError(f"{self.fc_name} has {out_dim} output rows but hidden_size is {H}; "
                              f"the weight is [H, C*H] (PyTorch [out, in]) - is it transposed, or "
                              f"from another drafter?")
        if in_dim % H:
            raise ConfigError(f"{self.fc_name} input width {in_dim} is not a multiple of "
                              f"hidden_size {H}; it must be C*H for C captured layers.")
        c_w = in_dim // H
        if c_w == self.n_capture:
            return self
        if self.target_layer_ids_source == "config":
            raise ConfigError(f"{self.fc_name} [{out_dim}, {in_dim}] implies {c_w} captured "
                              f"layers but target_layer_ids lists {self.n_capture} "
                              f"({list(self.target_layer_ids)}); which layers to tap cannot be "
                              f"derived from the weight. Fix target_layer_ids in the config.")
        n_t = self.num_target_layers if self.num_target_layers is not None else n_target
        ids = tuple(build_target_layer_ids(n_t, c_w))
        warnings.warn(f"{self.fc_name} [{out_dim}, {in_dim}] implies {c_w} captured layers, not "
                      f"{self.n_capture} from the default formula with num_hidden_layers; the "
                      f"weight wins: target_layer_ids = {list(ids)}.", stacklevel=3)
        return replace(self, target_layer_ids=ids, target_layer_ids_source="fc_shape")

    # ------------------------------------------------------------------ summary

    def describe(self) -> str:
        """A short human summary (for ``dflash-ref inspect``)."""
        counts = {t: self.layer_types.count(t) for t in (FULL, SLIDING) if t in self.layer_types}
        mix = " + ".join(f"{n} {t}" for t, n in counts.items())
        if len({r.theta for r in self.rope_by_type.values()}) == 1:
            thetas = f"{self.rope_theta:g}"
        else:
            thetas = ", ".join(f"{t} {r.theta:g}" for t, r in self.rope_by_type.items())
        lines = [
            f"{ {'dflash2': 'DFlash 2', 'dspark': 'DSpark'}.get(self.kind, 'DFlash')} drafter "
            f"({self.layout} layout): "
            f"{self.num_hidden_layers} layers ({mix}), "
            f"hidden {self.hidden_size}, ffn {self.intermediate_size}",
            f"  attention: {self.num_attention_heads} q / {self.num_key_value_heads} kv heads x "
            f"{self.head_dim}; rope theta {thetas}",
            f"  block {self.block_size}, mask id {self.mask_token_id}, captures "
            f"{list(self.target_layer_ids)} ({self.target_layer_ids_source}), fc "
            f"[{self.hidden_size}, {self.n_capture * self.hidden_size}]",
        ]
        if SLIDING in self.layer_types:
            lines.append(f"  sliding window {self.sliding_window}, convention "
                         f"{self.swa_convention}")
        if self.causal_override is not None:
            lines.append(f"  causal override: {self.causal_override} (all layers)")
        if self.input_embedding_scale is not None:
            lines.append(f"  input embedding scale {self.input_embedding_scale:g}")
        if self.draft_vocab_size is not None:
            lines.append(f"  draft vocabulary {self.draft_vocab_size} of {self.vocab_size} "
                         f"(own lm_head, d2t)")
        if self.dflash2 is not None:
            lines.append("  DFlash 2: " + ", ".join(f"{k} {v}" for k, v in self.dflash2.items()))
        if self.defaults_used:
            lines.append("  defaults used: " + "; ".join(self.defaults_used))
        return "\n".join(lines)
