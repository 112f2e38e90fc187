"""Formats: checkpoints in, checkpoints out (the bottom layer of the package; docs/formats.md).

- :mod:`~dflash_ref.io.safetensors_io`: HF checkpoint directories (single file or sharded,
  bf16/f16/f32), read lazily; ``write_safetensors`` builds tiny checkpoints for tests.
- :mod:`~dflash_ref.io.gguf_io`: GGUF through the ``gguf`` package; the axis-order rule
  (ggml {in, out} vs NumPy [out, in]) is stated and handled there and nowhere else.
- :mod:`~dflash_ref.io.quant`: BF16, Q8_0 and Q4_K writers in ggml's byte layout, with error
  bounds. The dequantizers are ops: :mod:`dflash_ref.ops.dequant`.
- :mod:`~dflash_ref.io.names`: DFlash drafter tensor names, HF <-> the two GGUF namings.
- :mod:`~dflash_ref.io.compare`: per-tensor relative RMS / max-abs comparison of two weight sets.
- :mod:`~dflash_ref.io.convert_drafter`: z-lab drafter -> GGUF in the llama.cpp and lucebox
  namings; :mod:`~dflash_ref.io.drafter_from_gguf`: the way back (``DFlashDrafter.from_gguf``);
  :mod:`~dflash_ref.io.convert_common`: what both converters share (storage types, metadata
  reads, the writer); :mod:`~dflash_ref.io.convert_target`: Qwen3 / Qwen3.5 / Gemma 3 targets
  <-> llama.cpp GGUF (``TargetModel.from_gguf``).
"""

from dflash_ref.io.compare import CompareRow, compare_weights, format_table
from dflash_ref.io.convert_drafter import convert_drafter
from dflash_ref.io.convert_target import convert_target
from dflash_ref.io.gguf_io import GGUFFile, GGUFTensorInfo, open_gguf, write_gguf
from dflash_ref.io.safetensors_io import (
    MissingTensorError,
    SafetensorsCheckpoint,
    TensorInfo,
    load_checkpoint,
    open_checkpoint,
    write_safetensors,
)

__all__ = [
    "CompareRow",
    "GGUFFile",
    "GGUFTensorInfo",
    "MissingTensorError",
    "SafetensorsCheckpoint",
    "TensorInfo",
    "compare_weights",
    "convert_drafter",
    "convert_target",
    "format_table",
    "load_checkpoint",
    "open_checkpoint",
    "open_gguf",
    "write_gguf",
    "write_safetensors",
]
