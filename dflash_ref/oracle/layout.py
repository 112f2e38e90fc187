"""The golden-vector case layout: key grammar, tensor kinds and their tolerances, reading a case.

A case is a directory (docs/golden_vectors.md)::

    manifest.json            versions, model configs, conventions, tolerances, steps, tensor list
    inputs.safetensors       input.prompt_ids [N] int64, input.prompt_positions [N] int64
    step0000.safetensors     every tensor of step 0 (the prefill), then step0001 ... in order
    target.gguf, drafter.gguf    the same weights in llama.cpp's naming (optional)

A tensor key is ``input.<name>`` or ``step<NNNN>.<component>.[layer<LL>.]<name>``; the kind of a
key (which decides its tolerance) is its last dot-separated part, looked up in :data:`KINDS`.
Another stack's dump may spread its tensors over any ``*.safetensors`` files in its directory:
keys are unique, files are only containers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dflash_ref.errors import FormatError
from dflash_ref.testing import Tolerance  # the project's one tolerance type

LAYOUT_VERSION = 1
MANIFEST = "manifest.json"
INPUTS_FILE = "inputs.safetensors"

KEY_RE = re.compile(r"^(?:input\.(?P<iname>[a-z0-9_]+)|step(?P<step>\d{4})\.(?P<comp>[a-z]+)\."
                    r"(?:layer(?P<layer>\d{2,3})\.)?(?P<name>[a-z0-9_]+))$")


def step_file(step: int) -> str:
    return f"step{step:04d}.safetensors"


def tensor_key(step: int | None, component: str, name: str, layer: int | None = None) -> str:
    """``input.<name>`` (step None) or ``step<NNNN>.<component>.[layer<LL>.]<name>``."""
    if step is None:
        return f"input.{name}"
    mid = "" if layer is None else f"layer{layer:02d}."
    return f"step{step:04d}.{component}.{mid}{name}"


@dataclass(frozen=True)
class KeyParts:
    step: int | None
    component: str
    layer: int | None
    name: str


def parse_key(key: str) -> KeyParts:
    """Split a key by the grammar above; a key outside it is a FormatError naming the rule."""
    m = KEY_RE.match(key)
    if m is None:
        raise FormatError(f"tensor key {key!r} is outside the golden-vector grammar: expected "
                          f"'input.<name>' or 'step<NNNN>.<component>.[layer<LL>.]<name>' with "
                          f"lower-case names (docs/golden_vectors.md)")
    if m["iname"]:
        return KeyParts(None, "input", None, m["iname"])
    layer = None if m["layer"] is None else int(m["layer"])
    return KeyParts(int(m["step"]), m["comp"], layer, m["name"])


# The tolerance of each tensor kind for a float32 stack against this float32 reference; a
# bf16 / fp16 stack scales them with ``compare --tolerance-scale``.
TOLERANCES: dict[str, Tolerance] = {
    "exact": Tolerance(
        atol=0.0, rtol=0.0, reason="integers (ids, positions, lengths, decisions, slots): any "
        "difference is a different algorithm, not rounding"),
    "hidden": Tolerance(
        atol=1e-4, rtol=1e-3, reason="float32 activations of unit scale after a few matrix "
        "products and norms in another summation order (BLAS blocking, fused kernels): measured "
        "<= 2e-5 between NumPy and PyTorch on the tiny cases; a real bug (a missing scale, a "
        "shifted layer, a wrong mask) moves them by O(0.1) or more"),
    "logits": Tolerance(
        atol=1e-3, rtol=1e-3, reason="logits are a product over the hidden width after the "
        "whole stack; rounding grows with depth and |logit| ~ 10"),
    "state": Tolerance(
        atol=1e-4, rtol=1e-3, reason="GDN recurrent / conv state: a decayed sum over tokens of "
        "outer products, rounded per token (docs/gdn.md)"),
    "probability": Tolerance(
        atol=1e-5, rtol=1e-4, reason="gate inputs and EMAs in [0, 1] computed from one softmax "
        "row"),
}

# kind of each tensor name (the last part of the key)
KINDS: dict[str, str] = {
    # integers
    "prompt_ids": "exact", "prompt_positions": "exact", "input_ids": "exact",
    "positions": "exact", "tree_parents": "exact", "block_ids": "exact",
    "block_positions": "exact", "context_positions": "exact", "draft_tokens": "exact",
    "accepted": "exact", "bonus": "exact", "committed": "exact", "length": "exact",
    "kv_length": "exact", "features_length": "exact", "floor": "exact", "streak": "exact",
    "n_draft_steps": "exact", "n_generated": "exact", "chunk_blocks": "exact",
    "slot_positions": "exact",
    # float32 activations
    "embed": "hidden", "attn_norm": "hidden", "q": "hidden", "k": "hidden", "v": "hidden",
    "q_rope": "hidden", "k_rope": "hidden", "attn_out": "hidden", "mlp_norm": "hidden",
    "mlp_out": "hidden", "h": "hidden", "features": "hidden", "encoder_out": "hidden",
    # logits
    "logits": "logits", "draft_logits": "logits",
    # GDN states
    "gdn_recurrent": "state", "gdn_conv": "state",
    # gate
    "p1": "probability", "ema": "probability",
}


def kind_of(key: str) -> str:
    """The tolerance kind of a key (its last name part); unknown names are a FormatError."""
    name = parse_key(key).name
    if name not in KINDS:
        raise FormatError(f"tensor {key!r}: name {name!r} has no tolerance kind; known names: "
                          f"{sorted(KINDS)}")
    return KINDS[name]


def write_tensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """One safetensors file of ``tensors`` (contiguous little-endian, dtypes kept); its mode is
    set when the output folder publishes it (dflash_ref/io/writing.py)."""
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path),
              metadata={"format": f"dflash-ref golden vectors, layout {LAYOUT_VERSION}"})


def read_case(path) -> tuple[dict | None, dict[str, np.ndarray]]:
    """(manifest or None, every tensor of every ``*.safetensors`` file in directory ``path``).

    A key found in two files is a FormatError (files are containers; keys must be unique).
    """
    from safetensors.numpy import load_file

    path = Path(path)
    if not path.is_dir():
        raise FormatError(f"{path} is not a case directory (manifest.json + *.safetensors)")
    manifest = (json.loads((path / MANIFEST).read_text()) if (path / MANIFEST).exists()
                else None)
    tensors: dict[str, np.ndarray] = {}
    where: dict[str, str] = {}
    for f in sorted(path.glob("*.safetensors")):
        for key, arr in load_file(str(f)).items():
            if key in tensors:
                raise FormatError(f"tensor {key!r} is in both {where[key]} and {f.name}; each "
                                  f"key must be stored once")
            tensors[key], where[key] = arr, f.name
    return manifest, tensors
