"""Attention masks as small explicit objects: which key may each query see.

Every attention in dflash-ref is one computation under a different mask (docs/attention.md): the
target's causal and sliding-window layers, the DFlash drafter's non-causal block over context +
noise (docs/drafter.md; z-lab/dflash ``dflash/model.py``), verify batches, tree verify, and
attention over a KVFlash pool whose slots are not in position order (docs/kvflash.md). A
:class:`MaskSpec` describes the mask from positions and a few scalars, so that

- the NumPy reference materialises it as an additive [Tq, Tk] mask (:func:`materialize`), and
- the CuPy attention kernel evaluates the very same predicate inline, tile by tile, without a
  Tq x Tk matrix in memory (kernels_cupy/cuda/attention.cu, ``att_key_visible``).

The rule (one predicate, evaluated per query row i and key slot j)::

    q = q_pos[i],  k = k_pos[j]
    visible(i, j) = valid  and  (committed or batch_rule)  and  in_window
      valid      = k >= 0                       (k_pos = -1 marks a free / paged-out slot)
      committed  = base_pos is set and k < base_pos
      batch_rule = ancestors[i, j]              if an ancestor matrix is given (tree verify)
                 = k <= q                        elif causal
                 = True                          otherwise (fully visible)
      in_window  = True                          if window is None
                 = q - k < W                     if window_mode == "left"  (HF: the window
                                                  includes the current token; keys with k > q
                                                  are left to the causal / ancestor rule)
                 = |q - k| <= W                  if window_mode == "bidirectional"
                                                  (HF DFlash-assistant sliding layers;
                                                  docs/drafter.md, "Sliding-window drafter
                                                  layers")

Named cases (builders below):

- causal (target prefill/decode/verify):  causal=True                    k <= q
- sliding window W (HF convention):       causal=True, window=W          0 <= q - k < W
- committed prefix (pager validity):      causal=True, base_pos=b        k < b  or  k <= q
- drafter (docs/drafter.md):               causal=False                   every valid key
- tree verify:                            base_pos=b, ancestors=A        k < b  or  A[i, j]

Keys are identified by their absolute position only, never by their slot index: permuting the
key slots together with ``k_pos`` (and the ancestor columns) permutes nothing in the output.
Positions must fit in int32 (the kernel's type).

Positions may be host (NumPy) or device (CuPy) arrays: the CuPy attention twin copies host
positions to the device on every call (4 bytes per slot) and reads device int32 positions as
they are. :func:`causal_mask` (with ``k_pos`` given), :func:`full_mask` and
:func:`committed_prefix_mask` keep device arrays on the device, and a spec of device arrays is
not range-checked on the host (that would synchronise). The target builds its masks this way,
from positions it uploads once per forward (dflash_ref/models/batch_arrays.py); :func:`tree_mask`
builds on the host.

Also here: :func:`layer_windows`, the per-layer window from ``layer_types`` /
``sliding_window_pattern`` (an SWA layer run as full attention is exact until the context passes
the window, so the pattern must be explicit; docs/conventions.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dflash_ref.errors import ConfigError

WINDOW_MODES = ("left", "bidirectional")
INT32_MAX = 2**31 - 1


def _index_array(x, name: str, lowest: int):
    """``x`` as a 1-D integer array of positions in [lowest, 2^31 - 1] (the kernel's int32).

    Lists and NumPy arrays become NumPy and are checked here. A device (CuPy) array is kept on its
    device and only its shape is checked: reading its values would synchronise.
    """
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
    """Which key slot each query row may see; see the module docstring for the predicate.

    Attributes:
        q_pos: [Tq] int absolute position of each query row (>= 0).
        k_pos: [Tk] int absolute position of each key slot; -1 marks an invalid slot (free,
            paged out, stale), never visible.
        causal: batch keys (k >= base_pos, or every key when base_pos is None) need k <= q.
        window: sliding window W >= 1, or None (0 is accepted and means None).
        window_mode: "left" (q - k < W; HF convention, the window includes the current token)
            or "bidirectional" (|q - k| <= W; HF DFlash-assistant sliding layers).
        base_pos: the committed-prefix boundary b: keys with k < b are visible to every query
            (subject to the window), whatever the batch rule says. None: no such term.
        ancestors: [Tq, Tk] bool, tree verify only: replaces the causal / full batch rule for
            keys with k >= base_pos. ancestors[i, j] is True when key slot j holds query i
            itself or one of its ancestors. Incompatible with ``causal=True``.
        shape: (Tq, Tk), set when the spec is made.

    Arrays may be NumPy (the reference) or CuPy (read on the device by the CuPy twin). The
    spec is immutable; builders (:func:`causal_mask`, :func:`drafter_mask`, ...) make them.
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
    """The predicate of the module docstring as a bool matrix [len(rows), len(cols)].

    ``rows`` / ``cols`` (index arrays or slices) restrict the evaluation to a tile, which is how
    :func:`dflash_ref.ops.attention.attention_online` evaluates the spec inline. ``xp`` is the
    array module (numpy, or cupy for the CuPy twin of :func:`materialize`).
    """
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
    """The additive mask [Tq, Tk]: 0 where the key is visible, -inf where it is not.

    Added to the (scaled, soft-capped) scores before the softmax. A row of all -inf is a query
    with no visible key; :func:`dflash_ref.ops.attention.attention` outputs zeros for it.
    """
    ok = visible(spec)  # [Tq, Tk]
    dt = np.dtype(dtype)
    return np.where(ok, dt.type(0.0), dt.type(-np.inf)).astype(dt)


# ---------------------------------------------------------------- builders


def causal_mask(q_pos, k_pos=None, window: int | None = None) -> MaskSpec:
    """Target attention: causal, optionally with a sliding window W (HF: ``0 <= q - k < W``).

    Args:
        q_pos: [Tq] query positions (prefill 0..T-1; decode [p]; verify s..s+B-1).
        k_pos: [Tk] positions of the key slots (the KV cache, -1 for empty slots). None means
            ``arange(max(q_pos) + 1)``: a contiguous cache holding everything up to the last query.
        window: the layer's sliding window, or None for a full-attention layer.
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
    """The DFlash drafter's mask over keys [context..., noise...] (docs/drafter.md).

    Queries are the B noise rows; keys are the context rows FIRST, then the noise rows, which is
    the order ``attention``'s k / v must follow. With the defaults every noise query sees every
    context key and every noise key, including later noise positions (non-causal).

    Args:
        ctx_pos: [C] absolute positions of the context keys (-1 for a dropped slot).
        noise_pos: [B] absolute positions of the noise block (s, s+1, ..., s+B-1).
        window: for sliding-attention drafter layers. Which convention applies depends on the
            checkpoint (docs/attention.md): HF ref with flash-attn: non-causal + "left";
            vLLM / lucebox: ``causal=True`` + "left"; HF DFlash assistants: "bidirectional".
        causal: make the noise block causal (vLLM / lucebox convention for SWA layers).
        window_mode: "left" (q - k < W) or "bidirectional" (|q - k| <= W).
    Returns:
        MaskSpec with q_pos = noise_pos and k_pos = concat(ctx_pos, noise_pos).
    """
    ctx_pos = _index_array(ctx_pos, "ctx_pos", lowest=-1)
    noise_pos = _index_array(noise_pos, "noise_pos", lowest=0)
    k_pos = np.concatenate([ctx_pos, noise_pos])  # [C + B] (device arrays: on their device)
    return MaskSpec(noise_pos, k_pos, causal=causal, window=window, window_mode=window_mode)


def committed_prefix_mask(q_pos, k_pos, base_pos: int, window: int | None = None) -> MaskSpec:
    """The pager's validity rule: committed keys (k < base_pos) plus causal among the batch.

    Visible iff ``k >= 0 and (k < base_pos or k <= q)`` (and ``q - k < W`` with a window). Keys
    may sit in any slot order (a KVFlash pool); a slot whose content is stale (a rejected draft
    left at a position >= base_pos that this batch did not rewrite) must be given k_pos = -1.
    For queries at q >= base_pos this equals causal attention over the committed keys plus the
    batch; the rule differs from plain causal only for a query below base_pos, which still sees
    the whole committed prefix.
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
    """[n, n] bool: entry [i, a] is True iff node a is node i or one of its ancestors.

    ``parents[i] < i`` (topological order), -1 for a root; row i is its parent's row plus i.
    """
    parents = np.asarray(parents, dtype=np.int64)
    tree_depths(parents)  # checks the order
    anc = np.eye(parents.shape[0], dtype=bool)  # [n, n]
    for i, p in enumerate(parents):
        if p >= 0:
            anc[i] |= anc[p]
    return anc


def tree_mask(parents, base_pos: int, k_pos=None, node_slots=None,
              window: int | None = None) -> MaskSpec:
    """Tree verify: node i sees the committed prefix (k < base_pos) and its own ancestors.

    Node i sits at position ``base_pos + depth(i)`` (a root, parents = -1, at base_pos: it is the
    last committed token, not yet in the cache). A chain ``parents = [-1, 0, 1, ...]`` gives the
    same mask as :func:`committed_prefix_mask` for positions base_pos, base_pos+1, ...

    Args:
        parents: [n] parent node index, -1 for a root; topologically ordered (parents[i] < i).
        base_pos: the first position of the tree (= number of committed tokens in the cache).
        k_pos: [Tk] positions of all key slots. None: ``[0..base_pos) + node positions``.
        node_slots: [n] the key slot that holds node i. None: ``base_pos + i`` (the layout of
            the default k_pos).
        window: sliding window of the layer (positions are base_pos + depth, so the window is
            measured along the branch, as in a chain verify).
    Returns:
        MaskSpec with ancestors [n, Tk]: columns of committed keys are False (they are visible
        through base_pos), column node_slots[a] of row i is True iff a is i or an ancestor of i.
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
    """The sliding window of each layer (None = full attention), from the config.

    Sources, first found wins:
      - ``layer_types`` (HF config): "sliding_attention" -> W, "full_attention" -> None,
        "linear_attention" (GDN, no softmax attention) -> None.
      - ``sliding_window_pattern`` as a per-layer bool list (GGUF
        ``<arch>.attention.sliding_window_pattern``; True = sliding): gemma-4-31B drafter
        [T, T, T, T, F] (seed 001).
      - ``sliding_window_pattern`` as an int P (Gemma 2/3 HF configs): layer l is sliding iff
        ``(l + 1) % P != 0``, i.e. every P-th layer is full.
      - neither: every layer is full (Qwen3 drafters: 5 x full).

    Raises:
        ConfigError: a length mismatch, an unknown layer type, or a sliding layer with no window.
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
