"""The Python API refuses what it cannot mean (issue 25, items 5 and 6): a bad-input table.

Each case is one call a user could plausibly write, the typed error it must raise (a
:class:`~dflash_ref.errors.DFlashRefError`, also a ``ValueError``) and words its message must
hold: what was wrong and the fix. Before these checks, ``block_size=3.7`` ran as 3, a 2-D prompt
was flattened into one prompt, float ids were truncated, ``temperature=inf`` sampled uniformly,
``max_new_tokens=2.5`` failed after the prefill with a bare TypeError,
``demo_tokenizer.decode([10**6])`` returned ``''``, ``DFlashDrafter.from_pretrained(dir, "path")``
raised AttributeError, malformed JSON named no file and a failing chat template raised raw jinja2.

The expected behaviour comes from the issue's statement of each case, not from the code.
"""

from __future__ import annotations

import json
import shutil
import warnings
from importlib.resources import files

import numpy as np
import pytest

from dflash_ref import DFlashDrafter, TargetModel, generate, load_tokenizer
from dflash_ref.errors import (
    ConfigError,
    DFlashRefError,
    FormatError,
    NonFiniteLogitsError,
    PositionWarning,
)
from dflash_ref.ops.sampling import GREEDY, SamplingParams
from dflash_ref.spec_decode.arguments import check_arguments
from dflash_ref.spec_decode.batch import generate_batch

DEMO = files("dflash_ref") / "data" / "demo"


# (case id, call(target, drafter) -> anything, error type, words the message must hold)
GENERATE_CASES = [
    ("block_size_float_ran_as_3", lambda t, d: generate(t, d, [1, 2, 3], 4, block_size=3.7),
     ConfigError, ["block_size", "3.7", "integer >= 1"]),
    ("block_size_zero_ran_as_default", lambda t, d: generate(t, d, [1, 2, 3], 4, block_size=0),
     ConfigError, ["block_size", "integer >= 1"]),
    ("block_size_negative_ran_plain", lambda t, d: generate(t, d, [1, 2, 3], 4, block_size=-2),
     ConfigError, ["block_size", "-2"]),
    ("block_size_string", lambda t, d: generate(t, d, [1, 2, 3], 4, block_size="4"),
     ConfigError, ["block_size", "'4'"]),
    ("block_size_bool", lambda t, d: generate(t, d, [1, 2, 3], 4, block_size=True),
     ConfigError, ["block_size", "True"]),
    ("prompt_2d_flattened", lambda t, d: generate(t, None, [[10, 20], [30, 40]], 4),
     ConfigError, ["shape [N]", "[2, 2]", "generate_batch"]),
    ("prompt_float_ids_truncated", lambda t, d: generate(t, None, [10.5, 20.2], 4),
     ConfigError, ["integer token ids", "float64", "encode"]),
    ("prompt_string_not_ids", lambda t, d: generate(t, None, "hello", 4),
     ConfigError, ["shape [N]", "encode"]),
    ("prompt_empty", lambda t, d: generate(t, None, [], 4),
     ConfigError, ["empty", "at least one"]),
    ("prompt_negative_id_wrapped", lambda t, d: generate(t, None, [5, -1], 4),
     ConfigError, ["[0, 259)", "-1", "tokenizer"]),
    ("prompt_id_past_vocab", lambda t, d: generate(t, None, [5, 259], 4),
     ConfigError, ["[0, 259)", "259", "tokenizer"]),
    ("max_new_tokens_float_after_prefill",
     lambda t, d: generate(t, None, [1, 2], 2.5),
     ConfigError, ["max_new_tokens", "2.5", "integer >= 1"]),
    ("max_new_tokens_zero", lambda t, d: generate(t, None, [1, 2], 0),
     ConfigError, ["max_new_tokens", "integer >= 1"]),
    ("max_new_tokens_negative", lambda t, d: generate(t, d, [1, 2], -5),
     ConfigError, ["max_new_tokens", "-5"]),
    ("max_new_tokens_string", lambda t, d: generate(t, None, [1, 2], "8"),
     ConfigError, ["max_new_tokens", "'8'"]),
    ("batch_float_ids_truncated", lambda t, d: generate_batch(t, d, [[1, 2], [3.5, 4]], 4),
     ConfigError, ["integer token ids", "float64"]),
    ("batch_prompt_past_vocab", lambda t, d: generate_batch(t, None, [[1, 2], [3, 999]], 4),
     ConfigError, ["[0, 259)", "999"]),
    ("sampled_without_seed",
     lambda t, d: generate(t, d, [1, 2], 4, sampling=SamplingParams(temperature=0.8)),
     ConfigError, ["seed", "reproducible"]),
]

