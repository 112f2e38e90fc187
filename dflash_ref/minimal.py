"""DFlash speculative decoding in one page: a Qwen3 target, the DFlash drafter and the loop.

Read this first: the whole algorithm on NumPy arrays, without the package's machinery (backends,
stores, graphs, gates, trees); tests/test_minimal.py checks it against ``dflash_ref.generate``.
One step, with the anchor t_s (the newest token, emitted but not yet run by the target) at s:

    draft   the features of positions 0..s-1 and the block [t_s, MASK x (B-1)] at s..s+B-1
            (non-causal) -> drafts d_1..d_{B-1}
    verify  the target runs [t_s, d_1..d_{B-1}] at s..s+B-1: a = the longest agreeing prefix
    commit  emit d_1..d_a and the bonus (the target's token after them, the next anchor); keep
            the K/V and features of positions < s+a+1 (the rejected rows roll back)

Shapes: n rows, H hidden, nh / nkv heads of size d, V vocabulary, C captured layers: a feature is
the raw (un-normed) output of a layer in ``target_layer_ids`` (docs/conventions.md, "Layer ids").
``w`` holds a checkpoint's tensors by their HF names; ``p`` is a layer's name prefix.
"""

import functools
import json
from pathlib import Path
from typing import NamedTuple

import numpy as np

from dflash_ref.io.safetensors_io import load_checkpoint


class Model(NamedTuple):
    cfg: dict  # config.json, with a z-lab drafter's "dflash_config" keys lifted to the top
    w: dict  # tensor name -> float32 array, PyTorch [out, in]

def load(path) -> Model:
    cfg, w = json.loads((Path(path) / "config.json").read_text()), load_checkpoint(path)
    if cfg.get("tie_word_embeddings") and "model.embed_tokens.weight" in w:  # a tied target
        w["lm_head.weight"] = w["model.embed_tokens.weight"]
    return Model({**cfg, **cfg.get("dflash_config", {})}, w)

def rms_norm(x, w, eps):  # over the last axis
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)) * w

def rope(x, pos, theta):  # x [n, h, d] at positions pos [n]; NEOX: the two halves rotate
    d = x.shape[-1]
    inv_freq = 1 / np.float32(theta) ** (np.arange(0, d, 2, dtype=np.float32) / d)  # [d/2]
    angle = pos.astype(np.float32)[:, None, None] * inv_freq  # [n, 1, d/2]
    x1, x2, cos, sin = x[..., : d // 2], x[..., d // 2 :], np.cos(angle), np.sin(angle)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)  # [n, h, d]

def attention(q, k, v, visible):  # q [n, nh, d], k v [m, nkv, d], visible [n, m] bool
    g = q.shape[1] // k.shape[1]  # query head j reads key-value head j // g (GQA)
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)  # [m, nh, d]
    s = np.einsum("nhd,mhd->hnm", q, k) / np.float32(np.sqrt(q.shape[-1]))  # [nh, n, m]
    s = np.where(visible, s, -np.inf)  # a hidden key gets weight 0
    p = np.exp(s - s.max(axis=-1, keepdims=True))  # softmax over the visible keys
    return np.einsum("hnm,mhd->nhd", p / p.sum(axis=-1, keepdims=True), v)  # [n, nh, d]

def swiglu_mlp(x, w, p):  # [n, H] -> [n, H]
    gate, up = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T  # [n, F]
    return (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T  # silu(gate) * up

def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]

def qkv(cfg, w, p, x, pos):  # x [n, H] at pos [n] -> q [n, nh, d], k v [n, nkv, d]
    n, nh, nkv, d = len(x), cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim(cfg)
    q = (x @ w[p + "self_attn.q_proj.weight"].T).reshape(n, nh, d)  # [n, nh, d]
    k = (x @ w[p + "self_attn.k_proj.weight"].T).reshape(n, nkv, d)  # [n, nkv, d]
    v = (x @ w[p + "self_attn.v_proj.weight"].T).reshape(n, nkv, d)  # [n, nkv, d]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    q = rope(rms_norm(q, w[p + "self_attn.q_norm.weight"], eps), pos, theta)
    k = rope(rms_norm(k, w[p + "self_attn.k_norm.weight"], eps), pos, theta)
    return q, k, v  # q and k normed per head, then rotated; v as projected

