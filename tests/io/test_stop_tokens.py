"""Where a generation stops: ``Tokenizer.stop_token_ids`` (dflash_ref/io/tokenizer.py, "Stop
tokens").

Expected values: for a GGUF, llama.cpp's end-of-generation rule as build 11434 writes it in
``src/llama-vocab.cpp`` (the ``special_eog_ids`` list by text, the eos/eot/eom/fim keys, the two
removals), worked out by hand for each vocabulary below; for a directory, transformers'
``generate``, which stops at every id of ``generation_config.json``'s ``eos_token_id``.
"""

from __future__ import annotations

import json

import pytest

from dflash_ref.errors import FormatError
from dflash_ref.io.stop_tokens import gguf_stop_ids
from dflash_ref.io.tokenizer import load_tokenizer
from tests.io.test_tokenizer import (
    CONFIG,
    CONTROL,
    GEMMA_SCORES,
    GEMMA_TOKENS,
    GEMMA_TYPES,
    NORMAL,
    write_dir_tokenizer,
    write_tokenizer_gguf,
)


def meta(**ids) -> dict:
    return {f"tokenizer.ggml.{k}_token_id": v for k, v in ids.items()}


def test_gemma3s_vocabulary_stops_at_eos_end_of_turn_and_the_stray_s():
    # Gemma 3's file: <eos> by key and by text, <end_of_turn> by text, "</s>" (a normal token
    # there) by text: llama.cpp prints exactly these three as its EOG tokens for it.
    tokens = ["<pad>", "<eos>", "<bos>", "<end_of_turn>", "<start_of_turn>", "</s>", "a"]
    assert gguf_stop_ids(meta(eos=1), tokens) == [1, 3, 5]


def test_the_keys_add_ids_whatever_their_text_and_out_of_range_ids_are_dropped():
    # Catches a reader that only looks at texts (a model whose end-of-turn token has an
    # unlisted spelling, named by tokenizer.ggml.eot_token_id, would never stop).
    tokens = ["<s>", "x", "<my_turn_end>", "<my_msg_end>", "<fp>", "<fr>", "<fs>", "y"]
    got = gguf_stop_ids(meta(eos=0, eot=2, eom=3, fim_pad=4, fim_rep=5, fim_sep=6), tokens)
    assert got == [0, 2, 3, 4, 5, 6]
    assert gguf_stop_ids(meta(eos=0, eot=8), tokens) == [0]  # id 8: no such token


def test_start_of_turn_and_lookalikes_do_not_stop():
    # Exact texts only: "<start_of_turn>", "<end_of_turn >" and "<|im_start|>" are not EOG.
    tokens = ["<start_of_turn>", "<end_of_turn >", "<|im_start|>", "<|im_end|>", "</s >"]
    assert gguf_stop_ids({}, tokens) == [3]


@pytest.mark.parametrize("others, end_stops", [
    (["<|return|>", "<|call|>"], False),  # o200k_harmony: <|end|> ends a message, not the turn
    (["<|flush|>", "<|calls|>"], False),  # solar-open
    (["<|flush|>", "<|call|>"], False),
    (["<|return|>", "<|calls|>"], False),
    (["<|return|>"], True),  # one of the pair is not enough
    (["<|call|>"], True),
    (["<|flush|>"], True),
    ([], True),  # Phi-3's <|end|> ends the turn
])
def test_end_is_dropped_only_beside_both_markers_of_its_pair(others, end_stops):
    tokens = ["<|end|>", *others]
    assert gguf_stop_ids({}, tokens) == [0] * end_stops + list(range(1, len(tokens)))


@pytest.mark.parametrize("marker, keys, stops", [
    ("<|tool_response>", {}, [1]),  # gemma4: </s> is a normal token
    ("<|plamo:eos|>", {"eos": 1}, [1]),  # plamo: its EOS is <|plamo:eos|>
    ("<|plamo:eos|>", {}, [0]),  # not an end-of-generation token, so </s> stays one
    ("<|other>", {}, [0]),
])
def test_s_is_a_normal_token_where_gemma4s_or_plamos_marker_ends_generations(marker, keys, stops):
    assert gguf_stop_ids(meta(**keys), ["</s>", marker]) == stops


def test_a_gguf_reads_its_stop_tokens(tmp_path):
    tokens = GEMMA_TOKENS + ["<end_of_turn>", "<turn_done>"]  # ids 11, 12
    path = write_tokenizer_gguf(tmp_path / "g.gguf", "gemma3", "llama", tokens,
                                GEMMA_TYPES + [CONTROL, CONTROL],
                                scores=GEMMA_SCORES + [-1000.0, -1000.0], bos=2, eos=1,
                                add_space_prefix=False)
    assert load_tokenizer(path).stop_token_ids == (1, 11)
    from gguf import GGUFWriter  # the same vocabulary with an eot key naming id 12
    w = GGUFWriter(str(tmp_path / "eot.gguf"), "gemma3")
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types(GEMMA_TYPES + [CONTROL, NORMAL])
    w.add_token_scores(GEMMA_SCORES + [-1000.0, -1000.0])
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_eot_token_id(12)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert load_tokenizer(tmp_path / "eot.gguf").stop_token_ids == (1, 11, 12)


# ------------------------------------------------------------------ a checkpoint directory

@pytest.mark.parametrize("eos, stops", [
    ([1, 4], (1, 4)),  # Gemma's form: a list, EOS among it
    ([4], (1, 4)),  # EOS is a stop token even when the list leaves it out
    (4, (1, 4)),  # a single id
    (None, (1,)),  # the key absent
])
def test_a_directory_stops_at_generation_configs_eos_ids(tmp_path, eos, stops):
    path = write_dir_tokenizer(tmp_path / "d", config=CONFIG)  # eos_token "</s>" = 1
    if eos is not None:
        (path / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    assert load_tokenizer(path).stop_token_ids == stops


def test_a_directory_without_generation_config_stops_at_eos(tmp_path):
    path = write_dir_tokenizer(tmp_path / "d", config=CONFIG)
    assert load_tokenizer(path).stop_token_ids == (1,)


@pytest.mark.parametrize("text", ["{not json", json.dumps({"eos_token_id": "</s>"}),
                                  json.dumps({"eos_token_id": [1, True]}),
                                  json.dumps({"eos_token_id": [-1]})])
def test_a_bad_generation_config_is_one_error_naming_the_file(tmp_path, text):
    path = write_dir_tokenizer(tmp_path / "d", config=CONFIG)
    (path / "generation_config.json").write_text(text)
    with pytest.raises(FormatError, match="generation_config.json"):
        load_tokenizer(path)
