"""Checkpoint directories: round trips (single, sharded, bf16/f16), laziness, clear errors.

Independent checks: files are written by the ``safetensors`` package and re-read with its own
``safe_open``/``safetensors.numpy`` where NumPy allows it; BF16 values are checked against
``gguf.quants`` BF16 rounding, not against our own bf16 helpers.
"""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from hypothesis import given
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.numpy import load_file

from dflash_ref.errors import FormatError
from dflash_ref.io.safetensors_io import (
    INDEX_FILE,
    SINGLE_FILE,
    MissingTensorError,
    load_checkpoint,
    open_checkpoint,
    write_safetensors,
)
from tests.strategies import f32_arrays


def tiny_tensors(rng) -> dict[str, np.ndarray]:
    """A drafter-shaped set (docs/formats.md names), H = 8, C = 3, F = 16, one layer."""
    shapes = {
        "fc.weight": (8, 24), "hidden_norm.weight": (8,), "norm.weight": (8,),
        "layers.0.self_attn.q_proj.weight": (16, 8), "layers.0.self_attn.k_proj.weight": (4, 8),
        "layers.0.mlp.down_proj.weight": (8, 16), "layers.0.input_layernorm.weight": (8,),
    }
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def bf16_oracle(x: np.ndarray) -> np.ndarray:
    """x rounded to bf16 and back, by the gguf package (round to nearest even)."""
    return gguf.quants.dequantize(gguf.quants.quantize(x, Q.BF16), Q.BF16).reshape(x.shape)


# ---------------------------------------------------------------- round trips


def test_single_file_round_trip_f32(tmp_path, rng):
    t = tiny_tensors(rng)
    cfg = {"hidden_size": 8, "dflash_config": {"target_layer_ids": [1, 2, 3]}}
    write_safetensors(tmp_path, t, config=cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", SINGLE_FILE]
    assert sorted(load_file(tmp_path / SINGLE_FILE)) == sorted(t)  # the package reads it too
    ckpt = open_checkpoint(tmp_path)
    assert ckpt.config == cfg and len(ckpt) == len(t) and set(ckpt) == set(t)
    for name, x in t.items():
        assert ckpt.info(name).dtype == "F32" and ckpt.info(name).shape == x.shape
        np.testing.assert_array_equal(ckpt[name], x)
        assert ckpt[name].dtype == np.float32


def test_bf16_storage_is_real_bf16(tmp_path, rng):
    t = tiny_tensors(rng)
    write_safetensors(tmp_path, t, dtype="bfloat16")
    with safe_open(str(tmp_path / SINGLE_FILE), framework="numpy") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"BF16"}
    ckpt = open_checkpoint(tmp_path)
    for name, x in t.items():
        np.testing.assert_array_equal(ckpt[name], bf16_oracle(x), err_msg=name)


def test_f16_storage_and_integer_tensors(tmp_path, rng):
    t = tiny_tensors(rng)
    t["d2t"] = np.arange(-3, 4, dtype=np.int64)
    write_safetensors(tmp_path, t, dtype="float16")
    ckpt = open_checkpoint(tmp_path)
    assert ckpt.info("fc.weight").dtype == "F16" and ckpt.info("d2t").dtype == "I64"
    np.testing.assert_array_equal(ckpt["fc.weight"], t["fc.weight"].astype(np.float16))
    np.testing.assert_array_equal(ckpt.load_native("d2t"), t["d2t"])
    with pytest.raises(FormatError, match="I64.*load_native"):
        ckpt.load("d2t")


def test_sharded_round_trip(tmp_path, rng):
    t = tiny_tensors(rng)
    write_safetensors(tmp_path, t, shard_size=300, dtype="bfloat16")
    shards = sorted(p.name for p in tmp_path.glob("model-*.safetensors"))
    assert len(shards) >= 3 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert set(index["weight_map"]) == set(t) and set(index["weight_map"].values()) == set(shards)
    assert index["metadata"]["total_size"] == sum(x.size * 2 for x in t.values())
    for path in (tmp_path, tmp_path / INDEX_FILE):  # the directory or the index itself
        ckpt = open_checkpoint(path)
        for name, x in t.items():
            np.testing.assert_array_equal(ckpt[name], bf16_oracle(x), err_msg=name)


def test_single_file_wins_over_index_as_in_transformers(tmp_path, rng):
    t = tiny_tensors(rng)
    write_safetensors(tmp_path / "s", t, shard_size=600)
    write_safetensors(tmp_path / "one", {"only": np.ones(2, np.float32)})
    (tmp_path / "s" / SINGLE_FILE).write_bytes((tmp_path / "one" / SINGLE_FILE).read_bytes())
    assert list(open_checkpoint(tmp_path / "s")) == ["only"]


