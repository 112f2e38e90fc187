"""Attention masks as small explicit objects: which key may each query see (docs/attention.md).

A :class:`MaskSpec` describes the mask from positions and a few scalars; the NumPy reference
materialises it as an additive [Tq, Tk] mask (:func:`materialize`), the CuPy kernel evaluates the
same predicate tile by tile (kernels_cupy/cuda/attention.cu, ``att_key_visible``). Per query row i
and key slot j, with q = q_pos[i], k = k_pos[j]::

    visible(i, j) = valid  and  (committed or batch_rule)  and  in_window
      valid      = k >= 0                       (-1 marks a free / paged-out / stale slot)
      committed  = base_pos is set and k < base_pos
      batch_rule = ancestors[i, j]  if an ancestor matrix is given (tree verify)
                 = k <= q           elif causal
                 = True             otherwise
      in_window  = True             if window is None
                 = q - k < W        if window_mode == "left" (HF: includes the current token)
                 = |q - k| <= W     if window_mode == "bidirectional" (HF DFlash assistants)

Keys are identified by position, never by slot index; positions fit in int32. Device (CuPy)
positions stay on the device and are not range-checked (that would synchronise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dflash_ref.errors import ConfigError

WINDOW_MODES = ("left", "bidirectional")
INT32_MAX = 2**31 - 1


def _index_array(x, name: str, lowest: int):
    """``x`` as 1-D integer positions in [lowest, 2^31 - 1]; a CuPy array: shape check only."""
    on_host = not type(x).__module__.startswith("cupy")
    if on_host:
        x = np.asarray(x)
        if x.dtype == bool or not np.issubdtype(x.dtype, np.integer):
            raise ValueError(f"MaskSpec: {name} must hold integer positions, got dtype {x.dtype}")
    if x.ndim != 1:
        raise ValueError(f"MaskSpec: {name} must be 1-D [T], got shape {tuple(x.shape)}")
    if on_host and x.size and (x.min() < lowest or x.max() > INT32_MAX):
        why = "-1 marks an invalid key slot" if lowest < 0 else "queries are real tokens"
        raise ValueError(f"MaskSpec: {name} values must lie in [{lowest}, 2^31-1] ({why}), got "
                         f"min {x.min()}, max {x.max()}")
    return x


@dataclass(frozen=True, eq=False)
class MaskSpec:
    """Which key slot each query row may see (the predicate: module docstring). Immutable.

    Attributes:
        q_pos: [Tq] int position of each query row (>= 0).
        k_pos: [Tk] int position of each key slot; -1: invalid, never visible.
        causal: batch keys need k <= q.
        window: sliding window W >= 1, or None (0 means None); window_mode "left" or
            "bidirectional".
        base_pos: keys with k < base_pos are visible to every query (window aside); None: no term.
        ancestors: [Tq, Tk] bool (tree verify): the batch rule instead of causal, which must be
            False; [i, j] is True when slot j holds query i or one of its ancestors.
        shape: (Tq, Tk), set when the spec is made.
    """

    q_pos: np.ndarray
    k_pos: np.ndarray
    causal: bool = False
    window: int | None = None
    window_mode: str = "left"
    base_pos: int | None = None
    ancestors: np.ndarray | None = None
    shape: tuple[int, int] = field(init=False, repr=False)

    def __post_init__(self):
        set_ = object.__setattr__
        q_pos = _index_array(self.q_pos, "q_pos", lowest=0)
        k_pos = _index_array(self.k_pos, "k_pos", lowest=-1)
        set_(self, "q_pos", q_pos)
        set_(self, "k_pos", k_pos)
        set_(self, "shape", (int(q_pos.shape[0]), int(k_pos.shape[0])))
        set_(self, "causal", bool(self.causal))
        if self.window is not None:
            w = int(self.window)
            if w < 0 or w != self.window:
                raise ValueError(
                    f"MaskSpec: window must be a positive int (None or 0 for no window), "
                    f"got {self.window!r}"
                )
            set_(self, "window", w if w > 0 else None)
        if self.window_mode not in WINDOW_MODES:
            raise ValueError(
                f"MaskSpec: window_mode {self.window_mode!r} is unknown; expected one of "
                f"{WINDOW_MODES}"
            )
        if self.base_pos is not None:
            b = int(self.base_pos)
            if b != self.base_pos or not 0 <= b <= INT32_MAX:
                raise ValueError(f"MaskSpec: base_pos must be an int >= 0, got {self.base_pos!r}")
            set_(self, "base_pos", b)
        if self.ancestors is not None:
            anc = self.ancestors
            if not type(anc).__module__.startswith("cupy"):  # a device array stays on its device
                anc = np.asarray(anc)
            if anc.dtype != bool:
                raise ValueError(f"MaskSpec: ancestors must be bool, got dtype {anc.dtype}")
            if tuple(anc.shape) != self.shape:
                raise ValueError(
                    f"MaskSpec: ancestors has shape {tuple(anc.shape)}, expected [Tq, Tk] = "
                    f"{self.shape}"
                )
            if self.causal:
                raise ValueError(
                    "MaskSpec: ancestors replaces the causal rule for batch keys; pass "
                    "causal=False with an ancestor matrix (tree_mask does this)"
                )
            set_(self, "ancestors", anc)


# ---------------------------------------------------------------- the predicate


def visible(spec: MaskSpec, rows=None, cols=None, xp=np):
    """The predicate as bool [len(rows), len(cols)]; ``rows`` / ``cols`` pick a tile, ``xp`` the
    array module."""
    rows = slice(None) if rows is None else rows
    cols = slice(None) if cols is None else cols
    q = xp.asarray(spec.q_pos)[rows].astype(xp.int64)[:, None]  # [r, 1]
    k = xp.asarray(spec.k_pos)[cols].astype(xp.int64)[None, :]  # [1, c]
    if spec.ancestors is not None:
        batch_rule = xp.asarray(spec.ancestors)[rows][:, cols]  # [r, c]
    elif spec.causal:
        batch_rule = k <= q
    else:
        batch_rule = xp.ones((q.shape[0], k.shape[1]), dtype=bool)
    ok = batch_rule
    if spec.base_pos is not None:
        ok = ok | (k < spec.base_pos)
    ok = ok & (k >= 0)
    if spec.window is not None:
        if spec.window_mode == "left":
            ok = ok & (q - k < spec.window)
        else:
            ok = ok & (xp.abs(q - k) <= spec.window)
    return xp.broadcast_to(ok, (q.shape[0], k.shape[1]))


def materialize(spec: MaskSpec, dtype=np.float32) -> np.ndarray:
    """The additive mask [Tq, Tk]: 0 where the key is visible, -inf where it is not."""
    ok = visible(spec)  # [Tq, Tk]
    dt = np.dtype(dtype)
    return np.where(ok, dt.type(0.0), dt.type(-np.inf)).astype(dt)


# ---------------------------------------------------------------- builders


def causal_mask(q_pos, k_pos=None, window: int | None = None) -> MaskSpec:
    """Target attention: ``k <= q`` (and ``q - k < W`` with a window).

    q_pos: [Tq]; k_pos: [Tk] (-1 for empty slots), None: ``arange(max(q_pos) + 1)``.
    """
    if k_pos is None:
        q_pos = _index_array(q_pos, "q_pos", lowest=0)
        k_pos = np.arange(int(q_pos.max()) + 1 if q_pos.size else 0)
    return MaskSpec(q_pos, k_pos, causal=True, window=window)


def full_mask(q_pos, k_pos, window: int | None = None, window_mode: str = "left") -> MaskSpec:
    """Every valid key visible (no causal rule), optionally windowed."""
    return MaskSpec(q_pos, k_pos, causal=False, window=window, window_mode=window_mode)


def drafter_mask(ctx_pos, noise_pos, window: int | None = None, causal: bool = False,
                 window_mode: str = "left") -> MaskSpec:
    """The DFlash drafter's mask: B noise queries over keys [context..., noise...], non-causal
    by default (window conventions: docs/drafter.md, "Sliding-window drafter layers").

    ctx_pos: [C] (-1 for a dropped slot); noise_pos: [B] (s..s+B-1). Returns a MaskSpec with
    q_pos = noise_pos, k_pos = concat(ctx_pos, noise_pos).
    """
    ctx_pos = _index_array(ctx_pos, "ctx_pos", lowest=-1)
    noise_pos = _index_array(noise_pos, "noise_pos", lowest=0)
    k_pos = np.concatenate([ctx_pos, noise_pos])  # [C + B] (device arrays: on their device)
    return MaskSpec(noise_pos, k_pos, causal=causal, window=window, window_mode=window_mode)


def committed_prefix_mask(q_pos, k_pos, base_pos: int, window: int | None = None) -> MaskSpec:
    """The pager's rule: visible iff ``k >= 0 and (k < base_pos or k <= q)`` (and the window).

    Slots may be in any order; a stale slot (k >= base_pos, not rewritten) must carry k_pos = -1.
    """
    return MaskSpec(q_pos, k_pos, causal=True, window=window, base_pos=base_pos)


def tree_depths(parents) -> np.ndarray:
    """[n] depth of each tree node (roots have depth 0); parents[i] < i is required."""
    parents = np.asarray(parents, dtype=np.int64)
    depth = np.zeros(parents.shape[0], dtype=np.int64)
    for i, p in enumerate(parents):
        if p >= i or p < -1:
            raise ValueError(
                f"tree parents must be topologically ordered (-1 <= parents[i] < i: a parent must "
                f"precede its child); "
                f"parents[{i}] = {p}"
            )
        depth[i] = 0 if p < 0 else depth[p] + 1
    return depth


def ancestor_matrix(parents) -> np.ndarray:
    """[n, n] bool: [i, a] is True iff node a is node i or an ancestor (parents[i] < i)."""
    parents = np.asarray(parents, dtype=np.int64)
    tree_depths(parents)  # checks the order
    anc = np.eye(parents.shape[0], dtype=bool)  # [n, n]
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] |= anc[p]
    return anc


def tree_mask(parents, base_pos: int, k_pos=None, node_slots=None,
              window: int | None = None) -> MaskSpec:
    """Tree verify: node i, at position ``base_pos + depth(i)``, sees k < base_pos and its
    ancestors.

    Args:
        parents: [n] parent index, -1 for a root; parents[i] < i.
        base_pos: committed tokens in the cache (the roots' position).
        k_pos: [Tk] positions of all key slots; None: ``[0..base_pos) + node positions``.
        node_slots: [n] the key slot of node i; None: ``base_pos + i``.
        window: the layer's window, measured along the branch.
    """
    parents = np.asarray(parents, dtype=np.int64)
    n = parents.shape[0]
    depth = tree_depths(parents)
    q_pos = base_pos + depth  # [n]
    if k_pos is None:
        k_pos = np.concatenate([np.arange(base_pos), q_pos])
    k_pos = _index_array(k_pos, "k_pos", lowest=-1)
    slots = base_pos + np.arange(n) if node_slots is None else np.asarray(node_slots)
    if slots.shape != (n,) or (n and (slots.min() < 0 or slots.max() >= k_pos.shape[0])):
        raise ValueError(f"tree_mask: node_slots must be [n={n}] indices into k_pos "
                         f"(Tk={k_pos.shape[0]}), got {slots}")
    if not np.array_equal(np.asarray(k_pos)[slots], q_pos):
        raise ValueError(
            "tree_mask: k_pos[node_slots] must equal the node positions base_pos + depth "
            f"{q_pos.tolist()}, got {np.asarray(k_pos)[slots].tolist()}"
        )
    ancestors = np.zeros((n, k_pos.shape[0]), dtype=bool)  # [n, Tk]
    ancestors[:, slots] = ancestor_matrix(parents)
    return MaskSpec(q_pos, k_pos, causal=False, window=window, base_pos=base_pos,
                    ancestors=ancestors)


# ---------------------------------------------------------------- per-layer pattern

_FULL_TYPES = ("full_attention",)
_SLIDING_TYPES = ("sliding_attention",)
_NO_ATTENTION_TYPES = ("linear_attention",)  # GDN layers of Qwen3.5 / Qwen3-Next: no mask


def layer_windows(n_layers: int, sliding_window: int | None, layer_types=None,
                  sliding_window_pattern=None) -> list[int | None]:
    """The sliding window of each layer (None = full attention), from the first source found:
    ``layer_types`` ("sliding_attention" -> W); ``sliding_window_pattern`` as a bool per layer
    (GGUF, True = sliding) or an int P (layer l sliding iff ``(l + 1) % P != 0``); else all full.
    Raises ConfigError on a length mismatch, an unknown type, or a sliding layer with no window.
    """
    if layer_types is not None:
        layer_types = list(layer_types)
        if len(layer_types) != n_layers:
            raise ConfigError(
                f"layer_types has {len(layer_types)} entries but the model has {n_layers} "
                "layers; fix the config so there is one type per layer"
            )
        sliding = []
        for l, t in enumerate(layer_types):
            if t in _SLIDING_TYPES:
                sliding.append(True)
            elif t in _FULL_TYPES or t in _NO_ATTENTION_TYPES:
                sliding.append(False)
            else:
                raise ConfigError(
                    f"layer_types[{l}] = {t!r} is unknown; expected one of "
                    f"{_FULL_TYPES + _SLIDING_TYPES + _NO_ATTENTION_TYPES}"
                )
    elif sliding_window_pattern is not None and isinstance(
        sliding_window_pattern, (Sequence, np.ndarray)
    ):
        sliding = [bool(b) for b in sliding_window_pattern]
        if len(sliding) != n_layers:
            raise ConfigError(
                f"sliding_window_pattern has {len(sliding)} entries but the model has "
                f"{n_layers} layers; expected one bool per layer (True = sliding)"
            )
    elif sliding_window_pattern is not None:
        period = int(sliding_window_pattern)
        if period < 1:
            raise ConfigError(f"sliding_window_pattern must be >= 1, got {period}")
        sliding = [(l + 1) % period != 0 for l in range(n_layers)]
    else:
        sliding = [False] * n_layers
    if any(sliding) and not sliding_window:
        raise ConfigError(
            f"layers {[l for l, s in enumerate(sliding) if s]} are sliding-window layers but "
            f"sliding_window is {sliding_window!r}; set config.sliding_window (GGUF: "
            "<arch>.attention.sliding_window)"
        )
    return [int(sliding_window) if s else None for s in sliding]