SAMPLING_CASES = [
    ("temperature_inf_sampled_uniformly", dict(temperature=float("inf"), seed=0),
     ["finite temperature", "inf", "SamplingParams(temperature="]),
    ("temperature_nan", dict(temperature=float("nan"), seed=0), ["finite temperature", "nan"]),
    ("temperature_negative", dict(temperature=-1.0, seed=0), ["temperature >= 0", "-1.0"]),
    ("temperature_string", dict(temperature="0.8", seed=0), ["temperature='0.8'"]),
    ("top_k_float_ran_as_2", dict(temperature=1.0, top_k=2.5, seed=0),
     ["integer top_k", "top_k=2.5"]),
    ("top_k_negative", dict(temperature=1.0, top_k=-1, seed=0), ["top_k >= 0", "top_k=-1"]),
    ("top_p_zero", dict(temperature=1.0, top_p=0.0, seed=0), ["top_p in (0, 1]", "top_p=0.0"]),
    ("top_p_above_one", dict(temperature=1.0, top_p=1.5, seed=0), ["top_p=1.5"]),
    ("seed_float", dict(temperature=1.0, seed=1.5), ["seed", "1.5", "seed=0"]),
    ("seed_string", dict(temperature=1.0, seed="0"), ["seed", "'0'", "seed=0"]),
]


def _assert_typed(info, error, words):
    err = info.value
    assert isinstance(err, error) and isinstance(err, DFlashRefError), type(err)
    assert isinstance(err, ValueError)
    for w in words:
        assert w in str(err), (w, str(err))


@pytest.mark.parametrize("case,call,error,words", GENERATE_CASES,
                         ids=[c[0] for c in GENERATE_CASES])
def test_generate_refuses(demo_pair, case, call, error, words):
    target, drafter = demo_pair
    with pytest.raises(error) as info:
        call(target, drafter)
    _assert_typed(info, error, words)


@pytest.mark.parametrize("case,kwargs,words", SAMPLING_CASES, ids=[c[0] for c in SAMPLING_CASES])
def test_sampling_params_refuse(case, kwargs, words):
    with pytest.raises(ConfigError) as info:
        SamplingParams(**kwargs)
    _assert_typed(info, ConfigError, words)


def test_bad_max_new_tokens_is_refused_before_the_prefill(demo_pair):
    target, _ = demo_pair
    calls = []
    original = target.forward
    target.forward = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        with pytest.raises(ConfigError):
            generate(target, None, [1, 2], 2.5)
    finally:
        del target.forward
    assert calls == []


def test_past_max_position_embeddings_warns(demo_pair):
    target, _ = demo_pair
    limit = target.config.max_position_embeddings  # 4096 for the demo target
    prompt = np.ones(limit - 2, np.int64)
    with pytest.warns(PositionWarning, match="max_position_embeddings=4096"):
        check_arguments(target, None, prompt, 4, GREEDY, None, "chain")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # exactly at the limit: no warning
        check_arguments(target, None, prompt, 2, GREEDY, None, "chain")


def test_good_arguments_still_run(demo_pair):
    target, drafter = demo_pair
    out = generate(target, drafter, np.array([1, 2, 3], np.int32), np.int64(4),
                   block_size=np.int64(4))
    assert len(out.tokens) == 4


# ---------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("ids", [[10**6], [-1], [5, 259]], ids=["huge", "negative", "vocab"])
def test_decode_out_of_vocab_returned_empty_text(demo_tokenizer, ids):
    with pytest.raises(ConfigError) as info:
        demo_tokenizer.decode(ids)
    _assert_typed(info, ConfigError, ["outside this tokenizer's vocabulary", "[0, 259)"])


