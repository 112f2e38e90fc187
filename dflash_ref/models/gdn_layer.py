"""The Gated DeltaNet token mixer of Qwen3-Next / Qwen3.5 (``linear_attn``), with decode state
and speculative-decoding rewind (docs/gdn.md).

One layer, for one sequence, written against a :class:`~dflash_ref.backend.Backend`::

    x [T, hidden]                                   (after input_layernorm)
    -> projections           mixed_qkv [T, conv_dim], z [T, HV, dv], b [T, HV], a [T, HV]
    -> causal conv1d + SiLU  on mixed_qkv only (z, a, b bypass it), with the conv state
    -> split                 q, k [T, H, dk]; v [T, HV, dv]
    -> L2-normalise q and k  (eps inside the sqrt by default, as FLA/HF)
    -> gates                 beta = sigmoid(b);  g = -exp(A_log) * softplus(a + dt_bias)
    -> gated delta rule      o [T, HV, dv], from the recurrent state [HV, dk, dv]
    -> gated RMSNorm         per value head over dv, weight w (not 1 + w), gate silu(z)
    -> out_proj              [T, value_dim] -> [T, hidden]

with key_dim = H dk, value_dim = HV dv, conv_dim = 2 key_dim + value_dim, r = HV / H.

Weights are a dict of arrays named as in the HF checkpoint, relative to the layer's
``linear_attn.`` prefix. Two projection layouts exist (docs/gdn.md):

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
[dv] and ``out_proj.weight`` [hidden, value_dim].

Decode state (:class:`GDNState`): the recurrent state [HV, dk, dv] and the conv state
[conv_dim, W - 1] (the last W - 1 raw, pre-conv inputs, oldest first). Nothing else.

Rewind (docs/gdn.md, rollback). A verify batch is ``[x0, d1, ..., dN]``: the last committed token x0
(not yet fed) followed by N drafts. ``forward(..., return_trace=True)`` returns a
:class:`GDNTrace` holding the recurrent state after every batch token and the raw conv inputs.
``rewind(state_before, trace, n_keep)`` returns the state after the first ``n_keep`` batch tokens
(``n_keep = 0`` is ``state_before``); it equals running the layer on those tokens only.
With ``acc`` drafts accepted, keep ``n_keep = acc + 1`` tokens (x0 and d1..d_acc):
``promote(state_before, trace, acc)`` does exactly that. In terms of the HF spec kernel's
``all_states`` (index 0 = before the batch) this is ``all_states[acc + 1]`` = ``trace[acc]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dflash_ref.backend import Backend, as_backend
from dflash_ref.config import GDNDims, gdn_expected_tensors
from dflash_ref.errors import ConfigError, FormatError

LAYOUTS = ("qwen3_next", "qwen3_5")
# GDNConfig.layout -> GDNDims.projection_layout (the names TargetConfig uses).
PROJECTION_LAYOUTS = {"qwen3_next": "qkvz_ba_grouped", "qwen3_5": "qkv_z_b_a"}
SCAN_MODES = ("auto", "recurrent", "chunked")
SOFTPLUS_THRESHOLD = 20.0  # softplus(x) = x above this (FLA ``fla/ops/utils/softplus.py``)


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


@dataclass
class GDNState:
    """Per-sequence decode state of one GDN layer (arrays of the backend that made them).

    recurrent: [HV, dk, dv] float32 (float64 in closed-form tests).
    conv: [conv_dim, W - 1], the last W - 1 raw inputs of the conv, oldest first.
    """

    recurrent: Any
    conv: Any

    def copy(self) -> GDNState:
        return GDNState(self.recurrent.copy(), self.conv.copy())


@dataclass
class GDNTrace:
    """What a traced forward keeps for :meth:`GDNLayer.rewind`.

    recurrent: [T, HV, dk, dv]; ``recurrent[t]`` is the state after batch tokens 0..t.
    conv_inputs: [T, conv_dim], the raw (pre-conv) q/k/v channels of every batch token.
    """

    recurrent: Any
    conv_inputs: Any

    @property
    def num_tokens(self) -> int:
        return int(self.recurrent.shape[0])


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


def rewind_state(state_before: GDNState, trace: GDNTrace, n_keep: int, xp=np) -> GDNState:
    """The state after the first ``n_keep`` tokens of a traced batch (docs/gdn.md, rollback).

    Equals ``GDNLayer.forward(x[:n_keep], state_before)[1]``: the recurrent state is
    ``trace.recurrent[n_keep - 1]``, and the conv state is the last W - 1 columns of
    ``concat(state_before.conv, conv_inputs[:n_keep]^T)``, i.e. columns
    ``[n_keep, n_keep + W - 1)`` of that concatenation. ``n_keep = 0`` returns a copy of
    ``state_before``; ``n_keep = T`` the state the traced forward returned. Needs no weights,
    so a state object can rewind without calling into the model.
    """
    T = trace.num_tokens
    if not 0 <= n_keep <= T:
        raise ValueError(f"GDNLayer.rewind: n_keep={n_keep} outside [0, {T}] for a traced "
                         f"batch of {T} tokens")
    if n_keep == 0:
        return state_before.copy()
    window = xp.concatenate([state_before.conv, trace.conv_inputs[:n_keep].T], axis=1)
    return GDNState(
        recurrent=trace.recurrent[n_keep - 1].copy(),  # [HV, dk, dv]
        conv=xp.ascontiguousarray(window[:, n_keep:]),  # [conv_dim, W - 1]
    )


class GDNLayer:
    """One Qwen3-Next / Qwen3.5 GDN token mixer on a backend (see the module docstring).

    Args:
        cfg: sizes and layout.
        weights: HF tensor names relative to ``linear_attn.`` -> arrays (NumPy or the
            backend's); checked by name and shape (:class:`~dflash_ref.errors.FormatError`).
        backend: "numpy", "cupy", "auto" or a Backend.
    Weights are stored in float32 (float64 kept on NumPy when every weight is float64, for
    closed-form tests).
    """

    def __init__(self, cfg: GDNConfig, weights: Mapping[str, Any],
                 backend: str | Backend = "numpy") -> None:
        self.cfg = cfg
        self.be = as_backend(backend)
        check_weights(weights, cfg)
        all64 = all(np.dtype(getattr(w, "dtype", np.float32)) == np.float64
                    for w in weights.values())
        self.dtype = np.dtype(np.float64 if all64 and self.be.name == "numpy" else np.float32)
        xp = self.be.xp
        w = {name: xp.asarray(self.be.to_backend(arr), dtype=self.dtype)
             for name, arr in weights.items()}
        w["conv1d.weight"] = w["conv1d.weight"].reshape(cfg.conv_dim, cfg.conv_kernel)
        self.w = w
        self.A = -xp.exp(w["A_log"])  # [HV]; GGUF's ssm_a stores this already

    # ------------------------------------------------------------------ state

    def initial_state(self) -> GDNState:
        """Zero recurrent and conv state: the start of a sequence."""
        xp, c = self.be.xp, self.cfg
        return GDNState(
            recurrent=xp.zeros((c.num_v_heads, c.head_k_dim, c.head_v_dim), self.dtype),
            conv=xp.zeros((c.conv_dim, c.conv_kernel - 1), self.dtype),
        )

    # ------------------------------------------------------------------ forward

    def project(self, x):
        """Input projections: x [T, hidden] -> (mixed_qkv [T, conv_dim], z [T, HV, dv],
        b [T, HV], a [T, HV])."""
        c, w = self.cfg, self.w
        T = x.shape[0]
        if c.layout == "qwen3_next":
            qkvz = x @ w["in_proj_qkvz.weight"].T  # [T, H (2 dk + 2 r dv)]
            return split_qkvz_ba(qkvz, x @ w["in_proj_ba.weight"].T, c, self.be.xp)
        mixed = x @ w["in_proj_qkv.weight"].T  # [T, conv_dim], channels [q | k | v]
        z = (x @ w["in_proj_z.weight"].T).reshape(T, c.num_v_heads, c.head_v_dim)
        return mixed, z, x @ w["in_proj_b.weight"].T, x @ w["in_proj_a.weight"].T

    def gates(self, b, a):
        """beta = sigmoid(b) and g = -exp(A_log) * softplus(a + dt_bias), both [T, HV]."""
        xp = self.be.xp
        beta = xp.exp(-xp.logaddexp(0.0, -b))  # sigmoid, overflow-free
        u = a + self.w["dt_bias"]
        softplus = xp.where(u > SOFTPLUS_THRESHOLD, u,
                            xp.log1p(xp.exp(xp.minimum(u, SOFTPLUS_THRESHOLD))))
        return beta, self.A * softplus

    def forward(self, x, state: GDNState | None = None, return_trace: bool = False,
                mode: str = "auto"):
        """Run the layer on T tokens of one sequence.

        Args:
            x: [T, hidden] (the decoder layer's input_layernorm output).
            state: the state before these tokens, or None for the start of a sequence. Not
                modified.
            return_trace: also return a :class:`GDNTrace` for :meth:`rewind` (forces the
                recurrent scan, the only one that yields per-token states).
            mode: "recurrent", "chunked" or "auto" (chunked when T >= chunk_size and no trace).
        Returns:
            ``(y [T, hidden], new_state, trace or None)``.
        """
        if mode not in SCAN_MODES:
            raise ValueError(f"GDNLayer.forward: mode {mode!r} is unknown; expected {SCAN_MODES}")
        be, xp, c = self.be, self.be.xp, self.cfg
        x = xp.asarray(x, dtype=self.dtype)
        if x.ndim != 2 or x.shape[1] != c.hidden_size:
            raise ValueError(f"GDNLayer.forward: x must be [T, hidden={c.hidden_size}], "
                             f"got {tuple(x.shape)}")
        state = self.initial_state() if state is None else state
        T, H, HV, dk, dv = x.shape[0], c.num_k_heads, c.num_v_heads, c.head_k_dim, c.head_v_dim

        mixed, z, b, a = self.project(x)
        conv_out, conv_state = be.ops.causal_conv1d(mixed, self.w["conv1d.weight"], state.conv)
        q = be.ops.l2_norm(conv_out[:, :c.key_dim].reshape(T, H, dk), c.l2_norm_eps,
                           c.l2_norm_mode)  # [T, H, dk]
        k = be.ops.l2_norm(conv_out[:, c.key_dim:2 * c.key_dim].reshape(T, H, dk),
                           c.l2_norm_eps, c.l2_norm_mode)  # [T, H, dk]
        v = conv_out[:, 2 * c.key_dim:].reshape(T, HV, dv)  # [T, HV, dv]
        beta, g = self.gates(b, a)  # [T, HV] each

        trace = None
        if return_trace or mode == "recurrent" or (mode == "auto" and T < c.chunk_size):
            res = be.ops.gdn_recurrent(q, k, v, g, beta, state.recurrent,
                                       return_trace=return_trace)
            o, recurrent = res[0], res[1]
            if return_trace:
                trace = GDNTrace(recurrent=res[2], conv_inputs=mixed)
        else:
            o, recurrent = be.ops.gdn_chunked(q, k, v, g, beta, state.recurrent,
                                              chunk_size=c.chunk_size)

        y = be.ops.gated_rms_norm(o, z, self.w["norm.weight"], c.rms_norm_eps)  # [T, HV, dv]
        out = y.reshape(T, c.value_dim) @ self.w["out_proj.weight"].T  # [T, hidden]
        return out, GDNState(recurrent=recurrent, conv=conv_state), trace

    __call__ = forward

    # ------------------------------------------------------------------ rewind

    def rewind(self, state_before: GDNState, trace: GDNTrace, n_keep: int) -> GDNState:
        """The state after the first ``n_keep`` tokens of a traced batch (:func:`rewind_state`)."""
        return rewind_state(state_before, trace, n_keep, self.be.xp)

    def promote(self, state_before: GDNState, trace: GDNTrace, n_accepted: int) -> GDNState:
        """Rewind after verifying ``[x0, d1..dN]`` with ``n_accepted`` drafts accepted.

        The kept tokens are x0 and d1..d_n_accepted, so this is
        ``rewind(state_before, trace, n_accepted + 1)`` (0 <= n_accepted <= N).
        """
        return self.rewind(state_before, trace, n_accepted + 1)


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

