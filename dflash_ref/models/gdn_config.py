"""The sizes and weight layouts of one Gated DeltaNet layer (docs/gdn.md, "The layer").

:class:`GDNConfig` holds the sizes (HF names in comments), validated on construction. Weights
are a dict of arrays named as in the HF checkpoint, relative to the layer's ``linear_attn.``
prefix. Two projection layouts exist (docs/gdn.md):

- ``layout="qwen3_next"`` (Qwen3-Next): ``in_proj_qkvz.weight`` [2 key_dim + 2 value_dim, hidden]
  and ``in_proj_ba.weight`` [2 HV, hidden], **grouped per key head**: the output of in_proj_qkvz,
  viewed as [H, 2 dk + 2 r dv], holds for each key head h the block
  ``q_h (dk) | k_h (dk) | v_h (r dv) | z_h (r dv)``, where v_h and z_h are value heads
  h r .. h r + r - 1 (grouped order); in_proj_ba viewed as [H, 2 r] holds ``b_h (r) | a_h (r)``.
  See :func:`split_qkvz_ba`.
- ``layout="qwen3_5"`` (Qwen3.5): ``in_proj_qkv.weight`` [conv_dim, hidden] already in channel
  order [all q | all k | all v], ``in_proj_z.weight`` [value_dim, hidden],
  ``in_proj_b.weight`` and ``in_proj_a.weight`` [HV, hidden].

Both use ``conv1d.weight`` [conv_dim, 1, W], ``dt_bias`` [HV], ``A_log`` [HV], ``norm.weight``
[dv] and ``out_proj.weight`` [hidden, value_dim]. :func:`check_weights` checks a dict against
the layout by name and shape; the layer itself is :class:`~dflash_ref.models.gdn_layer.GDNLayer`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dflash_ref.config import GDNDims, gdn_expected_tensors
from dflash_ref.errors import ConfigError, FormatError

LAYOUTS = ("qwen3_next", "qwen3_5")
# GDNConfig.layout -> GDNDims.projection_layout (the names TargetConfig uses).
PROJECTION_LAYOUTS = {"qwen3_next": "qkvz_ba_grouped", "qwen3_5": "qkv_z_b_a"}


@dataclass(frozen=True)
class GDNConfig:
    """Sizes of one GDN layer (HF names in comments); validated on construction."""

    hidden_size: int  # hidden_size
    num_k_heads: int  # linear_num_key_heads (H)
    num_v_heads: int  # linear_num_value_heads (HV)
    head_k_dim: int  # linear_key_head_dim (dk)
    head_v_dim: int  # linear_value_head_dim (dv)
    conv_kernel: int = 4  # linear_conv_kernel_dim (W)
    rms_norm_eps: float = 1e-6  # rms_norm_eps (the gated norm's eps)
    layout: str = "qwen3_5"  # "qwen3_next" (in_proj_qkvz / in_proj_ba) or "qwen3_5"
    l2_norm_eps: float = 1e-6  # q/k L2 norm eps (FLA / HF use 1e-6)
    l2_norm_mode: str = "sqrt_eps"  # "sqrt_eps" (FLA, HF) or "floor" (ggml)
    chunk_size: int = 64  # chunk size of the chunked scan

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim",
                     "conv_kernel", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ConfigError(f"GDNConfig.{name} must be a positive integer, got {value!r}")
        if self.num_v_heads % self.num_k_heads:
            raise ConfigError(
                f"GDNConfig: num_v_heads={self.num_v_heads} must be a multiple of "
                f"num_k_heads={self.num_k_heads} (each key head serves r = HV / H value heads)"
            )
        if self.layout not in LAYOUTS:
            raise ConfigError(f"GDNConfig.layout {self.layout!r} is unknown; expected one of "
                              f"{LAYOUTS} (qwen3_next: in_proj_qkvz/in_proj_ba; qwen3_5: "
                              f"in_proj_qkv/in_proj_z/in_proj_b/in_proj_a)")
        if self.l2_norm_mode not in ("sqrt_eps", "floor"):
            raise ConfigError(f"GDNConfig.l2_norm_mode {self.l2_norm_mode!r} is unknown; "
                              f"expected 'sqrt_eps' (FLA/HF) or 'floor' (ggml)")

    @classmethod
    def from_hf(cls, config: Mapping[str, Any], layout: str | None = None) -> GDNConfig:
        """From a HF ``config.json`` dict (Qwen3-Next / Qwen3.5 text config).

        ``layout`` defaults to "qwen3_next" when ``model_type`` starts with "qwen3_next", else
        "qwen3_5"; pass it explicitly when unsure (or use :func:`infer_layout` on the weights).
        """
        keys = ("hidden_size", "linear_num_key_heads", "linear_num_value_heads",
                "linear_key_head_dim", "linear_value_head_dim")
        missing = [key for key in keys if key not in config]
        if missing:
            raise ConfigError(f"config.json lacks {missing}, needed for a GDN layer")
        if layout is None:
            layout = ("qwen3_next" if str(config.get("model_type", "")).startswith("qwen3_next")
                      else "qwen3_5")
        return cls(
            hidden_size=config["hidden_size"],
            num_k_heads=config["linear_num_key_heads"],
            num_v_heads=config["linear_num_value_heads"],
            head_k_dim=config["linear_key_head_dim"],
            head_v_dim=config["linear_value_head_dim"],
            conv_kernel=config.get("linear_conv_kernel_dim", 4),
            rms_norm_eps=config.get("rms_norm_eps", 1e-6),
            layout=layout,
        )

    @property
    def ratio(self) -> int:
        """r = HV / H: value heads per key head."""
        return self.num_v_heads // self.num_k_heads

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the short conv: q, k and v."""
        return 2 * self.key_dim + self.value_dim

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Tensor name (relative to ``linear_attn.``) -> shape, for this layout: the schema of
        :func:`dflash_ref.config.schema.gdn_expected_tensors`, from these sizes."""
        dims = GDNDims(num_key_heads=self.num_k_heads, num_value_heads=self.num_v_heads,
                       key_head_dim=self.head_k_dim, value_head_dim=self.head_v_dim,
                       conv_kernel_dim=self.conv_kernel,
                       projection_layout=PROJECTION_LAYOUTS[self.layout])
        return gdn_expected_tensors(dims, self.hidden_size)


def infer_layout(weights: Mapping[str, Any]) -> str:
    """"qwen3_next" if the weights have ``in_proj_qkvz.weight``, "qwen3_5" if ``in_proj_qkv``."""
    if "in_proj_qkvz.weight" in weights:
        return "qwen3_next"
    if "in_proj_qkv.weight" in weights:
        return "qwen3_5"
    raise FormatError(
        f"cannot tell the GDN projection layout: neither 'in_proj_qkvz.weight' (Qwen3-Next) nor "
        f"'in_proj_qkv.weight' (Qwen3.5) is among {sorted(weights)}; names must be relative to "
        f"the layer's 'linear_attn.' prefix"
    )


def split_qkvz_ba(qkvz, ba, cfg: GDNConfig, xp=np):
    """Split Qwen3-Next's grouped projections (docs/gdn.md); ``xp`` is numpy or cupy.

    Args:
        qkvz: [T, H * (2 dk + 2 r dv)], the output of in_proj_qkvz.
        ba: [T, H * 2 r], the output of in_proj_ba.
    Returns:
        ``(mixed_qkv, z, b, a)``: mixed_qkv [T, conv_dim] in channel order
        [q (H dk) | k (H dk) | v (HV dv)]; z [T, HV, dv]; b, a [T, HV]. Value head index
        ``h r + j`` comes from sub-head j of key head h (grouped).
    """
    T = qkvz.shape[0]
    H, r, dk, dv = cfg.num_k_heads, cfg.ratio, cfg.head_k_dim, cfg.head_v_dim
    grouped = qkvz.reshape(T, H, 2 * dk + 2 * r * dv)  # per key head: q | k | v (r dv) | z (r dv)
    q = grouped[:, :, :dk]  # [T, H, dk]
    k = grouped[:, :, dk:2 * dk]  # [T, H, dk]
    v = grouped[:, :, 2 * dk:2 * dk + r * dv]  # [T, H, r dv] -> value heads h r .. h r + r - 1
    z = grouped[:, :, 2 * dk + r * dv:]  # [T, H, r dv]
    ba_g = ba.reshape(T, H, 2 * r)  # per key head: b (r) | a (r)
    b = ba_g[:, :, :r].reshape(T, H * r)  # [T, HV]
    a = ba_g[:, :, r:].reshape(T, H * r)  # [T, HV]
    mixed = xp.concatenate(
        [q.reshape(T, H * dk), k.reshape(T, H * dk), v.reshape(T, H * r * dv)], axis=1)
    return mixed, z.reshape(T, H * r, dv), b, a


def qkvz_ba_to_separate(weights: Mapping[str, Any], cfg: GDNConfig) -> dict[str, Any]:
    """Qwen3-Next projection weights -> the Qwen3.5 separate layout (rows permuted, no math).

    NumPy arrays in and out (a load-time conversion).

    Returns a new dict where ``in_proj_qkvz.weight`` / ``in_proj_ba.weight`` are replaced by
    ``in_proj_qkv.weight``, ``in_proj_z.weight``, ``in_proj_b.weight``, ``in_proj_a.weight``; the
    other tensors are passed through. A layer built from either gives the same outputs.
    """
    wq = np.asarray(weights["in_proj_qkvz.weight"])  # [H (2 dk + 2 r dv), hidden]
    wba = np.asarray(weights["in_proj_ba.weight"])  # [H 2 r, hidden]
    hidden = wq.shape[1]
    # Weight rows are output channels, so splitting the rows is splitting the outputs:
    # treat the [out, hidden] matrix as a batch of hidden "tokens" transposed.
    mixed, z, b, a = split_qkvz_ba(wq.T, wba.T, cfg)  # [hidden, ...]
    out = {name: w for name, w in weights.items()
           if name not in ("in_proj_qkvz.weight", "in_proj_ba.weight")}
    out["in_proj_qkv.weight"] = np.ascontiguousarray(mixed.T)  # [conv_dim, hidden]
    out["in_proj_z.weight"] = np.ascontiguousarray(z.reshape(hidden, cfg.value_dim).T)
    out["in_proj_b.weight"] = np.ascontiguousarray(b.T)  # [HV, hidden]
    out["in_proj_a.weight"] = np.ascontiguousarray(a.T)
    return out


def check_weights(weights: Mapping[str, Any], cfg: GDNConfig) -> None:
    """Raise :class:`FormatError` naming any missing, unexpected or wrong-shaped tensor."""
    expected = cfg.expected_shapes()
    missing = [name for name in expected if name not in weights]
    if missing:
        other = "qwen3_5" if cfg.layout == "qwen3_next" else "qwen3_next"
        hint = ""
        try:
            if infer_layout(weights) == other:
                hint = f"; these weights use the {other!r} layout: set GDNConfig(layout={other!r})"
        except FormatError:
            pass
        raise FormatError(
            f"GDN layer weights: missing {', '.join(repr('linear_attn.' + n) for n in missing)} "
            f"(expected shapes {[expected[n] for n in missing]}) for layout {cfg.layout!r}{hint}"
        )
    unexpected = sorted(set(weights) - set(expected))
    if unexpected:
        raise FormatError(
            f"GDN layer weights: unexpected tensors {unexpected} for layout {cfg.layout!r}; "
            f"expected exactly {sorted(expected)} (names relative to 'linear_attn.')"
        )
    for name, shape in expected.items():
        found = tuple(weights[name].shape)
        ok = found == shape or (name == "conv1d.weight" and found == (shape[0], shape[2]))
        if not ok:
            raise FormatError(
                f"GDN layer weights: 'linear_attn.{name}' has shape {found}, expected {shape} "
                f"(hidden={cfg.hidden_size}, H={cfg.num_k_heads}, HV={cfg.num_v_heads}, "
                f"dk={cfg.head_k_dim}, dv={cfg.head_v_dim}, W={cfg.conv_kernel}, "
                f"layout {cfg.layout!r})"
            )
