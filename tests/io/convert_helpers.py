"""Shared pieces of the converter tests: the prompt, the drafter tolerances, the
safetensors-vs-GGUF drafter pair, and ``rewrite`` (a GGUF copied with edited metadata or tensors,
also used by tests/test_cli_formats.py). Not a test module."""

from __future__ import annotations

import numpy as np
from gguf import GGUFWriter

from dflash_ref.io.gguf_io import _value_type, open_gguf
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.testing import Tolerance

PROMPT = np.array([3, 17, 42, 99, 5, 250, 7, 61, 13, 128, 77, 200, 31, 8, 190, 64, 11, 2, 150])
NAMINGS = ("llama.cpp", "lucebox")

# Drafter logits, GGUF vs safetensors (tiny qwen3 / gemma3 pairs, |logit| <= ~30). Weights are
# stored with relative error <= 2^-11 (F16), 2^-8 (BF16), amax/254 per 32 (Q8_0); norms are F32.
# Measured max |diff|: F16 1.6e-3..2.1e-3, BF16 1.2e-2..1.4e-2, Q8_0 2.8e-2..4.3e-2.
DRAFTER_TOL = {
    "f32": Tolerance(0.0, 0.0, "F32 stores the float32 weights bit for bit"),
    "f16": Tolerance(0.0, 6e-3, "F16 weights (rel. 2^-11) through 2 drafter layers + lm_head"),
    "bf16": Tolerance(0.0, 4e-2, "BF16 weights (rel. 2^-8) through 2 drafter layers + lm_head"),
    "q8_0": Tolerance(0.0, 1.2e-1, "Q8_0 weights (step amax/127) through 2 layers + lm_head"),
}


def features_of(target):
    return target.be.to_numpy(target.forward(PROMPT, target.new_state()).features)


def drafter_pair(target_dir, drafter_dir, gguf_path):
    """(safetensors drafter, GGUF drafter), each bound to its own copy of the target."""
    ta = TargetModel.from_pretrained(target_dir)
    tb = TargetModel.from_pretrained(target_dir)
    return (DFlashDrafter.from_pretrained(drafter_dir, ta),
            DFlashDrafter.from_gguf(gguf_path, tb))


def top1_margin(logits: np.ndarray) -> float:
    """Smallest top-1 minus top-2 gap over the draft rows 1..B-1."""
    top = np.sort(logits[1:], axis=1)
    return float(np.min(top[:, -1] - top[:, -2]))


def rewrite(src, dst, changes=None, drop_keys=(), drop_tensors=(), tensors=None):
    """Copy a GGUF with edited metadata / tensors (written F32, or as given: raw arrays)."""
    g = open_gguf(src)
    w = GGUFWriter(dst, g.arch)
    for key, value in g.metadata.items():
        if key in ("general.architecture", "general.quantization_version") or key in drop_keys:
            continue
        val, vt, sub = _value_type(key, (changes or {}).get(key, value))
        w.add_key_value(key, val, vt, sub_type=sub)
    for key, value in (changes or {}).items():
        if key not in g.metadata:
            val, vt, sub = _value_type(key, value)
            w.add_key_value(key, val, vt, sub_type=sub)
    for name in g.tensor_names:
        if name in drop_tensors:
            continue
        x = (tensors or {}).get(name)
        w.add_tensor(name, g.load(name) if x is None else x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
