"""GGUF: write/read round trips per type, the axis-order rule, metadata types, clear errors.

Independent checks: files are re-read with the raw ``gguf.GGUFReader`` (not our wrapper) for
shapes and metadata types, and dequantized with ``gguf.quants.dequantize``.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from dflash_ref.errors import FormatError
from dflash_ref.io.gguf_io import WRITE_TYPES, open_gguf, write_gguf
from dflash_ref.io.quant import q4_k_input_bound, q8_0_error_bound
from dflash_ref.io.safetensors_io import MissingTensorError, write_safetensors


def roundtrip(tmp_path, x: np.ndarray, typ: str) -> tuple[np.ndarray, object]:
    path = write_gguf(tmp_path / f"{typ}.gguf", "dflash", {"w": x}, types=typ)
    return open_gguf(path).load("w"), GGUFReader(path).tensors[0]


# ---------------------------------------------------------------- round trips and axis order


@pytest.mark.parametrize("typ", WRITE_TYPES)
def test_round_trip_each_type(tmp_path, rng, typ):
    x = rng.standard_normal((3, 512)).astype(np.float32)  # non-square: [out, in]
    y, raw = roundtrip(tmp_path, x, typ)
    assert raw.tensor_type == Q[typ]
    assert y.shape == (3, 512) and y.dtype == np.float32
    if typ == "F32":
        np.testing.assert_array_equal(y, x)
    elif typ == "F16":
        np.testing.assert_array_equal(y, x.astype(np.float16).astype(np.float32))
    elif typ == "BF16":
        bf = gguf.quants.dequantize(gguf.quants.quantize(x, Q.BF16), Q.BF16)
        np.testing.assert_array_equal(y, bf)
    elif typ == "Q8_0":  # our bytes are gguf's bytes, so the values are too
        np.testing.assert_array_equal(y, gguf.quants.dequantize(gguf.quants.quantize(x, Q.Q8_0),
                                                                Q.Q8_0))
        assert np.all(np.abs(y - x) <= q8_0_error_bound(x))
    else:  # Q4_K: the oracle dequantizes the stored bytes; the error obeys the stated bound
        np.testing.assert_array_equal(y, gguf.quants.dequantize(np.asarray(raw.data), Q.Q4_K))
        assert np.all(np.abs(y - x) <= q4_k_input_bound(x))


@pytest.mark.parametrize("typ, byte_cols", [("F32", None), ("Q8_0", 2 * 34)])
def test_axis_order(tmp_path, rng, typ, byte_cols):
    # An HF [out=3, in=64] matrix is ggml {ne0=64, ne1=3} on disk and comes back as [3, 64].
    x = rng.standard_normal((3, 64)).astype(np.float32)
    y, raw = roundtrip(tmp_path, x, typ)
    assert raw.shape.tolist() == [64, 3]  # gguf's ReaderTensor.shape: ggml order
    assert raw.data.shape == ((3, 64) if byte_cols is None else (3, byte_cols))  # NumPy order
    info = open_gguf(tmp_path / f"{typ}.gguf").tensor_info("w")
    assert info.ggml_shape == (64, 3) and info.numpy_shape == (3, 64)
    assert y.shape == (3, 64)
    assert np.abs(y - x).max() < 0.05  # the same matrix, not its transpose


def test_three_dim_and_vector_tensors(tmp_path, rng):
    t = {"v": rng.standard_normal(7).astype(np.float32),
         "t3": rng.standard_normal((2, 3, 32)).astype(np.float32)}
    g = open_gguf(write_gguf(tmp_path / "x.gguf", "dflash", t, types={"t3": "Q8_0"}))
    assert g.tensor_info("t3").ggml_shape == (32, 3, 2)
    np.testing.assert_array_equal(g.load("v"), t["v"])
    assert g.load("t3").shape == (2, 3, 32)
    assert g.tensor_names == ["v", "t3"]


# ---------------------------------------------------------------- metadata


def test_metadata_values_types_and_arch_prefix(tmp_path):
    meta = {
        "general.name": "DFlash-Draft-8h-1L",
        "qwen35-dflash-draft.block_count": 5,
        "qwen35-dflash-draft.rope.freq_base": 1e7,
        "qwen35-dflash-draft.dflash.target_layer_ids": [1, 16, 31, 46, 61],
        "qwen35-dflash-draft.attention.sliding_window_pattern": [True, True, False],
        "qwen35-dflash-draft.dflash.mask_token_id": (248070, "INT32"),
        "qwen35-dflash-draft.offset": -2,
    }
    path = write_gguf(tmp_path / "m.gguf", "qwen35-dflash-draft", {"w": np.ones(4, np.float32)},
                      metadata=meta)
    raw = GGUFReader(path)
    types = {k: [t.name for t in f.types] for k, f in raw.fields.items()}
    assert types["qwen35-dflash-draft.block_count"] == ["UINT32"]
    assert types["qwen35-dflash-draft.rope.freq_base"] == ["FLOAT32"]
    assert types["qwen35-dflash-draft.dflash.target_layer_ids"] == ["ARRAY", "INT32"]
    assert types["qwen35-dflash-draft.attention.sliding_window_pattern"] == ["ARRAY", "BOOL"]
    assert types["qwen35-dflash-draft.dflash.mask_token_id"] == ["INT32"]
    assert types["qwen35-dflash-draft.offset"] == ["INT32"]
    assert "general.quantization_version" not in types  # only quantized files carry it

    g = open_gguf(path)
    assert g.arch == "qwen35-dflash-draft"
    assert g.get("block_count") == 5 and isinstance(g.get("block_count"), int)
    assert g.get("rope.freq_base") == 1e7
    assert g.get("dflash.target_layer_ids") == [1, 16, 31, 46, 61]
    assert g.get("attention.sliding_window_pattern") == [True, True, False]
    assert g.get("general.name") == "DFlash-Draft-8h-1L"
    assert g.get("qwen35-dflash-draft.block_count") == 5  # an already-prefixed key works too
    assert g.value_type("dflash.target_layer_ids") == "ARRAY[INT32]"
    assert g.get("nope", 3) == 3
    with pytest.raises(FormatError, match="no key 'qwen35-dflash-draft.nope'.*block_count"):
        g.require("nope")


def test_quantized_files_carry_the_quantization_version(tmp_path, rng):
    x = rng.standard_normal((2, 256)).astype(np.float32)
    g = open_gguf(write_gguf(tmp_path / "q.gguf", "dflash", {"w": x}, types="Q4_K"))
    assert g.get("general.quantization_version") == gguf.GGML_QUANT_VERSION


# ---------------------------------------------------------------- errors


def good_file(tmp_path, rng):
    t = {"blk.0.attn_q.weight": rng.standard_normal((4, 256)).astype(np.float32),
         "output_norm.weight": np.ones(256, np.float32)}
    return write_gguf(tmp_path / "good.gguf", "dflash", t, types={"blk.0.attn_q.weight": "Q8_0"})


def test_not_a_gguf(tmp_path, rng):
    with pytest.raises(FormatError, match="does not exist"):
        open_gguf(tmp_path / "missing.gguf")
    write_safetensors(tmp_path / "st", {"a": np.ones(2, np.float32)})
    with pytest.raises(FormatError, match="not a GGUF file: it starts with"):
        open_gguf(tmp_path / "st" / "model.safetensors")


def test_truncated_file(tmp_path, rng):
    data = good_file(tmp_path, rng).read_bytes()
    for cut in (4, 30, 200, len(data) - 100, len(data) - 1):
        (tmp_path / "cut.gguf").write_bytes(data[:cut])
        with pytest.raises(FormatError, match="truncated"):
            open_gguf(tmp_path / "cut.gguf")


def test_missing_tensor_and_wrong_shape(tmp_path, rng):
    g = open_gguf(good_file(tmp_path, rng))
    with pytest.raises(MissingTensorError, match="close names: \\['blk.0.attn_q.weight'"):
        g.load("blk.0.attn_k.weight")
    with pytest.raises(FormatError, match=r"NumPy shape \[4, 256\] \(ggml \{256, 4\}\)"):
        g.load("blk.0.attn_q.weight", shape=(256, 4))


def test_integer_tensor_needs_load_native(tmp_path):
    w = GGUFWriter(tmp_path / "i.gguf", "dflash")
    w.add_tensor("d2t", np.arange(6, dtype=np.int32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = open_gguf(tmp_path / "i.gguf")
    with pytest.raises(FormatError, match="I32, not a float weight"):
        g.load("d2t")
    np.testing.assert_array_equal(g.load_native("d2t"), np.arange(6))


def test_writer_rejects_bad_tensors(tmp_path):
    cases = [
        ({"w": np.zeros((2, 33), np.float32)}, "Q8_0", "multiple of 32"),
        ({"w": np.zeros((2, 255), np.float32)}, "Q4_K", "multiple of 256"),
        ({"w": np.zeros((2, 32), np.int32)}, "F32", "float arrays"),
        ({"w": np.zeros((2, 32), np.float32)}, "Q5_K", "not one of"),
        ({"w": np.full(4, 1e5, np.float32)}, "F16", "overflows F16"),
        ({"w": np.float32(1.0)}, "F32", "at least one dimension"),
    ]
    for tensors, typ, message in cases:
        with pytest.raises(FormatError, match=message):
            write_gguf(tmp_path / "bad.gguf", "dflash", tensors, types=typ)


def test_writer_rejects_unstorable_metadata(tmp_path):
    with pytest.raises(FormatError, match="empty array"):
        write_gguf(tmp_path / "m.gguf", "dflash", {}, metadata={"dflash.x": []})
    with pytest.raises(FormatError, match="cannot store a dict"):
        write_gguf(tmp_path / "m.gguf", "dflash", {}, metadata={"dflash.x": {"a": 1}})


def test_typed_values_accept_gguf_enum(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "dflash", {},
                      metadata={"dflash.big": (2**40, GGUFValueType.UINT64)})
    assert open_gguf(path).get("big") == 2**40
    assert open_gguf(path).value_type("big") == "UINT64"


def test_open_gguf_returns_an_opened_file_as_is(tmp_path):
    # `dflash-ref generate` opens a GGUF once for both the weights and the tokenizer.
    from dflash_ref.io.gguf_io import open_gguf, write_gguf

    path = write_gguf(tmp_path / "one.gguf", "llama", {"w": np.zeros((2, 3), np.float32)})
    g = open_gguf(path)
    assert open_gguf(g) is g
