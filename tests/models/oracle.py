"""Independent float64 forwards of the targets (Qwen3, Gemma 3, Qwen3.5 dense or MoE) and the
drafter, written for the tests (Gemma 4 and the MoE blocks: tests/models/oracle_gemma4_moe.py).

It re-derives the HF computation directly from the config dict and the tensor dict, with explicit
loops over heads and full-sequence attention (no cache, no ops from dflash_ref), and returns the
HF ``hidden_states`` tuple convention: ``hs[0]`` = embeddings, ``hs[i + 1]`` = raw output of layer
i, plus the logits. It shares no code with dflash_ref.models.target.
"""

from __future__ import annotations

import math

import numpy as np

from tests.models.oracle_gemma4_moe import qwen35_moe_block


def _rms(x, w, eps, offset):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (offset + w)


def _rope(x, pos, theta, factor=1.0):
    # x [T, h, d]; NEOX halves; float64 throughout (angles in float32 as HF, then float64 trig).
    d = x.shape[-1]
    inv = (1.0 / (np.float32(theta) ** (np.arange(0, d, 2).astype(np.float32) / np.float32(d))))
    inv = (inv.astype(np.float32) / np.float32(factor)).astype(np.float32)
    ang = (pos.astype(np.float32)[:, None] * inv[None, :]).astype(np.float64)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def dense_forward(config: dict, tensors: dict, ids) -> tuple[list, np.ndarray]:
    """Return (hidden_states list of [T, H], logits [T, V]) for a qwen3 or gemma3_text config."""
    W = {k: v.astype(np.float64) for k, v in tensors.items()}
    gemma = config["model_type"].startswith("gemma3")
    off = 1.0 if gemma else 0.0
    eps = config["rms_norm_eps"]
    H, nh, nkv, d = (config[k] for k in ("hidden_size", "num_attention_heads",
                                         "num_key_value_heads", "head_dim"))
    ids = np.asarray(ids)
    T = len(ids)
    pos = np.arange(T)
    x = W["model.embed_tokens.weight"][ids]
    if gemma:
        x = x * np.float64(np.float32(math.sqrt(H)))  # float32 checkpoint: sqrt(H) in float32
    hs = [x]
    for i in range(config["num_hidden_layers"]):
        L = f"model.layers.{i}."
        u = _rms(x, W[L + "input_layernorm.weight"], eps, off)
        q = (u @ W[L + "self_attn.q_proj.weight"].T).reshape(T, nh, d)
        k = (u @ W[L + "self_attn.k_proj.weight"].T).reshape(T, nkv, d)
        v = (u @ W[L + "self_attn.v_proj.weight"].T).reshape(T, nkv, d)
        q = _rms(q, W[L + "self_attn.q_norm.weight"], eps, off)
        k = _rms(k, W[L + "self_attn.k_norm.weight"], eps, off)
        sliding = gemma and config["layer_types"][i] == "sliding_attention"
        theta = config["rope_local_base_freq"] if sliding else config["rope_theta"]
        # HF rope_scaling {"rope_type": "linear", "factor": f} divides every inv_freq by f; Gemma 3
        # applies it to the global (full-attention) rotary embedding only.
        scaling = config.get("rope_scaling") or {}
        linear = scaling.get("rope_type", scaling.get("type")) == "linear" and not sliding
        factor = float(scaling["factor"]) if linear else 1.0
        q, k = _rope(q, pos, theta, factor), _rope(k, pos, theta, factor)
        scale = config["query_pre_attn_scalar"] ** -0.5 if gemma else d ** -0.5
        o = np.zeros((T, nh, d))
        for h in range(nh):
            kh = h // (nh // nkv)
            for t in range(T):
                keys = [j for j in range(T) if j <= t
                        and (not sliding or t - j < config["sliding_window"])]
                s = np.array([q[t, h] @ k[j, kh] for j in keys]) * scale
                p = np.exp(s - s.max())
                p /= p.sum()
                o[t, h] = sum(pj * v[j, kh] for pj, j in zip(p, keys))
        a = o.reshape(T, nh * d) @ W[L + "self_attn.o_proj.weight"].T
        if gemma:
            a = _rms(a, W[L + "post_attention_layernorm.weight"], eps, off)
            x = x + a
            u = _rms(x, W[L + "pre_feedforward_layernorm.weight"], eps, off)
        else:
            x = x + a
            u = _rms(x, W[L + "post_attention_layernorm.weight"], eps, off)
        g = u @ W[L + "mlp.gate_proj.weight"].T
        up = u @ W[L + "mlp.up_proj.weight"].T
        if gemma:
            act = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
        else:
            act = g / (1 + np.exp(-g))
        m = (act * up) @ W[L + "mlp.down_proj.weight"].T
        if gemma:
            m = _rms(m, W[L + "post_feedforward_layernorm.weight"], eps, off)
        x = x + m
        hs.append(x)
    xn = _rms(x, W["model.norm.weight"], eps, off)
    head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
    logits = xn @ head.T
    cap = config.get("final_logit_softcapping")
    if cap:
        logits = cap * np.tanh(logits / cap)
    # HF convention: the last entry is the final-normed state (not needed by the tests).
    return hs, logits