def test_decode_in_vocab_unchanged(demo_tokenizer):
    assert demo_tokenizer.decode(demo_tokenizer.encode("def f(x):", add_bos=False)) == "def f(x):"


def _tokenizer_copy(tmp_path):
    d = tmp_path / "tok"
    d.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEMO / "target" / name, d / name)
    return d


def test_malformed_tokenizer_json_names_the_file(tmp_path):
    d = _tokenizer_copy(tmp_path)
    (d / "tokenizer.json").write_text('{"version": "1.0", ')
    with pytest.raises(FormatError) as info:
        load_tokenizer(d)
    _assert_typed(info, FormatError, [str(d / "tokenizer.json"), "re-save"])


def test_malformed_tokenizer_config_names_the_file(tmp_path):
    d = _tokenizer_copy(tmp_path)
    (d / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(FormatError) as info:
        load_tokenizer(d)
    _assert_typed(info, FormatError, [str(d / "tokenizer_config.json"), "not valid JSON"])


def test_raising_chat_template_names_the_template(demo_tokenizer):
    template = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}" \
               "{% endif %}{{ messages[0]['content'] }}"
    with pytest.raises(ConfigError) as info:
        demo_tokenizer.apply_chat_template([{"role": "system", "content": "x"}],
                                      chat_template=template)
    _assert_typed(info, ConfigError, ["the chat_template passed", "first must be user",
                                      "pass another template"])
    import jinja2  # code written against jinja2 still catches it

    assert isinstance(info.value, jinja2.TemplateError)


# ---------------------------------------------------------------- from_pretrained


def test_drafter_with_a_path_for_target_raised_attribute_error():
    with pytest.raises(ConfigError) as info:
        DFlashDrafter.from_pretrained(DEMO / "drafter", "path")
    _assert_typed(info, ConfigError, ["target must be a loaded TargetModel", "str",
                                      "TargetModel.from_pretrained(target_path)"])
    with pytest.raises(ConfigError, match="DFlashDrafter.from_gguf"):
        DFlashDrafter.from_gguf(DEMO / "gguf" / "drafter.gguf", str(DEMO / "target"))


def _checkpoint_copy(tmp_path, which):
    d = tmp_path / which
    shutil.copytree(DEMO / which, d)
    return d


@pytest.mark.parametrize("which", ["target", "drafter"])
def test_malformed_config_json_names_the_file(tmp_path, demo_pair, which):
    d = _checkpoint_copy(tmp_path, which)
    (d / "config.json").write_text('{"hidden_size": 64,')
    with pytest.raises(ConfigError) as info:
        if which == "target":
            TargetModel.from_pretrained(d)
        else:
            DFlashDrafter.from_pretrained(d, demo_pair[0])
    _assert_typed(info, ConfigError, [str(d / "config.json"), "not valid JSON"])


@pytest.mark.parametrize("head", [b"GGUF\x03\x00\x00\x00\xec\xff", b"PK\x03\x04\xec\xff"],
                         ids=["gguf", "binary"])
def test_convert_drafter_with_a_binary_target_file_names_it(tmp_path, head):
    """Was a raw "'utf-8' codec can't decode byte 0xec" (issue 31, item 3)."""
    from dflash_ref.io.convert_drafter import convert_drafter

    bad = tmp_path / "target.gguf"
    bad.write_bytes(head + bytes(range(256)))
    with pytest.raises(ConfigError) as info:
        convert_drafter(DEMO / "drafter", tmp_path / "out.gguf", target=bad)
    kind = "a GGUF file" if head.startswith(b"GGUF") else "a binary file"
    _assert_typed(info, ConfigError, [str(bad), kind, "not a config.json", "directory"])
    assert not (tmp_path / "out.gguf").exists()


