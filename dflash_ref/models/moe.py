"""Mixture-of-experts feed-forward blocks: Qwen3.5 MoE and Gemma 4's MoE block.

Both route each token to its top-k experts and sum their gated MLPs, weighted::

    p      = softmax(router_logits)                      # [T, E], float32
    w, e   = top_k(p, k)                                 # [T, k] weights and expert ids
    w      = w / sum(w)                                  # renormalised over the k chosen
                                                         # (Qwen3-Next: only if norm_topk_prob)
    y[t]   = sum_j w[t, j] * down_e(act(gate_e(x[t])) * up_e(x[t]))    with e = e[t, j]

- **Qwen3.5 MoE** (huggingface/transformers ``models/qwen3_5_moe/modeling_qwen3_5_moe.py``,
  ``Qwen3_5MoeSparseMoeBlock``): ``router_logits = x @ gate.T`` on the post-attention-normed x;
  a shared expert is added, gated per token by ``sigmoid(x @ shared_expert_gate.T)``. The block
  replaces the dense MLP.
- **Gemma 4** (``models/gemma4/modeling_gemma4.py``, ``Gemma4TextRouter``,
  ``Gemma4TextDecoderLayer``): the router reads the layer's **residual stream** (not the MLP's
  normed input): ``router_logits = (rms(x) * scale * H^-0.5) @ proj.T`` with a weightless RMS;
  after the top-k renormalisation each weight is multiplied by ``per_expert_scale[e]``. The
  experts read ``pre_feedforward_layernorm_2(x)``; their sum is normed by
  ``post_feedforward_layernorm_2`` and added to the dense MLP's output (normed by
  ``post_feedforward_layernorm_1``) before the layer's ``post_feedforward_layernorm``.

Two implementations of the expert sum, equal up to float reordering:
:func:`experts_reference` loops over tokens and their chosen experts (the equation above, one
token at a time); :func:`experts_grouped` groups the (token, slot) pairs by expert with one
stable argsort and runs one matrix product per expert that was hit, written against the
backend's ``xp`` (no Python loop over tokens; on CuPy each product is a cuBLAS GEMM). The model
uses the grouped form.

Observable through the forward's ``tap(layer, name, x)``: ``"router_logits"`` [T, E] and
``"experts"`` [T, k] (the chosen expert ids, most probable first) and ``"expert_weights"`` [T, k]
(the final weights), so a verify batch shows which experts each draft token made it touch.
"""

from __future__ import annotations

import re

import numpy as np

from dflash_ref.models.gemma import gelu_tanh

_PER_EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def fuse_expert_tensors(weights) -> dict:
    """Stack per-expert tensors ``...experts.{e}.{gate,up,down}_proj.weight`` (what transformers'
    ``save_pretrained`` writes for Qwen3.5 MoE) into the fused ``...experts.gate_up_proj``
    [E, 2I, H] (gate rows first) and ``...experts.down_proj`` [E, H, I]; other names unchanged."""
    groups: dict[str, dict[tuple[str, int], object]] = {}
    out = {}
    for name in weights:
        m = _PER_EXPERT.match(name)
        if m:
            groups.setdefault(m.group(1), {})[(m.group(3), int(m.group(2)))] = weights[name]
        else:
            out[name] = weights[name]
    for prefix, parts in groups.items():
        n = 1 + max(e for _, e in parts)
        gate = [np.asarray(parts[("gate", e)]) for e in range(n)]
        up = [np.asarray(parts[("up", e)]) for e in range(n)]
        out[f"{prefix}.gate_up_proj"] = np.stack([np.concatenate([g, u]) for g, u in zip(gate,
                                                                                      up)])
        out[f"{prefix}.down_proj"] = np.stack([np.asarray(parts[("down", e)]) for e in range(n)])
    return out


def route_top_k(xp, logits, k: int, renormalise: bool = True):
    """Softmax over experts, the k most probable, renormalised: (weights [T, k], ids [T, k]).

    logits [T, E]; ties go to the lower expert id (a stable sort). ``renormalise=False`` keeps
    the k softmax probabilities as they are (Qwen3-Next with ``norm_topk_prob: false``,
    ``Qwen3NextTopKRouter``).
    """
    z = logits - logits.max(axis=-1, keepdims=True)
    p = xp.exp(z)
    p = p / p.sum(axis=-1, keepdims=True)  # [T, E]
    ids = xp.argsort(-p, axis=-1, kind="stable")[:, :k]  # [T, k]
    w = xp.take_along_axis(p, ids, axis=-1)  # [T, k]
    return (w / w.sum(axis=-1, keepdims=True) if renormalise else w), ids


def _expert_mlp(xp, x, gate_up, down, act: str):
    """One expert on rows x [n, H]: gate_up [2I, H] (gate rows first), down [H, I] -> [n, H]."""
    I = down.shape[-1]  # noqa: E741 (the intermediate size, as HF names it)
    gu = x @ gate_up.T  # [n, 2I]
    g, u = gu[:, :I], gu[:, I:]
    a = g / (1.0 + xp.exp(-g)) if act == "silu" else gelu_tanh(xp, g)
    return (a * u) @ down.T


def experts_reference(xp, x, ids, weights, gate_up, down, act: str):
    """The weighted expert sum, token by token (the module docstring's equation).

    x [T, H]; ids, weights [T, k]; gate_up [E, 2I, H]; down [E, H, I] -> [T, H].
    """
    ids_h = np.asarray(ids.get() if hasattr(ids, "get") else ids)
    out = xp.zeros_like(x)
    for t in range(x.shape[0]):
        for j in range(ids_h.shape[1]):
            e = int(ids_h[t, j])
            out[t] += weights[t, j] * _expert_mlp(xp, x[t:t + 1], gate_up[e], down[e], act)[0]
    return out


