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

Sizes and the two projection layouts (Qwen3-Next's grouped in_proj_qkvz / in_proj_ba, Qwen3.5's
separate in_proj_qkv / z / b / a) live in :mod:`dflash_ref.models.gdn_config`, re-exported here.

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

Tree verify (docs/gdn.md, "Tree verify: every node in one pass"): :meth:`GDNLayer.forward_tree`
runs the layer once over all n nodes of a draft tree, node i from its parent's state, and
returns every node's state (:class:`GDNTreeStates`); the accepted path keeps its last node's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from dflash_ref.backend import Backend, as_backend
from dflash_ref.models.gdn_config import (
    LAYOUTS,
    PROJECTION_LAYOUTS,
    GDNConfig,
    check_weights,
    infer_layout,
    qkvz_ba_to_separate,
    split_qkvz_ba,
)
from dflash_ref.models.layers import Projections

__all__ = ["LAYOUTS", "PROJECTION_LAYOUTS", "SCAN_MODES", "GDNConfig", "GDNLayer", "GDNState",
           "GDNTrace", "GDNTreeStates", "check_weights", "infer_layout", "qkvz_ba_to_separate",
           "rewind_state", "split_qkvz_ba"]

SCAN_MODES = ("auto", "recurrent", "chunked")


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


@dataclass
class GDNTreeStates:
    """Every node's state after a tree forward (:meth:`GDNLayer.forward_tree`).

    recurrent: [n, HV, dk, dv]; ``recurrent[i]`` is the state after the root-to-i path.
    conv: [n, conv_dim, W - 1]; ``conv[i]`` the last W - 1 raw inputs of that path, oldest first.
    """

    recurrent: Any
    conv: Any

    def node(self, i: int) -> GDNState:
        """The state after node ``i`` (a copy: the [n, ...] buffers can be dropped)."""
        return GDNState(self.recurrent[i].copy(), self.conv[i].copy())


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
        names = (("in_proj_qkvz", "in_proj_ba") if cfg.layout == "qwen3_next" else
                 ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a"))
        self.in_proj = Projections.stacked(self.be, w, [f"{n}.weight" for n in names])
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
        c = self.cfg
        T = x.shape[0]
        if c.layout == "qwen3_next":  # qkvz [T, H (2 dk + 2 r dv)], ba: one product
            return split_qkvz_ba(*self.in_proj(x), c, self.be.xp)
        # x @ W^T for in_proj_qkv ([T, conv_dim], channels [q | k | v]), _z, _b, _a: one product
        mixed, z, b, a = self.in_proj(x)
        return mixed, z.reshape(T, c.num_v_heads, c.head_v_dim), b, a

    def gates(self, b, a):
        """beta = sigmoid(b) and g = -exp(A_log) * softplus(a + dt_bias), both [T, HV]: the
        ``gdn_gates`` op (its docstring has the rule)."""
        return self.be.ops.gdn_gates(b, a, self.A, self.w["dt_bias"])

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
        be, c = self.be, self.cfg
        x = self._check_x(x, "forward")
        state = self.initial_state() if state is None else state
        T = x.shape[0]

        mixed, z, b, a = self.project(x)
        conv_out, conv_state = be.ops.causal_conv1d(mixed, self.w["conv1d.weight"], state.conv)
        q, k, v = self.split_qkv(conv_out)
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

        return self.output(o, z), GDNState(recurrent=recurrent, conv=conv_state), trace

    __call__ = forward

    def forward_tree(self, x, state: GDNState | None, parents):
        """Run the layer once over the n nodes of a draft tree (docs/gdn.md, "Tree verify:
        every node in one pass").

        Node i (parent ``parents[i]`` < i, -1 for a root) sees exactly what it would see if its
        root-to-node path were run by :meth:`forward` from ``state``: the projections, the L2
        norms, the gates, the gated norm and out_proj act row by row on all nodes at once; the
        conv reads each node's ancestors (``causal_conv1d_tree``) and the recurrence steps each
        node from its parent's state (``gdn_tree_recurrent``).

        Args:
            x: [n, hidden] (node order); state: the committed state, or None for the start of
                a sequence (not modified); parents: [n] host integers, -1 <= parents[i] < i.
        Returns:
            ``(y [n, hidden], node_states)``: :class:`GDNTreeStates`, the state after each node.
        """
        be = self.be
        x = self._check_x(x, "forward_tree")
        state = self.initial_state() if state is None else state
        mixed, z, b, a = self.project(x)
        conv_out, conv_states = be.ops.causal_conv1d_tree(mixed, self.w["conv1d.weight"],
                                                          state.conv, parents)
        q, k, v = self.split_qkv(conv_out)
        beta, g = self.gates(b, a)  # [n, HV] each
        o, recurrent = be.ops.gdn_tree_recurrent(q, k, v, g, beta, state.recurrent, parents)
        return self.output(o, z), GDNTreeStates(recurrent=recurrent, conv=conv_states)

    def split_qkv(self, conv_out):
        """Conv output [T, conv_dim] -> L2-normalised q, k [T, H, dk] and v [T, HV, dv]."""
        c, ops = self.cfg, self.be.ops
        T, H, dk = conv_out.shape[0], c.num_k_heads, c.head_k_dim
        qk = ops.l2_norm(conv_out[:, :2 * c.key_dim].reshape(T, 2 * H, dk), c.l2_norm_eps,
                         c.l2_norm_mode)  # q's heads, then k's: [T, 2H, dk], each row normed
        v = conv_out[:, 2 * c.key_dim:].reshape(T, c.num_v_heads, c.head_v_dim)  # [T, HV, dv]
        return qk[:, :H], qk[:, H:], v  # q, k [T, H, dk]

    def output(self, o, z):
        """Gated RMSNorm and out_proj: o, z [T, HV, dv] -> [T, hidden]."""
        c = self.cfg
        y = self.be.ops.gated_rms_norm(o, z, self.w["norm.weight"], c.rms_norm_eps)  # [T, HV, dv]
        return self.be.ops.linear(y.reshape(o.shape[0], c.value_dim),
                                  self.w["out_proj.weight"])  # y @ W^T [T, hidden]

    def _check_x(self, x, op: str):
        """x as a [T, hidden] array of the layer's dtype on its backend."""
        x = self.be.xp.asarray(x, dtype=self.dtype)
        if x.ndim != 2 or x.shape[1] != self.cfg.hidden_size:
            raise ValueError(f"GDNLayer.{op}: x must be [T, hidden={self.cfg.hidden_size}], "
                             f"got {tuple(x.shape)}")
        return x

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
