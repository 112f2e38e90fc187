"""RoPE: the one rule every RoPE base goes through, and the per-layer-type rotation it feeds.

- :func:`resolve_rope_theta`: per-layer-type entry, nested ``rope_parameters``, top-level
  ``rope_theta``, in that order; never a default (docs/config.md, "The RoPE-base rule").
- :class:`RopeSpec`: theta, type (default / linear / proportional), factor and rotated channels of
  one layer type.
- ``_rope_params`` / ``_rope_scaling``: the rope parameter dict that applies to a layer type,
  from transformers-5 ``rope_parameters`` or the 4.x ``rope_scaling`` block; ``_make_rope``
  validates it into a :class:`RopeSpec`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dflash_ref.config.fields import ROPE_TYPES, _int_list, _is_number
from dflash_ref.errors import ConfigError


def _theta_value(v: Any, key: str, where: str) -> float:
    if not _is_number(v) or not math.isfinite(float(v)) or not float(v) > 0:
        raise ConfigError(f"{where}: {key} must be a positive finite number, got {v!r}.")
    return float(v)


def resolve_rope_theta(cfg: Mapping, where: str = "config.json",
                       layer_type: str | None = None) -> float:
    """The RoPE base of a config dict, by one rule (docs/config.md, "The RoPE-base rule").

    Order, first non-null value wins:

    0. only when ``layer_type`` is given: ``rope_parameters[layer_type].rope_theta`` (the
       transformers-5 dict keyed by layer type, e.g. Gemma 3/4);
    1. ``rope_parameters.rope_theta`` (nested, transformers >= 5);
    2. top-level ``rope_theta`` (4.x-era configs).

    A null value falls through to the next place. A genuine 1e6 is accepted like any other value.
    Missing everywhere is a ConfigError: there is no default, because the converter bug this
    guards against was exactly a silent 1e6 for drafters trained at 1e7.

    Args:
        cfg: one config dict (the text config for multimodal targets).
        where: names the dict in error messages, e.g. "drafter config.json".
        layer_type: look in the per-layer-type entry first.
    Returns:
        theta as a float.
    """
    if not isinstance(cfg, Mapping):
        raise ConfigError(f"{where}: expected a config dict, got {type(cfg).__name__}.")
    rp = cfg.get("rope_parameters")
    if rp is not None and not isinstance(rp, Mapping):
        raise ConfigError(f"{where}: rope_parameters must be a dict, got {rp!r}.")
    if layer_type is not None and rp is not None and isinstance(rp.get(layer_type), Mapping):
        v = rp[layer_type].get("rope_theta")
        if v is not None:
            return _theta_value(v, f"rope_parameters.{layer_type}.rope_theta", where)
    if rp is not None and rp.get("rope_theta") is not None:
        return _theta_value(rp["rope_theta"], "rope_parameters.rope_theta", where)
    if cfg.get("rope_theta") is not None:
        return _theta_value(cfg["rope_theta"], "rope_theta", where)
    looked = "rope_parameters.rope_theta (nested, transformers >= 5) and top-level rope_theta"
    if layer_type is not None:
        looked = f"rope_parameters.{layer_type}.rope_theta, " + looked
    raise ConfigError(
        f"{where}: no RoPE base: {looked} are all missing or null. Add one, e.g. "
        f'"rope_parameters": {{"rope_theta": 10000000.0}} or "rope_theta": 1000000.0, with the '
        f"value the model was trained with. dflash-ref never assumes a default: a silently "
        f"defaulted 1e6 for a 1e7 model runs without error and collapses long-context accuracy.")


@dataclass(frozen=True)
class RopeSpec:
    """RoPE of one layer type (NEOX rotate-half; docs/config.md; z-lab/dflash ``dflash/model.py``).

    - ``rope_type="default"``: ``inv_freq_i = theta^(-2i/rotary_dim)``, i < rotary_dim/2; the
      first ``rotary_dim`` channels of a head are rotated as two halves of ``rotary_dim / 2``
      (``rotate_half_span == rotary_dim``); channels ``rotary_dim..head_dim`` pass through.
      ``dflash_ref.ops.rope.rope(x, pos, theta, rotary_dim)`` is exactly this.
    - ``"linear"``: as default, with every ``inv_freq`` divided by ``factor`` (Gemma 3 global
      layers: factor 8).
    - ``"proportional"`` (Gemma 4 global layers): ``inv_freq_i = theta^(-2i/head_dim)`` for
      ``i < rotary_dim/2`` and 0 for the other ``(head_dim - rotary_dim)/2`` frequencies, divided
      by ``factor``; the rotation pairs channel i with ``i + head_dim/2`` across the whole head
      (``rotate_half_span == head_dim``). Not the same as default partial rotary.

    ``mrope_section`` (Qwen3.5) is recorded for completeness: with text-only positions all three
    M-RoPE streams carry the same position, which reduces to the plain rotation above.
    """

    theta: float
    rope_type: str
    factor: float
    head_dim: int
    partial_rotary_factor: float
    rotary_dim: int
    rotate_half_span: int
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False


def _rope_params(cfg: Mapping, layer_type: str | None) -> Mapping:
    """The rope_parameters entry that applies to ``layer_type`` (keyed dict or flat dict)."""
    rp = cfg.get("rope_parameters")
    if not isinstance(rp, Mapping):
        return {}
    if layer_type is not None and isinstance(rp.get(layer_type), Mapping):
        return rp[layer_type]
    if any(isinstance(v, Mapping) for v in rp.values()):  # keyed dict without this layer type
        return {k: v for k, v in rp.items() if not isinstance(v, Mapping)}
    return rp


def _make_rope(theta: float, params: Mapping, head_dim: int, where: str, *,
               partial_rotary_factor: float = 1.0, allow_proportional: bool = False) -> RopeSpec:
    rope_type = params.get("rope_type") or params.get("type") or "default"
    allowed = ROPE_TYPES if allow_proportional else ROPE_TYPES[:2]
    if rope_type not in allowed:
        raise ConfigError(
            f"{where}: rope_type {rope_type!r} is not supported here; supported: "
            f"{list(allowed)}. (YaRN and the other context-extension schemes are not implemented; "
            f"remove the scaling block to run at the trained context length.)")
    factor = params.get("factor")
    if rope_type == "linear" and factor is None:
        raise ConfigError(f"{where}: rope_type 'linear' needs a 'factor'.")
    factor = 1.0 if factor is None else _theta_value(factor, "rope factor", where)
    if rope_type == "default":
        factor = 1.0
    prf = partial_rotary_factor
    if not 0.0 < prf <= 1.0:
        raise ConfigError(f"{where}: partial_rotary_factor must be in (0, 1], got {prf}.")
    if rope_type == "proportional":
        rotary_dim = 2 * int(prf * head_dim // 2)
        span = head_dim
    else:
        rotary_dim = int(head_dim * prf)
        span = rotary_dim
    if rotary_dim <= 0 or rotary_dim % 2:
        raise ConfigError(f"{where}: head_dim {head_dim} x partial_rotary_factor {prf} gives "
                          f"rotary_dim {rotary_dim}; it must be a positive even number.")
    section = params.get("mrope_section")
    if section is not None:
        section = _int_list(section, "rope_parameters.mrope_section", where)
    return RopeSpec(theta=theta, rope_type=rope_type, factor=factor, head_dim=head_dim,
                    partial_rotary_factor=prf, rotary_dim=rotary_dim, rotate_half_span=span,
                    mrope_section=section,
                    mrope_interleaved=bool(params.get("mrope_interleaved", False)))


def _rope_scaling(d: Mapping) -> Mapping:
    """Flat rope params: rope_parameters (transformers 5) or the 4.x rope_scaling block."""
    params = _rope_params(d, None)
    if params:
        return params
    rs = d.get("rope_scaling")
    if rs is None:
        return {}
    if not isinstance(rs, Mapping):
        raise ConfigError(f"config.json: rope_scaling must be a dict or null, got {rs!r}.")
    return rs
