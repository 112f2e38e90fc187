"""The K/V cache of one attention layer, and the captured feature buffer.

Both index rows by **absolute position** and truncate on rollback. Neither is a ring (a ring
indexed by ``pos % cap`` silently overwrites old rows; docs/conventions.md, "Lessons from the
seeds"): exceeding a capacity is an error, or, for features with a drafter context window, an
explicit eviction of the oldest rows.
"""

from __future__ import annotations

from dflash_ref.backend import Backend
from dflash_ref.errors import ConfigError


class KVCache:
    """Keys and values of one attention layer for positions 0..len-1, in one storage
    ``[2, capacity, Hkv, D]`` (K rows, then V rows: a batch is one ``write_kv``) that grows by
    doubling. ``k``/``v``: views of the committed rows [len, Hkv, D] (post-norm, post-RoPE).
    """

    def __init__(self, be: Backend, n_kv_heads: int, head_dim: int, dtype="float32"):
        self.be = be
        self.n_kv_heads, self.head_dim, self.dtype = n_kv_heads, head_dim, dtype
        self._kv = be.xp.zeros((2, 0, n_kv_heads, head_dim), dtype=dtype)  # [2, cap, Hkv, D]
        self.length = 0

    def append(self, k, v):
        """Append ``k``, ``v`` [T, Hkv, D] at positions len..len+T-1; returns views of every
        committed row ``[len, Hkv, D]``, valid until the next append or stage."""
        T = k.shape[0]
        if k.shape != (T, self.n_kv_heads, self.head_dim) or v.shape != k.shape:
            raise ValueError(
                f"KVCache.append/stage: k {k.shape} / v {v.shape}, expected "
                f"[T, {self.n_kv_heads}, {self.head_dim}] each"
            )
        end = self.length + T
        if end > self._kv.shape[1]:  # grow: capacity at least doubles (amortised O(1))
            cap = max(end, 2 * self._kv.shape[1], 16)
            kv = self.be.xp.zeros((2, cap, self.n_kv_heads, self.head_dim), dtype=self._kv.dtype)
            kv[:, : self.length] = self._kv[:, : self.length]  # K and V rows in one copy
            self._kv = kv
        self.be.ops.write_kv(self._kv, k, v, start=self.length)  # rows len..end-1, K and V
        self.length = end
        return self._kv[0, :end], self._kv[1, :end]

    def stage(self, k, v, start: int = 0):
        """Write ``k``, ``v`` [T, Hkv, D] after the committed rows, uncommitted (append, then
        the length goes back: the authors' ``crop``). Returns views of rows ``start .. len+T-1``
        ``[len - start + T, Hkv, D]``, nothing copied, valid until the next append or stage."""
        if not 0 <= start <= self.length:
            raise ValueError(f"KVCache.stage(start={start}): cache holds {self.length} positions")
        keys, values = self.append(k, v)
        self.length -= k.shape[0]
        return keys[start:], values[start:]

    @property
    def k(self):
        return self._kv[0, : self.length]

    @property
    def v(self):
        return self._kv[1, : self.length]

    def keep_rows(self, start: int, rows) -> None:
        """Keep rows < start, then the rows at indices ``rows`` (>= start) in that order (a
        tree verify's accepted branch, at positions start, start+1, ...)."""
        rows = self.be.xp.asarray(rows)
        kv = self._kv[:, rows].copy()  # [2, n, Hkv, D]
        self.truncate(start)
        self.append(kv[0], kv[1])

    def truncate(self, n_keep: int) -> None:
        """Drop positions >= n_keep (rejected drafts)."""
        if not 0 <= n_keep <= self.length:
            raise ValueError(f"KVCache.truncate({n_keep}): cache holds {self.length} positions")
        self.length = n_keep


