"""scripts/gemma3_drafter_llamacpp.py's ``f32_target``: the F32 copy of a quantized GGUF that
llama.cpp runs in ``--f32`` mode, the weights dflash-ref computes with.

Independent checks: the copy is re-read with the raw ``gguf.GGUFReader``, each tensor compared
with ``gguf.quants.dequantize`` of the source's bytes, each key with the source's.
"""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
from gguf import GGUFReader

from dflash_ref.io.gguf_io import write_gguf

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import gemma3_drafter_llamacpp as script  # noqa: E402


def test_f32_copy_keeps_every_key_and_dequantizes_every_tensor(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"token_embd.weight": rng.standard_normal((8, 256)).astype(np.float32),
               "blk.0.attn_q.weight": rng.standard_normal((4, 64)).astype(np.float32),
               "blk.0.attn_norm.weight": rng.standard_normal(64).astype(np.float32)}
    meta = {"gemma3.block_count": 1, "tokenizer.ggml.tokens": ["<pad>", "<bos>", "a"],
            "tokenizer.ggml.bos_token_id": 1}
    src = write_gguf(tmp_path / "q.gguf", "gemma3", tensors, metadata=meta,
                     types={"token_embd.weight": "Q4_K", "blk.0.attn_q.weight": "Q8_0"})
    out = script.f32_target(Path(src), tmp_path / "f32.gguf")
    # written under a hidden temporary name and moved into place: nothing else is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f32.gguf", "q.gguf"]
    a, b = GGUFReader(src), GGUFReader(out)
    assert [t.name for t in b.tensors] == [t.name for t in a.tensors]
    for ta, tb in zip(a.tensors, b.tensors):
        assert tb.tensor_type == gguf.GGMLQuantizationType.F32
        expected = gguf.quants.dequantize(ta.data, ta.tensor_type)  # [rows, cols] or [n]
        np.testing.assert_array_equal(np.asarray(tb.data), expected, err_msg=ta.name)
    for key, f in a.fields.items():
        if key.startswith("GGUF.") or key == "general.file_type":
            continue
        assert b.fields[key].contents() == f.contents(), key
    assert b.fields["general.file_type"].contents() == gguf.LlamaFileType.ALL_F32
    # a file already written is reused, never rewritten
    stamp = out.stat().st_mtime_ns
    assert script.f32_target(Path(src), out) == out and out.stat().st_mtime_ns == stamp
