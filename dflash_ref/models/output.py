"""What a target forward returns (``TargetModel.forward``, ``forward_tree``, ``forward_batch``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TargetOutput:
    """Result of one forward: ``logits`` [T, vocab] float32 (or the rows ``logits_rows`` chose);
    ``features`` [T, C*hidden] or None."""

    logits: object
    features: object | None