def drafter_forward(dcfg: dict, D: dict, E: np.ndarray, head: np.ndarray, feats, ctx_pos,
                    anchor: int, s: int, emb_scale: float = 1.0, softcap=None,
                    visible=None) -> np.ndarray:
    """Independent float64 DFlash drafter forward (z-lab/dflash ``dflash/model.py``).

    D: drafter tensors (z-lab names); E: target embedding [V, H]; head: target lm_head [V, H].
    ``visible(layer, q, k) -> bool`` says whether the noise query at absolute position q sees the
    key at position k in that layer (sliding-window tests write it out by hand); None: every
    key is visible (full non-causal layers). RoPE uses ``dcfg["rope_theta"]``.
    Returns logits [B, V].
    """
    D = {k: v.astype(np.float64) for k, v in D.items()}
    eps, B = dcfg["rms_norm_eps"], dcfg["block_size"]
    nh, nkv, d = dcfg["num_attention_heads"], dcfg["num_key_value_heads"], dcfg["head_dim"]
    theta = dcfg["rope_theta"]
    m = dcfg["dflash_config"]["mask_token_id"]
    c = _rms(np.asarray(feats, np.float64) @ D["fc.weight"].T, D["hidden_norm.weight"], eps, 0.0)
    block = np.array([anchor] + [m] * (B - 1))
    h = E.astype(np.float64)[block] * emb_scale
    qpos, kpos = np.arange(s, s + B), np.concatenate([np.asarray(ctx_pos), np.arange(s, s + B)])
    for i in range(dcfg["num_hidden_layers"]):
        L = f"layers.{i}."
        u = _rms(h, D[L + "input_layernorm.weight"], eps, 0.0)
        ctx_and_noise = np.concatenate([c, u], axis=0)  # context rows first
        q = _rms((u @ D[L + "self_attn.q_proj.weight"].T).reshape(B, nh, d),
                 D[L + "self_attn.q_norm.weight"], eps, 0.0)
        k = _rms((ctx_and_noise @ D[L + "self_attn.k_proj.weight"].T).reshape(-1, nkv, d),
                 D[L + "self_attn.k_norm.weight"], eps, 0.0)
        v = (ctx_and_noise @ D[L + "self_attn.v_proj.weight"].T).reshape(-1, nkv, d)
        q, k = _rope(q, qpos, theta), _rope(k, kpos, theta)
        o = np.zeros((B, nh, d))
        hidden = np.zeros((len(kpos), B), bool)  # [ctx+B, B]
        if visible is not None:
            hidden = np.array([[not visible(i, int(qq), int(kk)) for qq in qpos] for kk in kpos])
        for hh in range(nh):
            sc = k[:, hh // (nh // nkv)] @ q[:, hh].T * d**-0.5  # [ctx+B, B]
            sc = np.where(hidden, -np.inf, sc)
            p = np.exp(sc - sc.max(0))
            p /= p.sum(0)
            o[:, hh] = p.T @ v[:, hh // (nh // nkv)]
        h = h + o.reshape(B, nh * d) @ D[L + "self_attn.o_proj.weight"].T
        u = _rms(h, D[L + "post_attention_layernorm.weight"], eps, 0.0)
        g, up = u @ D[L + "mlp.gate_proj.weight"].T, u @ D[L + "mlp.up_proj.weight"].T
        h = h + (g / (1 + np.exp(-g)) * up) @ D[L + "mlp.down_proj.weight"].T
    logits = _rms(h, D["norm.weight"], eps, 0.0) @ head.astype(np.float64).T
    return logits if not softcap else softcap * np.tanh(logits / softcap)


def qwen35_forward(config: dict, tensors: dict, ids) -> tuple[list, np.ndarray]:
    """Independent float64 forward of a Qwen3.5 text hybrid (separate qkv/z/b/a GDN layout).

    Straight from the equations (docs/gdn.md; HF Qwen3.5 attention): (1+w)
    norms except the GDN gated norm; full-attention layers with q_proj = per head [q | gate],
    q/k norms, partial rotary on the first rotary_dim channels, sigmoid output gate; GDN layers
    with a causal depthwise conv (kernel K) + SiLU on [q | k | v], L2-normalised q and k (eps
    inside the sqrt), grouped value heads (value head h uses key head h // r), g = -exp(A_log)
    softplus(a + dt_bias), beta = sigmoid(b), the per-token delta rule, gated RMSNorm with z.
    Returns (hidden_states list, logits) as :func:`dense_forward`.
    """
    W = {k: v.astype(np.float64) for k, v in tensors.items()}
    c = config
    eps = c["rms_norm_eps"]
    nh, nkv, d = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    rp = c["rope_parameters"]
    rd = int(d * rp["partial_rotary_factor"])
    Hk, Hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv, K = c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"]
    r = Hv // Hk
    ids = np.asarray(ids)
    T = len(ids)
    pos = np.arange(T)
    x = W["model.embed_tokens.weight"][ids]
    hs = [x]
    for i, kind in enumerate(c["layer_types"]):
        L = f"model.layers.{i}."
        u = _rms(x, W[L + "input_layernorm.weight"], eps, 1.0)
        if kind == "full_attention":
            qg = (u @ W[L + "self_attn.q_proj.weight"].T).reshape(T, nh, 2 * d)
            q, gate = qg[..., :d], qg[..., d:]
            k = (u @ W[L + "self_attn.k_proj.weight"].T).reshape(T, nkv, d)
            v = (u @ W[L + "self_attn.v_proj.weight"].T).reshape(T, nkv, d)
            q = _rms(q, W[L + "self_attn.q_norm.weight"], eps, 1.0)
            k = _rms(k, W[L + "self_attn.k_norm.weight"], eps, 1.0)
            q = np.concatenate([_rope(q[..., :rd], pos, rp["rope_theta"]), q[..., rd:]], -1)
            k = np.concatenate([_rope(k[..., :rd], pos, rp["rope_theta"]), k[..., rd:]], -1)
            o = np.zeros((T, nh, d))
            for hh in range(nh):
                s = q[:, hh] @ k[:, hh // (nh // nkv)].T * d**-0.5  # [T, T]
                s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
                p = np.exp(s - s.max(1, keepdims=True))
                o[:, hh] = (p / p.sum(1, keepdims=True)) @ v[:, hh // (nh // nkv)]
            o = o * (1 / (1 + np.exp(-gate)))
            a = o.reshape(T, nh * d) @ W[L + "self_attn.o_proj.weight"].T
        else:
            A = L + "linear_attn."
            mixed = u @ W[A + "in_proj_qkv.weight"].T  # [T, 2 Hk dk + Hv dv]
            z = (u @ W[A + "in_proj_z.weight"].T).reshape(T, Hv, dv)
            b = u @ W[A + "in_proj_b.weight"].T
            av = u @ W[A + "in_proj_a.weight"].T
            cw = W[A + "conv1d.weight"][:, 0, :]  # [C, K]
            padded = np.concatenate([np.zeros((K - 1, mixed.shape[1])), mixed])
            conv = np.stack([(padded[t:t + K] * cw.T).sum(0) for t in range(T)])
            conv = conv / (1 + np.exp(-conv))
            q = conv[:, :Hk * dk].reshape(T, Hk, dk)
            k = conv[:, Hk * dk:2 * Hk * dk].reshape(T, Hk, dk)
            v = conv[:, 2 * Hk * dk:].reshape(T, Hv, dv)
            q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
            k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
            g = -np.exp(W[A + "A_log"]) * np.log1p(np.exp(av + W[A + "dt_bias"]))
            beta = 1 / (1 + np.exp(-b))
            S = np.zeros((Hv, dk, dv))
            o = np.zeros((T, Hv, dv))
            for t in range(T):
                for h in range(Hv):
                    kh = h // r
                    S[h] *= np.exp(g[t, h])
                    delta = beta[t, h] * (v[t, h] - S[h].T @ k[t, kh])
                    S[h] += np.outer(k[t, kh], delta)
                    o[t, h] = dk**-0.5 * S[h].T @ q[t, kh]
            o = o / np.sqrt((o * o).mean(-1, keepdims=True) + eps) * W[A + "norm.weight"]
            o = o * (z / (1 + np.exp(-z)))
            a = o.reshape(T, Hv * dv) @ W[A + "out_proj.weight"].T
        x = x + a
        u = _rms(x, W[L + "post_attention_layernorm.weight"], eps, 1.0)
        if L + "mlp.gate.weight" in W:  # Qwen3.5 MoE (tests/models/oracle_gemma4_moe.py)
            x = x + qwen35_moe_block(c, W, L, u)
        else:
            gt, up = u @ W[L + "mlp.gate_proj.weight"].T, u @ W[L + "mlp.up_proj.weight"].T
            x = x + (gt / (1 + np.exp(-gt)) * up) @ W[L + "mlp.down_proj.weight"].T
        hs.append(x)
    logits = _rms(x, W["model.norm.weight"], eps, 1.0) @ W["lm_head.weight"].T
    return hs, logits