class FeatureBuffer:
    """Captured target features (rows [C*hidden]) by absolute position, for the drafter.

    Rows are appended in position order (a gap or an overlap is an error). At most ``capacity``
    rows are held: past it, with a drafter context ``window``, the oldest rows are evicted
    (keeping at least ``window``); without one, :class:`ConfigError`.
    """

    def __init__(self, be: Backend, width: int, capacity: int | None = None,
                 window: int | None = None, dtype="float32"):
        if window is not None and capacity is not None and capacity < window:
            raise ConfigError(
                f"FeatureBuffer capacity {capacity} is smaller than the drafter context window "
                f"{window}; raise the capacity to at least {window}"
            )
        self.be, self.width, self.capacity, self.window = be, width, capacity, window
        self.start = 0  # absolute position of the first held row (> 0 after eviction)
        self.end = 0  # one past the last held position
        self._rows = be.xp.zeros((0, width), dtype=dtype)

    def __len__(self) -> int:
        return self.end - self.start

    def append(self, start_pos: int, rows) -> None:
        """Append ``rows`` [T, width] for absolute positions start_pos..start_pos+T-1."""
        T = rows.shape[0]
        if rows.ndim != 2 or rows.shape[1] != self.width:
            raise ValueError(f"FeatureBuffer.append: rows {rows.shape}, expected [T, {self.width}]")
        if start_pos != self.end:
            raise ValueError(
                f"FeatureBuffer.append: rows start at position {start_pos} but the buffer ends at "
                f"{self.end}; features must arrive in position order with no gap or overlap "
                f"(rollback with truncate() first, or restore the missing rows)"
            )
        rows = rows.astype(self._rows.dtype)
        held = self.end - self.start
        n = held + T
        if self.capacity is not None and n > self.capacity:
            if self.window is None:
                raise ConfigError(
                    f"FeatureBuffer would hold {n} rows but its capacity is "
                    f"{self.capacity}; raise the capacity (it must cover the whole context) or "
                    f"configure a drafter context window to evict the oldest rows explicitly"
                )
            drop = n - self.capacity  # the oldest rows go: held ones first, then incoming ones
            drop_held = min(drop, held)
            self._rows[: held - drop_held] = self._rows[drop_held:held].copy()
            held -= drop_held
            rows = rows[drop - drop_held:]
            self.start += drop
        if held + rows.shape[0] > self._rows.shape[0]:  # grow by doubling, as KVCache does
            grown = self.be.xp.zeros((max(held + rows.shape[0], 2 * self._rows.shape[0], 16),
                                      self.width), dtype=self._rows.dtype)
            grown[:held] = self._rows[:held]
            self._rows = grown
        self._rows[held: held + rows.shape[0]] = rows
        self.end = start_pos + T

    def rows(self, start: int | None = None, end: int | None = None):
        """Rows for positions [start, end) (default: all held), a view [end-start, width]."""
        start = self.start if start is None else start
        end = self.end if end is None else end
        if start < self.start or end > self.end or start > end:
            raise ValueError(
                f"FeatureBuffer.rows({start}, {end}): held positions are [{self.start}, {self.end})"
            )
        return self._rows[start - self.start : end - self.start]

    def window_rows(self):
        """``(rows, positions)`` of the last ``window`` rows (all rows when no window is set)."""
        lo = self.start if self.window is None else max(self.start, self.end - self.window)
        return self.rows(lo, self.end), self.be.xp.arange(lo, self.end)

    def reset(self, start: int = 0) -> None:
        """Hold nothing; the next append starts at position ``start``."""
        self.start = self.end = int(start)

    def truncate(self, n_keep: int) -> None:
        """Drop rows at positions >= n_keep (rollback of rejected drafts)."""
        if n_keep > self.end:
            raise ValueError(f"FeatureBuffer.truncate({n_keep}): buffer ends at {self.end}")
        if n_keep < self.start:
            raise ValueError(
                f"FeatureBuffer.truncate({n_keep}): positions before {self.start} were evicted"
            )
        self.end = n_keep  # rows past it are overwritten by the next append

    # ------------------------------------------------------------------ as a store of the state

    def keep_path(self, path, node_rows) -> None:
        """Append the accepted branch (a ``TreePath``) of a tree's ``node_rows`` [n, width]."""
        self.append(path.start, node_rows[path.dev])

    def snapshot(self, n: int):
        """``(rows, start)``: a copy of the held rows for positions start..n-1."""
        start = min(self.start, n)
        return self.rows(start, n).copy(), start

    def restore(self, start: int, rows, length: int) -> None:
        """Hold exactly ``rows`` [length - start, width] (None: nothing) from ``start``."""
        self.reset(start)
        if rows is not None and length > start:
            self.append(start, rows)
