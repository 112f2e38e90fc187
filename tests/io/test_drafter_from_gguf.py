"""Reading a drafter GGUF back (``dflash_ref.io.drafter_from_gguf``): the capture count from
the fc width, default ids for a lucebox file without them, and malformed files (truncated,
missing tensors, integer tensors, mistyped metadata, not a drafter).

Files are written by the converter and then edited with ``rewrite`` (the raw ``gguf.GGUFWriter``);
expected errors and ids are hand-derived from the edit.
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.errors import FormatError
from dflash_ref.io.convert_drafter import convert_drafter
from dflash_ref.io.convert_target import convert_target
from dflash_ref.io.drafter_from_gguf import read_gguf_drafter
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.tiny import write_tiny_target
from tests.io.convert_helpers import rewrite

# ---------------------------------------------------------------- capture count from fc


def test_capture_count_from_fc_when_metadata_disagrees(tiny, tmp_path):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "f32", "lucebox")
    bad = rewrite(path, tmp_path / "n3.gguf",
                  {"qwen35-dflash-draft.dflash.n_target_layers": 3})
    target = TargetModel.from_pretrained(tiny["qwen3"])
    with pytest.warns(UserWarning, match="n_target_layers is 3 but fc implies 2"):
        d = DFlashDrafter.from_gguf(bad, target)
    assert d.config.n_capture == 2 and d.config.target_layer_ids == (0, 2)


def test_missing_ids_use_the_formula_for_the_fc_count(tiny, tmp_path):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "f32", "lucebox")
    bad = rewrite(path, tmp_path / "noids.gguf",
                  drop_keys=("qwen35-dflash-draft.dflash.target_layer_ids",))
    with pytest.raises(FormatError, match="pass the target"):
        read_gguf_drafter(bad)
    deep = write_tiny_target(tmp_path / "deep", "qwen3", num_hidden_layers=8)
    target = TargetModel.from_pretrained(deep)
    with pytest.warns(UserWarning, match="default formula"):
        config, _ = read_gguf_drafter(bad, target.config)
    assert config["dflash_config"]["target_layer_ids"] == [1, 5]  # (L=8, C=2): 1 .. L-3


def test_fc_width_not_a_multiple_of_hidden_is_an_error(tiny, tmp_path):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "f32", "lucebox")
    rng = np.random.default_rng(0)
    bad = rewrite(path, tmp_path / "fc.gguf",
                  tensors={"dflash.fc.weight": rng.standard_normal((64, 100)).astype(np.float32)})
    with pytest.raises(FormatError, match=r"\[64, 100\].*100 is not C\*64"):
        read_gguf_drafter(bad)


def test_ids_of_another_length_than_fc_are_an_error(tiny, tmp_path):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "f32", "lucebox")
    bad = rewrite(path, tmp_path / "ids.gguf",
                  {"qwen35-dflash-draft.dflash.target_layer_ids": [0, 1, 2]})
    with pytest.raises(FormatError, match="lists 3 layers .* fc implies 2"):
        read_gguf_drafter(bad)


# ---------------------------------------------------------------- malformed inputs


def test_truncated_file(tiny, tmp_path):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "q8_0")
    short = tmp_path / "short.gguf"
    short.write_bytes(path.read_bytes()[: path.stat().st_size - 100])
    target = TargetModel.from_pretrained(tiny["qwen3"])
    with pytest.raises(FormatError, match="truncated"):
        DFlashDrafter.from_gguf(short, target)


def test_missing_tensor(tiny, tmp_path):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "f32")
    bad = rewrite(path, tmp_path / "m.gguf", drop_tensors=("blk.1.ffn_up.weight",))
    with pytest.raises(FormatError, match=r"lacks tensor\(s\) \['blk.1.ffn_up.weight'\]"):
        read_gguf_drafter(bad)


def test_integer_tensor_and_mistyped_metadata(tiny, tmp_path):
    path = convert_drafter(tiny["drafter"], tmp_path / "d.gguf", "f32")
    ints = rewrite(path, tmp_path / "i.gguf",
                   tensors={"blk.0.attn_q.weight": np.zeros((64, 64), dtype=np.int32)})
    with pytest.raises(FormatError, match="attn_q.weight.*I32, not a float weight"):
        read_gguf_drafter(ints)
    text = rewrite(path, tmp_path / "s.gguf", {"dflash.block_size": "sixteen"})
    with pytest.raises(FormatError, match="'dflash.block_size' must be int.*STRING"):
        read_gguf_drafter(text)
    norope = rewrite(path, tmp_path / "r.gguf", drop_keys=("dflash.rope.freq_base",))
    with pytest.raises(FormatError, match="no key 'dflash.rope.freq_base'"):
        read_gguf_drafter(norope)


def test_not_a_drafter_gguf(tiny, tmp_path):
    path = convert_target(tiny["qwen3"], tmp_path / "t.gguf")
    with pytest.raises(FormatError, match="arch 'qwen3' is not a DFlash drafter"):
        read_gguf_drafter(path)