def _header(path):
    """The safetensors header (the format's spec: 8-byte little-endian length, then JSON)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), 8 + n


def _poison(d, name):
    """Set the first value of tensor ``name`` to NaN, in place in the file's bytes.

    Written from the format's spec alone (no torch, no project code): the tensor's data starts
    at ``data_offsets[0]`` after the header; a bf16 quiet NaN is 0x7FC0, an f32 one 0x7FC00000.
    """
    path = d / "model.safetensors"
    header, base = _header(path)
    entry = header[name]
    nan = {"BF16": b"\xc0\x7f", "F16": b"\x00\x7e", "F32": b"\x00\x00\xc0\x7f"}[entry["dtype"]]
    start = base + entry["data_offsets"][0]
    with path.open("r+b") as f:
        f.seek(start)
        f.write(nan)


def test_nan_weight_is_named_by_check_finite(tmp_path, demo_pair):
    d = _checkpoint_copy(tmp_path, "target")
    _poison(d, "model.norm.weight")
    with pytest.raises(FormatError) as info:
        TargetModel.from_pretrained(d, check_finite=True)
    _assert_typed(info, FormatError, ["model.norm.weight (1 values)", "NaN or inf"])
    dd = _checkpoint_copy(tmp_path, "drafter")
    first = sorted(k for k in _header(dd / "model.safetensors")[0] if k != "__metadata__")[0]
    _poison(dd, first)
    with pytest.raises(FormatError, match=f"{first} \\(1 values\\)"):
        DFlashDrafter.from_pretrained(dd, demo_pair[0], check_finite=True)


def test_nan_weight_plain_run_blames_the_weights_not_the_drafter(tmp_path):
    d = _checkpoint_copy(tmp_path, "target")
    _poison(d, "model.norm.weight")
    target = TargetModel.from_pretrained(d)  # check_finite off: the run finds it
    with pytest.raises(NonFiniteLogitsError) as info:
        generate(target, None, [1, 2, 3], 2)
    msg = str(info.value)
    assert msg.startswith("target logits are non-finite")
    assert "NaN or inf weight in the target" in msg and "check_finite=True" in msg
    assert "no drafter made these logits" in msg
    assert "drafter read features" not in msg


# (case id, call(target, drafter), words the TypeError must hold). Each was a bare
# AttributeError ('TargetModel' object has no attribute 'block_size', 'dict' object has no
# attribute 'greedy') raised deep in the loop; the message names the fix.
ROLE_CASES = [
    ("drafter_and_target_swapped", lambda t, d: generate(d, t, [1, 2], 4),
     ["first argument is a drafter", "TargetModel first"]),
    ("target_twice", lambda t, d: generate(t, t, [1, 2], 4),
     ["drafter must be a DFlashDrafter", "got TargetModel"]),
    ("drafter_path_not_loaded", lambda t, d: generate(t, str(DEMO / "drafter"), [1, 2], 4),
     ["drafter must be a DFlashDrafter", "got str", "DFlashDrafter.from_pretrained"]),
    ("target_path_not_loaded", lambda t, d: generate(str(DEMO / "target"), None, [1, 2], 4),
     ["target must be a loaded TargetModel", "got str", "TargetModel.from_pretrained"]),
    ("sampling_as_a_dict", lambda t, d: generate(t, d, [1, 2], 4,
                                                  sampling={"temperature": 0.5, "seed": 0}),
     ["sampling must be a SamplingParams", "got dict",
      "SamplingParams(**{'temperature': 0.5, 'seed': 0})"]),
    ("sampling_as_a_float", lambda t, d: generate(t, None, [1, 2], 4, sampling=0.7),
     ["sampling must be a SamplingParams", "got float", "SamplingParams(temperature="]),
    ("batch_sampling_as_a_dict", lambda t, d: generate_batch(t, d, [[1, 2]], 4,
                                                            sampling={"temperature": 0.0}),
     ["sampling must be a SamplingParams", "got dict"]),
]


@pytest.mark.parametrize("case,call,words", ROLE_CASES, ids=[c[0] for c in ROLE_CASES])
def test_arguments_in_the_wrong_role_are_a_type_error_naming_the_fix(demo_pair, case, call,
                                                                     words):
    target, drafter = demo_pair
    with pytest.raises(TypeError) as info:
        call(target, drafter)
    assert not isinstance(info.value, AttributeError)
    for w in words:
        assert w in str(info.value), (w, str(info.value))
