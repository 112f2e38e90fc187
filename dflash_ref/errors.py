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
