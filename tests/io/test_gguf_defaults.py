"""What a GGUF without dflash-ref's extra keys means: llama.cpp's values, as its loader sets them.

Expected values are llama.cpp's rules, read in ggml-org/llama.cpp ``src/llama-model.cpp``
(``load_hparams``: the generic defaults and the ``LLM_ARCH_GEMMA3`` case) and
``src/models/gemma3.cpp`` (``ggml_scale(inpL, sqrtf(n_embd))``), worked out by hand here; the
bf16 and float32 roundings of sqrt(40) are hand values (bf16 spacing between 4 and 8 is 1/32).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.convert_target import convert_target, target_config_dict_from_gguf
from dflash_ref.io.gguf_io import open_gguf
from dflash_ref.io.llama_cpp_defaults import LLAMA_CPP_DEFAULTS_KEY
from dflash_ref.models.target import TargetModel
from dflash_ref.tiny import write_tiny_target
from tests.io.convert_helpers import rewrite

SQRT40_F32 = 6.324555397033691  # float32(sqrt(40)): llama.cpp's sqrtf(40)
SQRT40_BF16 = 6.3125  # 202 / 32: HF's scale for a bf16 checkpoint


def _load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TargetModel.from_gguf(path, **kw)


@pytest.fixture(scope="module")
def gemma40(tmp_path_factory):
    """A tiny Gemma 3 with hidden 40 (sqrt not a bf16 number), bf16 storage, as a GGUF written
    without our embedding_scale key (as llama.cpp writes it)."""
    root = tmp_path_factory.mktemp("g40")
    src = write_tiny_target(root / "src", "gemma3", seed=3, dtype="bfloat16", hidden_size=40)
    full = convert_target(src, root / "full.gguf")
    plain = rewrite(full, root / "plain.gguf", drop_keys=("gemma3.embedding_scale",))
    return {"src": src, "plain": plain}


def test_gguf_embedding_scale_is_llama_cpps_unrounded_sqrt(gemma40):
    assert math.sqrt(40) == pytest.approx(SQRT40_F32, abs=1e-7)
    model = _load(gemma40["plain"])
    assert model.config.embedding_scale == SQRT40_F32  # not bf16's 6.3125
    assert any("sqrtf(n_embd)" in d for d in model.config.defaults_used)
    row = model.embed_tokens[5] * np.float32(SQRT40_F32)
    np.testing.assert_array_equal(model.embed([5])[0], row)


def test_safetensors_embedding_scale_follows_hf_dtype_rule(gemma40):
    # HF: embed_scale.to(weight dtype); a bf16 checkpoint in its own dtype -> bf16 sqrt(40)
    assert TargetModel.from_pretrained(gemma40["src"]).config.embedding_scale == SQRT40_BF16


def test_embedding_scale_option_overrides_the_source_rule(gemma40, tiny_qwen):
    assert _load(gemma40["plain"], embedding_scale="bfloat16").config.embedding_scale == \
        SQRT40_BF16
    assert TargetModel.from_pretrained(gemma40["src"], embedding_scale="float32") \
        .config.embedding_scale == SQRT40_F32
    explicit = _load(gemma40["plain"], embedding_scale=7.0)
    assert explicit.config.embedding_scale == 7.0
    assert "set explicitly" in explicit.config.describe()
    with pytest.raises(ConfigError, match="dtype sqrt"):
        _load(gemma40["plain"], embedding_scale="float8")
    with pytest.raises(ConfigError, match="no embedding scale"):
        TargetModel.from_pretrained(tiny_qwen, embedding_scale="float32")


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    return write_tiny_target(tmp_path_factory.mktemp("q") / "q", "qwen3", seed=4)


def test_gemma3_without_sliding_window_key_is_all_global(gemma40, tmp_path):
    # llama.cpp: no attention.sliding_window (or 0) -> LLAMA_SWA_TYPE_NONE, every layer global,
    # every layer at rope.freq_base (its non-iswa gemma3 graph)
    path = rewrite(gemma40["plain"], tmp_path / "noswa.gguf", drop_keys=(
        "gemma3.attention.sliding_window", "gemma3.attention.sliding_window_pattern",
        "gemma3.rope.freq_base_swa"))
    cfg = _load(path).config
    assert cfg.layer_types == ("full_attention",) * 4
    assert cfg.sliding_window is None
    assert cfg.rope_theta_for(0) == 1_000_000.0
    assert any("every layer global" in d for d in cfg.defaults_used)


def test_head_dims_default_as_llama_cpp(tiny_qwen, tmp_path):
    # llama.cpp: n_head_kv defaults to n_head; n_embd_head_k to n_embd / n_head (64 / 4 = 16)
    path = convert_target(tiny_qwen, tmp_path / "q.gguf")
    bare = rewrite(path, tmp_path / "bare.gguf", drop_keys=(
        "qwen3.attention.head_count_kv", "qwen3.attention.key_length"))
    d = target_config_dict_from_gguf(open_gguf(bare))
    assert d["num_key_value_heads"] == 4 and d["head_dim"] == 16
    assert len(d[LLAMA_CPP_DEFAULTS_KEY]) == 2


def test_missing_rope_base_is_refused_not_llama_cpps_10000(tiny_qwen, tmp_path):
    path = convert_target(tiny_qwen, tmp_path / "q.gguf")
    bare = rewrite(path, tmp_path / "nr.gguf", drop_keys=("qwen3.rope.freq_base",))
    with pytest.raises(FormatError, match="falls back to 10000"):
        TargetModel.from_gguf(bare)


def test_a_gguf_target_load_shows_progress_on_a_terminal_only(monkeypatch, capsys):
    # Issue 25, item 3: a 17-41 s Gemma load printed nothing. On a terminal the dequantization
    # shows a progress bar; piped (a log, a test), stderr stays clean.
    import sys
    from importlib.resources import files

    from dflash_ref.io.convert_target import read_gguf_target

    path = files("dflash_ref") / "data/demo/gguf/target.gguf"
    read_gguf_target(path)
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    _, weights = read_gguf_target(path)
    err = capsys.readouterr().err
    assert "loading target.gguf" in err and f"/{len(weights)} " in err  # the bar counts tensors
