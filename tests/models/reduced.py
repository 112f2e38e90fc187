"""A drafter with a reduced draft vocabulary, made from the shipped demo pair: the demo drafter's
tensors unchanged, plus ``lm_head.weight`` = the demo target's tied head rows ``ids`` and the
map ``d2t`` = ``ids - arange`` (offsets, the directory's convention; io/draft_vocab.py). Built
here with NumPy, independently of the loaders under test."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

import dflash_ref
from dflash_ref.io.safetensors_io import load_checkpoint, write_safetensors

DEMO = Path(os.path.dirname(dflash_ref.__file__)) / "data" / "demo"
TEXT_IDS = np.array([9, 10, *range(32, 127)], dtype=np.int64)
"""Tab, newline and printable ASCII: the byte ids the demo's Python text mostly uses."""


def write_reduced_drafter(out, ids, d2t=None, config_changes=None) -> Path:
    """The demo drafter in ``out`` with its own head over target ids ``ids`` [Vd] (in that row
    order); ``d2t`` overrides the stored map (a bad one, for the error tests)."""
    ids = np.asarray(ids, dtype=np.int64)
    out = Path(out)
    config = json.loads((DEMO / "drafter" / "config.json").read_text())
    config["draft_vocab_size"] = int(ids.size)
    config.update(config_changes or {})
    tensors = load_checkpoint(DEMO / "drafter")  # BF16 on disk, exact in float32
    head = load_checkpoint(DEMO / "target")["model.embed_tokens.weight"]  # tied: [V, H]
    tensors["lm_head.weight"] = head[ids]  # [Vd, H]
    tensors["d2t"] = ids - np.arange(ids.size) if d2t is None else np.asarray(d2t)
    return write_safetensors(out, tensors, config=config, dtype="bf16", overwrite=True)