def experts_grouped(xp, x, ids, weights, gate_up, down, act: str):
    """The same sum with tokens grouped by expert: one GEMM per expert that was hit.

    The T*k (token, slot) pairs are sorted by expert id (stable); expert e's rows are the
    contiguous run ``order[start_e:end_e]``; each result row lands in its pair's slot of
    ``per_pair`` [T*k, H], and ``per_pair.reshape(T, k, H).sum(1)`` adds the k slots of a token.
    """
    T, k = ids.shape
    E = gate_up.shape[0]
    flat = ids.reshape(-1)  # [T*k] expert of each pair
    order = xp.argsort(flat, kind="stable")  # pairs grouped by expert
    counts = np.asarray(xp.bincount(flat, minlength=E).tolist())  # [E] on the host (E numbers)
    ends = np.cumsum(counts)
    per_pair = xp.zeros((T * k, x.shape[1]), dtype=x.dtype)
    for e in np.nonzero(counts)[0]:  # a loop over the experts that were hit, never over tokens
        pairs = order[ends[e] - counts[e]:ends[e]]  # [n_e] pair indices
        rows = x[pairs // k]  # [n_e, H]
        y = _expert_mlp(xp, rows, gate_up[e], down[e], act)
        per_pair[pairs] = y * weights.reshape(-1)[pairs][:, None]
    return per_pair.reshape(T, k, -1).sum(axis=1)  # [T, H]


class QwenSparseMoE:
    """Qwen3.5 MoE block (module docstring): routed experts plus the gated shared expert."""

    def __init__(self, cfg, be, idx: int, w: dict):
        self.be, self.idx, self.k, self.act = be, idx, cfg.moe.num_experts_per_tok, cfg.hidden_act
        self.renormalise = cfg.moe.norm_topk_prob  # always true for Qwen3.5 (config/qwen.py)
        self.router = w["mlp.gate.weight"]  # [E, H]
        self.gate_up, self.down = w["mlp.experts.gate_up_proj"], w["mlp.experts.down_proj"]
        self.shared = None
        if "mlp.shared_expert.gate_proj.weight" in w:
            s = {n: w[f"mlp.shared_expert.{n}_proj.weight"] for n in ("gate", "up", "down")}
            self.shared = (be.xp.concatenate([s["gate"], s["up"]]), s["down"],
                           w["mlp.shared_expert_gate.weight"])  # [2Is, H], [H, Is], [1, H]

    def __call__(self, x, u, batch):
        """u [T, H] (post-attention-normed) -> [T, H] (a feed-forward: x unused)."""
        xp, tap = self.be.xp, batch.tap
        logits = u @ self.router.T  # [T, E]
        weights, ids = route_top_k(xp, logits, self.k, self.renormalise)
        tap(self.idx, "router_logits", logits)
        tap(self.idx, "experts", ids)
        tap(self.idx, "expert_weights", weights)
        y = experts_grouped(xp, u, ids, weights, self.gate_up, self.down, self.act)
        if self.shared is not None:
            gate_up, down, gate = self.shared
            s = _expert_mlp(xp, u, gate_up, down, self.act)
            y = y + s / (1.0 + xp.exp(-(u @ gate.T)))  # sigmoid gate [T, 1]
        return y


class Gemma4MoE:
    """Gemma 4's feed-forward with experts **beside** the dense MLP (module docstring)::

        feed_forward(x, u) = post_feedforward_layernorm_1(mlp(u))
                             + post_feedforward_layernorm_2(experts(pre_feedforward_layernorm_2(x)))

    ``mlp`` is the layer's dense feed-forward; the router and the experts read the residual x.
    """

    def __init__(self, cfg, be, idx: int, w: dict, norm, mlp):
        self.be, self.idx, self.k, self.act = be, idx, cfg.moe.num_experts_per_tok, cfg.hidden_act
        self.eps, self.H, self.mlp = cfg.rms_norm_eps, cfg.hidden_size, mlp
        self.proj, self.scale = w["router.proj.weight"], w["router.scale"]  # [E, H], [H]
        self.per_expert_scale = w["router.per_expert_scale"]  # [E]
        self.gate_up, self.down = w["experts.gate_up_proj"], w["experts.down_proj"]
        self.post_norm_1 = norm("post_feedforward_layernorm_1.weight")
        self.pre_norm = norm("pre_feedforward_layernorm_2.weight")
        self.post_norm = norm("post_feedforward_layernorm_2.weight")

    def __call__(self, x, u, batch):
        """x [T, H] (the residual stream), u = pre_mlp_norm(x) [T, H] -> [T, H]."""
        return self.post_norm_1(self.mlp(x, u, batch)) + self.experts(x, batch.tap)

    def route(self, x, tap):
        """Router on the residual stream x [T, H]: (weights [T, k], ids [T, k])."""
        xp = self.be.xp
        n = x / xp.sqrt((x * x).mean(axis=-1, keepdims=True) + xp.float32(self.eps))
        logits = (n * self.scale * xp.float32(self.H ** -0.5)) @ self.proj.T  # [T, E]
        weights, ids = route_top_k(xp, logits, self.k)
        weights = weights * self.per_expert_scale[ids]
        tap(self.idx, "router_logits", logits)
        tap(self.idx, "experts", ids)
        tap(self.idx, "expert_weights", weights)
        return weights, ids

    def experts(self, x, tap):
        """x [T, H] (the residual stream) -> the normed expert sum [T, H]."""
        weights, ids = self.route(x, tap)
        y = experts_grouped(self.be.xp, self.pre_norm(x), ids, weights, self.gate_up, self.down,
                            self.act)
        return self.post_norm(y)
