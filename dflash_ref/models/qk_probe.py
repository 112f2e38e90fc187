"""The Q/K probe: the queries and keys a model's attention layers compute, for KVFlash scoring.

The tail-attention scorer (:class:`~dflash_ref.kvflash.scorers.ModelTailScorer`) needs, for a
history of S tokens, the last few queries and every key of some attention layers. Rather than a
mode inside the model, the probe is a ``tap``: ``TargetModel.forward(ids, state, tap=probe)``
shows it each attention layer's q and k, and it keeps what the scorer reads.

It lives with the model, not in kvflash/: it runs the model (``TargetModel.attention_qk``),
and the pager's scorer only receives what it returns (kvflash never imports models).
"""

from __future__ import annotations

import numpy as np

from dflash_ref.errors import ConfigError


class QKProbe:
    """Records the queries and keys attention layers compute, for relevance scoring.

    A ``tap`` for :meth:`~dflash_ref.models.target.TargetModel.forward`: run chain forwards with
    ``model.forward(ids, state, tap=probe)``. Each listed layer's keys [T, Hkv, D] are kept for
    every position and its queries [T, Hq, D] for the last ``n_tail`` positions, taken after the
    q/k norms and, with ``rope=False``, before RoPE (the public scorer's default "NoPE" Q and K:
    Luce-Org/lucebox ``server/src/qwen3/qwen3_kvflash_scorer.cpp``).
    """

    def __init__(self, layers, rope: bool, n_tail: int):
        self.layers, self.rope, self.n_tail = tuple(layers), bool(rope), int(n_tail)
        self._names = ("q_rope", "k_rope") if self.rope else ("q", "k")
        self._q = {i: [] for i in self.layers}  # layer -> pieces [T, Hq, D] (the tail's)
        self._k = {i: [] for i in self.layers}  # layer -> pieces [T, Hkv, D]

    def __call__(self, layer: int, name: str, x) -> None:
        if layer not in self._k or name not in self._names:
            return
        if name == self._names[1]:
            self._k[layer].append(x)
            return
        pieces = self._q[layer]
        pieces.append(x)
        while sum(p.shape[0] for p in pieces) - pieces[0].shape[0] >= self.n_tail:
            pieces.pop(0)  # only the tail queries are kept

    def arrays(self, be) -> tuple[np.ndarray, np.ndarray]:
        """``(q_tail [L, n_tail, Hq, D], keys [L, S, Hkv, D])`` as host float32 arrays."""
        q = np.stack([np.concatenate([be.to_numpy(p) for p in self._q[i]])[-self.n_tail:]
                      for i in self.layers])
        k = np.stack([np.concatenate([be.to_numpy(p) for p in self._k[i]]) for i in self.layers])
        return q, k


def attention_qk(model, ids, n_tail: int = 8, rope: bool = False, layers=None,
                 piece_tokens: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """Queries of the last ``n_tail`` positions and keys of every position of ``ids``.

    What the tail-attention scorer needs (docs/kvflash.md, "Scorers"): ``model`` (a
    :class:`~dflash_ref.models.target.TargetModel`) is run over the whole history in a fresh,
    unpooled state (so chunks a pager has paged out are scored too), ``piece_tokens`` at a time
    to bound the attention's memory, and a :class:`QKProbe` records each layer's q and k after
    the q/k norms, before RoPE by default (the public scorer's "NoPE" choice) or after it with
    ``rope=True``. Cost: one forward over S = len(ids) tokens (O(S^2) attention) per call.

    Args:
        ids: [S] token ids, S >= n_tail.
        n_tail: tail queries kept (8 upstream).
        rope: record post-RoPE q and k (the scores the model's own attention computes).
        layers: attention layer ids to record (default: the full-attention layers, i.e. the
            layers a pager pools); they must share Hq, Hkv and D.
    Returns:
        ``(q_tail [L, n_tail, Hq, D], keys [L, S, Hkv, D])`` host float32 arrays.
    """
    cfg = model.config
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    if layers is None:
        layers = [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"]
    layers = [int(i) for i in layers]
    bad = [i for i in layers if not 0 <= i < cfg.num_hidden_layers
           or cfg.layer_types[i] == "linear_attention"]
    if not layers or bad:
        raise ConfigError(f"attention_qk: layers {layers or '[]'} must be a non-empty list of "
                          f"attention layers (GDN layers have no q/k); bad: {bad}")
    if len({(cfg.num_key_value_heads_for(i), cfg.head_dim_for(i)) for i in layers}) != 1:
        raise ConfigError(f"attention_qk: layers {layers} differ in kv heads or head_dim; "
                          f"score layers of one shape")
    if not 1 <= n_tail <= ids.size:
        raise ValueError(f"attention_qk: need 1 <= n_tail={n_tail} <= len(ids)={ids.size}")
    state = model.new_state(feature_capacity=1, feature_window=1)  # features unused here
    probe = QKProbe(layers, rope, n_tail)
    for a in range(0, ids.size, piece_tokens):
        model.forward(ids[a:a + piece_tokens], state, tap=probe)
    return probe.arrays(model.be)
