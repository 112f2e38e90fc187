"""The ablations of ``dflash-ref explain``: the same run with one thing about the drafter changed.

Each ablation is a function ``(target, drafter) -> (target, drafter, restore)``: the pair to run
and a callable that undoes any change to the shared target. The drafter is a shallow copy with
one attribute replaced, so the loaded one is untouched.

- **features zeroed**: ``fc = 0`` (the encoded context is exactly what zeroed features give). A
  drafter whose tau does not drop is not reading its features.
- **features shuffled**: every feature row that enters the drafter's context is replaced by the
  row of a random earlier (or the same) position (a fixed seed). Position-specific information
  is lost, the rows' statistics are kept.
- **layers -1 / +1**: the target captures every feature layer one lower / one higher (the +1
  layer-id bug of GGUF exports is the "+1" direction). A drafter that does *better* one layer
  off is wired off by one.
- **RoPE base = target's**: the drafter's RoPE theta set to the target's. When they differ and
  tau rises, the drafter was trained with the target's base and is being run with another.
"""

from __future__ import annotations

import copy
import dataclasses
from types import MappingProxyType

import numpy as np


class _ShuffledContext:
    """A draft cache whose incoming feature rows are rows of random positions seen so far."""

    def __init__(self, cache, seed: int = 0):
        self._cache, self._rng, self._seen = cache, np.random.default_rng(seed), []

    def __getattr__(self, name):
        return getattr(self._cache, name)

    def extend(self, features, positions) -> None:
        xp = self._cache.drafter.be.xp if hasattr(self._cache, "drafter") else np
        rows = [features[i] for i in range(features.shape[0])]
        self._seen.extend(rows)
        picks = [self._rng.integers(len(self._seen) - len(rows) + i + 1)
                 for i in range(len(rows))]
        out = xp.stack([self._seen[j] for j in picks]) if rows else features
        self._cache.extend(out, positions)


def zero_features(target, drafter):
    d = copy.copy(drafter)
    d.fc = drafter.fc * 0
    return target, d, None


def shuffle_features(target, drafter):
    d = copy.copy(drafter)
    base = drafter.new_cache
    d.new_cache = lambda window=None: _ShuffledContext(base(window))
    return target, d, None


def shift_layers(delta: int):
    """The ablation capturing every feature layer ``delta`` off; None when that leaves the
    target (layer ids must stay in 0..L-1)."""

    def ablate(target, drafter):
        old = list(target.target_layer_ids)
        new = [i + delta for i in old]
        if min(new) < 0 or max(new) >= target.config.num_hidden_layers:
            return None
        target.set_target_layer_ids(new)
        return target, drafter, lambda: target.set_target_layer_ids(old)

    return ablate


def target_rope_base(target, drafter):
    """The drafter with every layer type's RoPE theta set to the target's (None when equal)."""
    theta = target.config.rope_theta_for(0)
    rope = drafter.config.rope_by_type
    if all(r.theta == theta for r in rope.values()):
        return None
    new = {t: dataclasses.replace(r, theta=theta) for t, r in rope.items()}
    d = copy.copy(drafter)
    d.config = dataclasses.replace(drafter.config, rope_by_type=MappingProxyType(new))
    return target, d, None


ABLATIONS = {
    "features zeroed": zero_features,
    "features shuffled": shuffle_features,
    "layers -1": shift_layers(-1),
    "layers +1": shift_layers(+1),
    "RoPE base = target's": target_rope_base,
}
