"""Independent float64 forwards of Gemma 4 text and the Qwen3.5 MoE block, written for the tests.

Straight from the equations of huggingface/transformers
``src/transformers/models/gemma4/modeling_gemma4.py`` and
``src/transformers/models/qwen3_5_moe/modeling_qwen3_5_moe.py``, reading the config dict and the
tensors as ``save_pretrained`` writes them (per-expert Qwen tensors, fused Gemma experts). Full-
sequence attention with explicit masks, one token at a time through the experts; nothing from
``dflash_ref`` is imported. Returns the HF ``hidden_states`` convention (``hs[0]`` embeddings,
``hs[i + 1]`` raw output of layer i) and the logits.
"""

from __future__ import annotations

import math

import numpy as np


def _rms(x, w=None, eps=1e-6):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def _gelu(g):
    return 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))


def _rope_full_head(x, pos, inv_freq):
    """x [T, h, d]; inv_freq [d/2] (zeros pass through); HF rotate_half over the whole head."""
    ang = pos[:, None].astype(np.float64) * inv_freq[None, :]  # [T, d/2]
    ang = np.concatenate([ang, ang], axis=1)[:, None, :]
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * np.cos(ang) + rot * np.sin(ang)


def _inv_freq(params, d):
    """Default RoPE over d, or proportional: theta^(-2i/d) for i < int(prf d // 2), then zeros."""
    theta = params["rope_theta"]
    if params.get("rope_type") == "proportional":
        a = int(params.get("partial_rotary_factor", 1.0) * d // 2)
        rot = 1.0 / theta ** (np.arange(0, 2 * a, 2) / d)
        return np.concatenate([rot, np.zeros(d // 2 - a)])
    return 1.0 / theta ** (np.arange(0, d, 2) / d)


def _attend(q, k, v, visible):
    """q [T, nh, d], k/v [S, nkv, d], visible [T, S] bool; scale 1 (Gemma 4)."""
    nh, nkv = q.shape[1], k.shape[1]
    o = np.zeros_like(q)
    for h in range(nh):
        s = q[:, h] @ k[:, h // (nh // nkv)].T
        s = np.where(visible, s, -np.inf)
        p = np.exp(s - s.max(1, keepdims=True))
        o[:, h] = (p / p.sum(1, keepdims=True)) @ v[:, h // (nh // nkv)]
    return o


def gemma4_forward(c: dict, tensors: dict, ids) -> tuple[list, np.ndarray]:
    """Gemma 4 text (Gemma4ForCausalLM) in float64; see the module docstring."""
    W = {k: np.asarray(v, np.float64) for k, v in tensors.items()}
    eps, H, n = c["rms_norm_eps"], c["hidden_size"], c["num_hidden_layers"]
    types, nh = c["layer_types"], c["num_attention_heads"]
    plc = {int(k): v for k, v in (c.get("per_layer_config") or {}).items()}
    ids = np.asarray(ids)
    T = len(ids)
    pos = np.arange(T)
    causal = pos[None, :] <= pos[:, None]
    window = causal & (pos[:, None] - pos[None, :] < c["sliding_window"])
    first_shared = n - (c.get("num_kv_shared_layers") or 0)
    x = W["model.embed_tokens.weight"][ids] * math.sqrt(H)
    hs = [x]
    P = c.get("hidden_size_per_layer_input") or 0
    if P:
        tok = W["model.embed_tokens_per_layer.weight"][ids].reshape(T, n, P) * math.sqrt(P)
        ctx = (x @ W["model.per_layer_model_projection.weight"].T / math.sqrt(H)).reshape(T, n, P)
        ple = (_rms(ctx, W["model.per_layer_projection_norm.weight"], eps) + tok) / math.sqrt(2)
    kv_of_type = {}
    for i in range(n):
        L, t = f"model.layers.{i}.", types[i]
        d = plc.get(i, {}).get("head_dim", c["head_dim"])
        nkv = plc.get(i, {}).get("num_key_value_heads", c["num_key_value_heads"])
        inv = _inv_freq(c["rope_parameters"][t], d)
        u = _rms(x, W[L + "input_layernorm.weight"], eps)
        q = _rms((u @ W[L + "self_attn.q_proj.weight"].T).reshape(T, nh, d),
                 W[L + "self_attn.q_norm.weight"], eps)
        q = _rope_full_head(q, pos, inv)
        if i >= first_shared:  # KV sharing: the last earlier layer of this type
            k, v = kv_of_type[t]
        else:
            k_raw = (u @ W[L + "self_attn.k_proj.weight"].T).reshape(T, nkv, d)
            v_name = L + "self_attn.v_proj.weight"
            v_raw = (u @ W[v_name].T).reshape(T, nkv, d) if v_name in W else k_raw
            k = _rope_full_head(_rms(k_raw, W[L + "self_attn.k_norm.weight"], eps), pos, inv)
            v = _rms(v_raw, None, eps)
            kv_of_type[t] = (k, v)
        o = _attend(q, k, v, window if t == "sliding_attention" else causal)
        a = o.reshape(T, nh * d) @ W[L + "self_attn.o_proj.weight"].T
        x = x + _rms(a, W[L + "post_attention_layernorm.weight"], eps)
        u = _rms(x, W[L + "pre_feedforward_layernorm.weight"], eps)
        m = (_gelu(u @ W[L + "mlp.gate_proj.weight"].T) * (u @ W[L + "mlp.up_proj.weight"].T)
             ) @ W[L + "mlp.down_proj.weight"].T
        if c.get("enable_moe_block"):
            m = _rms(m, W[L + "post_feedforward_layernorm_1.weight"], eps) + _gemma4_experts(
                c, W, L, x, eps)
        x = x + _rms(m, W[L + "post_feedforward_layernorm.weight"], eps)
        if P:
            g = _gelu(x @ W[L + "per_layer_input_gate.weight"].T) * ple[:, i]
            x = x + _rms(g @ W[L + "per_layer_projection.weight"].T,
                         W[L + "post_per_layer_input_norm.weight"], eps)
        x = x * W[L + "layer_scalar"]
        hs.append(x)
    logits = _rms(x, W["model.norm.weight"], eps) @ W["model.embed_tokens.weight"].T
    cap = c.get("final_logit_softcapping")
    return hs, (cap * np.tanh(logits / cap) if cap else logits)


def _gemma4_experts(c, W, L, x, eps):
    """Router on the residual x, top-k renormalised times per_expert_scale, experts on
    pre_feedforward_layernorm_2(x), their sum normed by post_feedforward_layernorm_2."""
    H, k = c["hidden_size"], c["top_k_experts"]
    r = _rms(x, None, eps) * W[L + "router.scale"] / math.sqrt(H) @ W[L + "router.proj.weight"].T
    p = np.exp(r - r.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    u = _rms(x, W[L + "pre_feedforward_layernorm_2.weight"], eps)
    gu, down = W[L + "experts.gate_up_proj"], W[L + "experts.down_proj"]
    F = down.shape[-1]
    out = np.zeros_like(x)
    for t in range(x.shape[0]):
        top = np.argsort(-p[t])[:k]
        w = p[t, top] / p[t, top].sum() * W[L + "router.per_expert_scale"][top]
        for e, we in zip(top, w):
            h = gu[e] @ u[t]
            out[t] += we * (down[e] @ (_gelu(h[:F]) * h[F:]))
    return _rms(out, W[L + "post_feedforward_layernorm_2.weight"], eps)


def qwen35_moe_block(c: dict, W: dict, L: str, u):
    """Qwen3.5 MoE block on the post-attention-normed u [T, H]: softmax over the gate's logits,
    top-k renormalised, per-expert SwiGLU, plus sigmoid(u @ shared_expert_gate) x shared expert."""
    W = {k: np.asarray(v, np.float64) for k, v in W.items() if k.startswith(L + "mlp.")}
    M = L + "mlp."

    def swiglu(prefix, row):
        g, up = W[prefix + "gate_proj.weight"] @ row, W[prefix + "up_proj.weight"] @ row
        return W[prefix + "down_proj.weight"] @ (g / (1 + np.exp(-g)) * up)

    r = u @ W[M + "gate.weight"].T
    p = np.exp(r - r.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    out = np.zeros_like(u)
    for t in range(u.shape[0]):
        top = np.argsort(-p[t])[:c["num_experts_per_tok"]]
        for e, we in zip(top, p[t, top] / p[t, top].sum()):
            out[t] += we * swiglu(f"{M}experts.{e}.", u[t])
        gate = 1 / (1 + np.exp(-(W[M + "shared_expert_gate.weight"] @ u[t])))
        out[t] += gate * swiglu(M + "shared_expert.", u[t])
    return out
