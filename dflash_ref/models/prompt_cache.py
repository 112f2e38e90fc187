"""The three ways a server resumes a target state, as explicit operations.

A server keeps target states between requests. Three public cache paths restore one, and the
seeds show each losing the drafter's features at least once (docs/serving.md):

- :func:`restore_prefix`: a snapshot of a whole earlier prefix (a global prompt cache);
- :func:`reuse_common_prefix`: the slot's live state, truncated to the prefix it shares with the
  new prompt (per-slot prefix reuse; attention caches and features truncate, GDN states cannot);
- :func:`restore_checkpoint`: the latest of several snapshots taken while an earlier prompt was
  prefilled (hybrid models: the only way back to an earlier position).

Each returns n, the prompt tokens the state now holds (n < len(prompt): the last prompt token is
always run, it gives the first new token's logits); ``generate(..., state=state)`` prefills the
rest. A restore that would leave the drafter's features missing raises
:class:`~dflash_ref.errors.StateError`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dflash_ref.errors import StateError
from dflash_ref.models.snapshot import StateSnapshot, empty_snapshot
from dflash_ref.models.state import TargetState


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two id sequences."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    n = min(a.size, b.size)
    diff = np.nonzero(a[:n] != b[:n])[0]
    return int(diff[0]) if diff.size else n


def _usable(snap: StateSnapshot, prompt) -> bool:
    prompt = np.asarray(prompt, dtype=np.int64)
    return snap.length < prompt.size and common_prefix(snap.tokens, prompt) == snap.length


def restore_prefix(state: TargetState, snap: StateSnapshot, prompt) -> int:
    """Restore ``snap`` into ``state`` if its tokens are a proper prefix of ``prompt``.

    Returns the prompt tokens now held (``snap.length``). A snapshot that does not prefix the
    prompt, or covers all of it, is refused (take it at most len(prompt) - 1 tokens long).
    """
    if not _usable(snap, prompt):
        raise StateError(
            f"restore_prefix: the snapshot's {snap.length} tokens are not a proper prefix of "
            f"the {len(prompt)}-token prompt; look it up by prefix and keep the last prompt "
            f"token out of it")
    state.restore(snap)
    return snap.length


def reuse_common_prefix(state: TargetState, prompt) -> int:
    """Truncate a live ``state`` to the prefix its tokens share with ``prompt``.

    KV caches and features truncate; a hybrid model's GDN state cannot be truncated beyond its
    last batch and raises :class:`StateError` (use :func:`restore_checkpoint`).
    """
    n = min(common_prefix(state.tokens, prompt), len(prompt) - 1)
    state.truncate(n)
    return n


def restore_checkpoint(state: TargetState, checkpoints: Sequence[StateSnapshot], prompt) -> int:
    """Restore the longest checkpoint whose tokens properly prefix ``prompt``; 0 if none does."""
    usable = [c for c in checkpoints if _usable(c, prompt)]
    if not usable:
        state.restore(empty_snapshot(state))
        return 0
    best = max(usable, key=lambda c: c.length)
    state.restore(best)
    return best.length