def layer(cfg, w, p, x, pos, K, V, visible):
    """A decoder layer: x [n, H] at pos [n] attends over the keys and values K, V [m, nkv, d]
    followed by its own. Returns x [n, H] and the keys and values [m + n, nkv, d] it read."""
    eps = cfg["rms_norm_eps"]
    q, k, v = qkv(cfg, w, p, rms_norm(x, w[p + "input_layernorm.weight"], eps), pos)
    K, V = np.concatenate([K, k]), np.concatenate([V, v])  # [m + n, nkv, d]
    o = attention(q, K, V, visible).reshape(len(x), -1)  # [n, nh*d]
    x = x + o @ w[p + "self_attn.o_proj.weight"].T
    x = x + swiglu_mlp(rms_norm(x, w[p + "post_attention_layernorm.weight"], eps), w, p)
    return x, K, V

def empty_cache(cfg):  # per layer: K, V [0, nkv, d]
    empty = np.zeros((0, cfg["num_key_value_heads"], head_dim(cfg)), np.float32)
    return [(empty, empty)] * cfg["num_hidden_layers"]

def target_forward(target: Model, ids, cache, capture):
    """ids [n] at positions m..m+n-1 after the cache (K, V [m, nkv, d] per layer) -> logits
    [n, V], features [n, C*H] (the layers ``capture``) and the cache of all m + n positions."""
    cfg, w = target.cfg, target.w
    m = len(cache[0][0])
    pos = m + np.arange(len(ids))  # [n]
    causal = np.arange(m + len(ids))[None, :] <= pos[:, None]  # [n, m + n]
    x, out, new_cache = w["model.embed_tokens.weight"][ids], {}, []  # x [n, H]
    for i, (K, V) in enumerate(cache):
        x, K, V = layer(cfg, w, f"model.layers.{i}.", x, pos, K, V, causal)
        out[i] = x  # raw, un-normed: the residual stream after layer i
        new_cache.append((K, V))
    features = np.concatenate([out[i] for i in capture], axis=-1)  # [n, C*H]
    logits = rms_norm(x, w["model.norm.weight"], cfg["rms_norm_eps"]) @ w["lm_head.weight"].T
    return logits, features, new_cache

def drafter_forward(drafter: Model, target: Model, features, anchor: int):
    """The block [anchor, MASK x (B-1)] at s..s+B-1 over the features [s, C*H] of positions
    0..s-1 (recomputed into K/V every draft: no cache) -> logits [B, V]; rows 1.. are drafts."""
    cfg, w, eps = drafter.cfg, drafter.w, drafter.cfg["rms_norm_eps"]
    s, B = len(features), cfg["block_size"]
    c = rms_norm(features @ w["fc.weight"].T, w["hidden_norm.weight"], eps)  # [s, H]
    block = np.array([anchor] + [cfg["mask_token_id"]] * (B - 1))  # [B]
    h = target.w["model.embed_tokens.weight"][block]  # [B, H]: the target's embedding rows
    for i in range(cfg["num_hidden_layers"]):
        _, Kc, Vc = qkv(cfg, w, f"layers.{i}.", c, np.arange(s))  # the context: never queries
        h, _, _ = layer(cfg, w, f"layers.{i}.", h, s + np.arange(B), Kc, Vc,
                        np.ones((B, s + B), bool))  # non-causal: every row sees every key
    return rms_norm(h, w["norm.weight"], eps) @ target.w["lm_head.weight"].T  # target's head

def greedy_propose(draft_logits):  # [B-1, V] -> the drafts [B-1] and their law (none)
    return np.argmax(draft_logits, axis=-1), None

def greedy_verify(drafts, q, logits):  # drafts [B-1], logits [B, V] of the verify rows
    choice = np.argmax(logits, axis=-1)  # [B]: the target's token after each row
    a = int(np.cumprod(drafts == choice[:-1]).sum())  # the longest agreeing prefix
    return a, int(choice[a])  # the bonus: the target's token after the accepted drafts