def test_reading_is_lazy(tmp_path, rng):
    # Data is read when a tensor is asked for: bytes changed after opening show up.
    t = {"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)}
    write_safetensors(tmp_path, t)
    ckpt = open_checkpoint(tmp_path)
    loaders = ckpt.loaders()
    assert set(loaders) == {"a", "b"} and all(callable(f) for f in loaders.values())
    data = bytearray((tmp_path / SINGLE_FILE).read_bytes())
    data[-16:] = np.full(4, 7.0, np.float32).tobytes()  # last tensor in the file: "b"
    (tmp_path / SINGLE_FILE).write_bytes(bytes(data))
    np.testing.assert_array_equal(loaders["b"](), np.full(4, 7.0, np.float32))


@given(st.data())
def test_round_trip_property(data):
    import tempfile

    shape = data.draw(st.sampled_from([(1,), (3, 5), (2, 3, 7), (33,)]))
    x = data.draw(f32_arrays(shape, -1e3, 1e3))
    dtype = data.draw(st.sampled_from([None, "float32", "bfloat16"]))
    with tempfile.TemporaryDirectory() as d:
        write_safetensors(d, {"w": x}, dtype=dtype)
        got = load_checkpoint(d)["w"]
    np.testing.assert_array_equal(got, bf16_oracle(x) if dtype == "bfloat16" else x)


# ---------------------------------------------------------------- errors


def test_missing_paths(tmp_path):
    with pytest.raises(FormatError, match="does not exist"):
        open_checkpoint(tmp_path / "nope")
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(FormatError, match="neither model.safetensors nor"):
        open_checkpoint(tmp_path)


def test_index_naming_a_missing_shard(tmp_path, rng):
    write_safetensors(tmp_path, tiny_tensors(rng), shard_size=600)
    victim = sorted(tmp_path.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(FormatError, match=f"names shard '{victim.name}', which is missing"):
        open_checkpoint(tmp_path)


def test_index_mapping_a_tensor_to_the_wrong_shard(tmp_path, rng):
    write_safetensors(tmp_path, tiny_tensors(rng), shard_size=600)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    shards = sorted(set(index["weight_map"].values()))
    name = next(n for n, s in index["weight_map"].items() if s == shards[0])
    index["weight_map"][name] = shards[1]
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(FormatError, match=f"maps tensor '{name}' to {shards[1]}"):
        open_checkpoint(tmp_path)


def test_index_without_weight_map(tmp_path):
    (tmp_path / INDEX_FILE).write_text('{"metadata": {}}')
    with pytest.raises(FormatError, match="weight_map"):
        open_checkpoint(tmp_path)
    (tmp_path / INDEX_FILE).write_text("{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        open_checkpoint(tmp_path)


def test_missing_tensor_lists_close_names(tmp_path, rng):
    write_safetensors(tmp_path, tiny_tensors(rng))
    ckpt = open_checkpoint(tmp_path)
    with pytest.raises(MissingTensorError, match="close names: \\['layers.0.self_attn.q_proj"):
        ckpt["layers.0.self_attn.q_proj.weigth"]
    assert ckpt.get("nope") is None  # a KeyError too, so Mapping.get works
    assert "fc.weight" in ckpt and "nope" not in ckpt


def test_wrong_shape(tmp_path, rng):
    write_safetensors(tmp_path, tiny_tensors(rng))
    with pytest.raises(FormatError, match=r"shape \[8, 24\], expected \[24, 8\]"):
        open_checkpoint(tmp_path).load("fc.weight", shape=(24, 8))


def test_truncated_or_garbage_file(tmp_path, rng):
    write_safetensors(tmp_path, tiny_tensors(rng))
    data = (tmp_path / SINGLE_FILE).read_bytes()
    for cut in (4, 40, len(data) - 10):
        (tmp_path / SINGLE_FILE).write_bytes(data[:cut])
        with pytest.raises(FormatError, match="not a readable safetensors file"):
            open_checkpoint(tmp_path)
    (tmp_path / SINGLE_FILE).write_bytes(b"GGUF" + bytes(100))
    with pytest.raises(FormatError, match="not a readable safetensors file"):
        open_checkpoint(tmp_path)


def test_write_refuses_to_clobber(tmp_path):
    write_safetensors(tmp_path, {"a": np.ones(2, np.float32)})
    with pytest.raises(FileExistsError, match="overwrite=True"):
        write_safetensors(tmp_path, {"b": np.ones(2, np.float32)}, shard_size=4)
    write_safetensors(tmp_path, {"b": np.ones(2, np.float32)}, shard_size=4, overwrite=True)
    assert not (tmp_path / SINGLE_FILE).exists() and list(open_checkpoint(tmp_path)) == ["b"]
