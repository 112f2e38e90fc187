"""One exception family for the whole project (docs/architecture.md, "Errors").

Every message says what was found, what was expected, and how to fix it. Catch
``DFlashRefError`` to handle anything this package raises on purpose.
"""


class DFlashRefError(Exception):
    """Root of every error dflash-ref raises on purpose."""


class ConfigError(DFlashRefError, ValueError):
    """A config.json / DrafterConfig / TargetConfig value is missing, malformed or inconsistent."""


class FormatError(DFlashRefError, ValueError):
    """A checkpoint file (safetensors, GGUF) is malformed, truncated or lacks a tensor."""


class PagerError(DFlashRefError, RuntimeError):
    """The KVFlash pager was asked for something its pool cannot hold."""


class BackendUnavailable(DFlashRefError, RuntimeError):
    """The requested compute backend cannot run here; the message says why."""


class StateError(DFlashRefError, ValueError):
    """A target state cannot be snapshotted, restored or truncated as asked (e.g. a restore that
    would leave the drafter's features missing, or a GDN state that cannot be truncated)."""


class NonFiniteLogitsError(DFlashRefError, ValueError):
    """Verify or draft logits hold NaN or +-inf, so no token may be chosen from them.

    Raised instead of emitting a token (docs/conventions.md, "Non-finite logits"): an argmax over
    NaN still returns an index, and that index looks like a valid token id.

    Attributes:
        role: which step made the logits ("verify", "draft", "target").
        rows: the offending rows (indices in the caller's numbering), ascending.
        n_nan, n_posinf, n_neginf: counts over those rows.
    """

    def __init__(self, role: str, rows, n_nan: int, n_posinf: int, n_neginf: int, n_rows: int):
        self.role, self.rows = role, tuple(int(r) for r in rows)
        self.n_nan, self.n_posinf, self.n_neginf = int(n_nan), int(n_posinf), int(n_neginf)
        shown = list(self.rows[:8]) + (["..."] if len(self.rows) > 8 else [])
        super().__init__(
            f"{role} logits are non-finite in {len(self.rows)} of {n_rows} rows (rows {shown}): "
            f"{self.n_nan} NaN, {self.n_posinf} +inf, {self.n_neginf} -inf; no token is chosen "
            f"from them. {_NONFINITE_CAUSES.get(role, _NONFINITE_CAUSES['verify'])} "
            f"(docs/conventions.md, \"Non-finite logits\")"
        )


_WEIGHTS_CAUSE = ("a NaN or inf weight in the {model} checkpoint (load it with "
                  "{loader}(..., check_finite=True) to name the tensor)")
_NONFINITE_CAUSES = {  # by role: the target's own logits never involve the drafter
    "target": "Usual causes: " + _WEIGHTS_CAUSE.format(model="target", loader=(
        "TargetModel.from_pretrained")) + " or an overflow in its activations; no drafter made "
        "these logits (with a restored state or prompt cache: features or an attention mask "
        "left stale in a reused buffer).",
    "verify": "Usual causes: " + _WEIGHTS_CAUSE.format(model="target", loader=(
        "TargetModel.from_pretrained")) + ", or a stale attention mask in a reused buffer (the "
        "drafter's features do not enter the target's logits).",
    "draft": "Usual causes: " + _WEIGHTS_CAUSE.format(model="drafter", loader=(
        "DFlashDrafter.from_pretrained")) + ", the drafter read features past the end of its "
        "buffer (a cache restore that skipped the captured features, features lost across "
        "micro-batches) or a stale attention mask in a reused buffer.",
}


class PositionWarning(UserWarning):
    """A run reaches past the target's ``max_position_embeddings``: positions the model was never
    trained on (RoPE extrapolates; the tokens are still computed, but rarely worth reading)."""