def generate(target: Model, drafter: Model, prompt, max_new_tokens: int,
             pick=np.argmax, propose=greedy_propose, verify=greedy_verify) -> list[int]:
    """Speculative decoding, greedy by default (``pick`` the first token, ``propose`` the drafts,
    ``verify`` the accepted prefix and the bonus: the sampled forms are below)."""
    capture, cache = drafter.cfg["target_layer_ids"], empty_cache(target.cfg)
    logits, features, cache = target_forward(target, np.asarray(prompt), cache, capture)
    out = [int(pick(logits[-1]))]  # the first anchor, at s = N (prompt: positions 0..N-1)
    while len(out) < max_new_tokens:
        s = len(features)  # the anchor's position: every position before it is committed
        drafts, q = propose(drafter_forward(drafter, target, features, out[-1])[1:])
        block = np.array([out[-1], *drafts])  # [B]: verified at positions s..s+B-1
        logits, block_features, cache = target_forward(target, block, cache, capture)
        a, bonus = verify(drafts, q, logits)
        cache = [(K[: s + a + 1], V[: s + a + 1]) for K, V in cache]  # roll back rows a+1..
        features = np.concatenate([features, block_features[: a + 1]])  # rows 0..a kept
        out += [int(t) for t in drafts[:a]] + [bonus]
    return out[:max_new_tokens]

# ------------------------------------------------------------------ sampling (temperature > 0)

def probs(logits, temperature: float, top_k: int = 0, top_p: float = 1.0):
    """The law of a row, [..., V] -> [..., V] float64: logits / T; the top_k largest; softmax;
    the most likely while the mass before each is < top_p; renormalised (ties: lower id first)."""
    x = np.asarray(logits, np.float64) / temperature
    if 0 < top_k < x.shape[-1]:
        np.put_along_axis(x, np.argsort(-x, axis=-1, kind="stable")[..., top_k:], -np.inf, -1)
    p = np.exp(x - x.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        ps = np.take_along_axis(p, order, axis=-1)  # descending
        np.put_along_axis(p, order, np.where(np.cumsum(ps, axis=-1) - ps < top_p, ps, 0.0), -1)
    return p / p.sum(axis=-1, keepdims=True)

def draw(p, u: float) -> int:  # inverse CDF: the first token whose cumulative mass exceeds u
    c = np.cumsum(p)
    return int(np.searchsorted(c, u * c[-1], side="right"))

def accept_or_resample(drafts, q, p, rng):
    """drafts [B-1] drawn from q [B-1, V]; p [B, V] the target's law per verify row -> (a, bonus):
    d_j accepted with probability min(1, p_j(d_j) / q_j(d_j)); at the first rejection the bonus
    from the residual norm(max(p_j - q_j, 0)), after B-1 acceptances from p_{B-1}. Lossless."""
    u, u_bonus = rng.random(len(drafts)), rng.random()
    for j, d in enumerate(drafts):
        if not u[j] * q[j, d] < p[j, d]:  # rejected
            return j, draw(np.maximum(p[j] - q[j], 0.0), u_bonus)  # draw normalises
    return len(drafts), draw(p[-1], u_bonus)

def generate_sampled(target: Model, drafter: Model, prompt, max_new_tokens: int,
                     temperature: float, top_k: int = 0, top_p: float = 1.0, seed: int = 0):
    """:func:`generate` with drafts d_j ~ q_j and the rule above."""
    rng = np.random.default_rng(seed)
    law = functools.partial(probs, temperature=temperature, top_k=top_k, top_p=top_p)

    def propose(draft_logits):  # [B-1, V] -> drafts [B-1] (one uniform per row) and q
        q = law(draft_logits)
        return np.array([draw(qj, u) for qj, u in zip(q, rng.random(len(q)))]), q

    def verify(drafts, q, logits):
        return accept_or_resample(drafts, q, law(logits), rng)

    def pick(row):
        return draw(law(row), rng.random())

    return generate(target, drafter, prompt, max_new_tokens, pick, propose, verify)

if __name__ == "__main__":  # the shipped demo pair on the start of a method it never saw
    from dflash_ref.io.tokenizer import load_tokenizer

    demo = Path(__file__).parent / "data" / "demo"
    tokenizer = load_tokenizer(demo / "target")
    text = "\tdef put(self, item, block=True, timeout=None):\n\t\t'''Put an item into the queue.\n"
    ids = generate(load(demo / "target"), load(demo / "drafter"), tokenizer.encode(text), 96)
    print(text + tokenizer.decode(ids))
