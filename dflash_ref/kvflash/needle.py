"""A synthetic needle-in-a-haystack target whose attention is known by construction.

Used by ``tests/kvflash/test_needle.py``, ``notebooks/kvflash.ipynb`` and docs/kvflash.md to show
what relevance scoring buys: a 1-layer tiny Qwen3 (written by the caller with
``dflash_ref.tiny.write_tiny_target``) whose weights :func:`make_needle_target` edits so that

- the **needle** token N writes a flag into hidden dim 0, the **question** token Q and the
  **answer** token A a flag into hidden dim 1 (their embeddings are 8 * e_dim, RMS 1; every other
  token has zeros in dims 0..2);
- every query head of a flagged (Q or A) token is ``q = 8 e_7`` (only head dim 7), every kv head
  of the needle ``k = 8 e_7``, and every other key has ``k[7] = 0`` exactly; the q/k norm weights
  on dim 7 are 6, so after the per-head RMS norms ``q[7] = k[7] = sqrt(16) * 6 = 24`` and the
  question-needle logit is ``24 * 24 / sqrt(16) = 144``. Every other key scores ~0 (exactly 0
  before RoPE; after RoPE dim 7 pairs with dim 15 at frequency theta^(-7/8) = 5.6e-6 rad per
  token, so a key at distance d leaks ``q[7] k[15] sin(5.6e-6 d) / 4 <= 1.5e-4 d``, e.g. 0.15
  at d = 1000, with |k[15]| <= 4.4 after the norm). The needle's attention weight is
  ``1 / (1 + S e^-144)``, 1 in float32; every other key's weight, ``e^-144 ~ 3e-63``, is below
  float32's smallest subnormal;
- the needle's value is ``8`` on dim 0 of each kv head (every other value is 0 there), and
  ``o_proj`` writes the heads' dim 0 (averaged) into hidden dim 2, the **answer channel**; the
  MLP and ``o_proj`` write nothing into dims 0..2;
- the LM head reads ``logit[A] = 6 x[2]`` and ``logit[Q] = 3 x[1]`` (normed x), and nothing
  else reads dims 0..2.

So a flagged token that sees the needle has ``x[1] = x[2]`` and emits A (6 > 3); one that does
not see it has ``x[2] = 0`` and emits Q ("asks again"). Greedy decoding after a prompt ending in
Q gives A A A ... on the full cache and Q Q Q ... once the needle's chunk is evicted.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dflash_ref.errors import ConfigError

NEEDLE, QUESTION, ANSWER = 250, 251, 252
HAYSTACK_TOKENS = (3, 250)  # haystack ids are drawn from [3, 250): no flag, no answer
FLAG = 8.0  # embedding flag: 8 e_dim has RMS 1 over 64 dims
QK_NORM_DIM7 = 6.0  # q/k norm weight on head dim 7: logit 24 * 24 / 4 = 144


BASE = {"model_type": "qwen3", "num_hidden_layers": 1, "hidden_size": 64, "head_dim": 16}
"""The config fields the construction relies on (the flags' RMS over 64 dims, the logit 144)."""


def make_needle_target(path) -> Path:
    """Edit the tiny checkpoint in directory ``path`` into the needle target (module docstring),
    in place; returns ``path``.

    ``path`` must hold a 1-layer tiny Qwen3 (hidden 64, 4 query heads, 2 kv heads, head_dim 16),
    as ``dflash_ref.tiny.write_tiny_target(path, "qwen3", seed, num_hidden_layers=1)`` writes
    it; the weights not edited stay random, so haystack tokens behave like a generic small LM.
    """
    from dflash_ref.io.safetensors_io import load_checkpoint, write_safetensors

    d = Path(path)
    cfg = json.loads((d / "config.json").read_text())
    wrong = {k: cfg.get(k) for k, v in BASE.items() if cfg.get(k) != v}
    if wrong or cfg.get("vocab_size", 0) <= ANSWER:
        raise ConfigError(
            f"make_needle_target: {d} holds {wrong or {'vocab_size': cfg.get('vocab_size')}}; "
            f"the needle needs {BASE} and vocab_size > {ANSWER}: write it with "
            f"write_tiny_target(path, 'qwen3', seed, num_hidden_layers=1)")
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    w = load_checkpoint(d)
    L = "model.layers.0."
    E = w["model.embed_tokens.weight"]  # [vocab, 64]
    E[:, :3] = 0.0
    for token, dim in ((NEEDLE, 0), (QUESTION, 1), (ANSWER, 1)):
        E[token] = 0.0
        E[token, dim] = FLAG
    w[L + "input_layernorm.weight"][:] = 1.0
    w["model.norm.weight"][:] = 1.0
    Wq = w[L + "self_attn.q_proj.weight"]  # [nh*hd, 64]
    Wk = w[L + "self_attn.k_proj.weight"]  # [nkv*hd, 64]
    Wv = w[L + "self_attn.v_proj.weight"]  # [nkv*hd, 64]
    Wo = w[L + "self_attn.o_proj.weight"]  # [64, nh*hd]
    Wq[:, 1] = 0.0  # only dim 7 of each query head reads the question flag
    Wk[:, 0] = 0.0  # only dim 7 of each kv head reads the needle flag
    Wv[:, 0] = 0.0  # only dim 0 of each kv head carries the needle's value
    for h in range(nh):
        Wq[h * hd + 7] = 0.0
        Wq[h * hd + 7, 1] = 1.0
    for g in range(nkv):
        Wk[g * hd + 7] = 0.0
        Wk[g * hd + 7, 0] = 1.0
        Wv[g * hd] = 0.0
        Wv[g * hd, 0] = 1.0
    w[L + "self_attn.q_norm.weight"][7] = QK_NORM_DIM7
    w[L + "self_attn.k_norm.weight"][7] = QK_NORM_DIM7
    Wo[:3] = 0.0  # attention writes nothing into dims 0..2 ...
    for h in range(nh):
        Wo[:, h * hd] = 0.0
        Wo[2, h * hd] = 1.0 / nh  # ... except the heads' dim 0, averaged, into dim 2
    w[L + "mlp.down_proj.weight"][:3] = 0.0  # nor does the MLP
    head = w["lm_head.weight"]  # [vocab, 64]
    head[:, :3] = 0.0
    head[QUESTION] = 0.0
    head[QUESTION, 1] = 3.0
    head[ANSWER] = 0.0
    head[ANSWER, 2] = 6.0
    return write_safetensors(d, w, config=cfg, overwrite=True)


def needle_context(n_tokens: int, needle_pos: int, seed: int = 0) -> np.ndarray:
    """[n_tokens] haystack ids with the needle at ``needle_pos``."""
    ids = np.random.default_rng(seed).integers(*HAYSTACK_TOKENS, size=n_tokens)
    ids[needle_pos] = NEEDLE
    return ids
