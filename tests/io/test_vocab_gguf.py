"""The tokenizer keys the converters write (io/vocab_gguf.py; docs/interop.md).

The oracle is the directory's own tokenizer.json run by the ``tokenizers`` library: a GGUF's
vocabulary, read back, must give the same ids on texts that exercise merges, the split regex,
bytes outside ASCII and special tokens. llama.cpp's side is checked by the ``llamacpp`` tests
(tests/llamacpp/), which load the shipped files in a real build.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGUFReader, Keys
from tokenizers import AddedToken, Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers.models import BPE

from dflash_ref.io.gguf_io import write_gguf
from dflash_ref.io.tokenizer import GPT2_PRE_SPLITS, byte_level_alphabet, load_tokenizer
from dflash_ref.io.vocab_gguf import INERT_MERGE, tokenizer_metadata

TEXTS = ["def f(x):\n    return x + 1\n", "hello  world\t12345", "ünïcødé ✓ 漢字",
         "<|endoftext|>a<|pad|>", "\x00\x01\x00", "   lead and trail   ", ""]
DEMO_DIR = Path(__file__).resolve().parents[2] / "dflash_ref" / "data" / "demo"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _gguf_with(md: dict, path):
    import numpy as np

    return write_gguf(path, "qwen3", {"x": np.zeros(1, np.float32)}, metadata=md)


def test_demo_vocabulary_round_trips_and_has_what_llamacpp_requires(tmp_path):
    md = tokenizer_metadata(DEMO_DIR / "target", 259)
    assert md["tokenizer.ggml.model"] == "gpt2"  # llama.cpp: key not found -> load fails
    assert md["tokenizer.ggml.merges"] == [INERT_MERGE]  # no merges: one that makes no token
    alphabet = byte_level_alphabet()
    assert md["tokenizer.ggml.tokens"][:256] == [alphabet[b] for b in range(256)]
    assert md["tokenizer.ggml.tokens"][256:] == ["<|endoftext|>", "<|mask|>", "<|pad|>"]
    assert md["tokenizer.ggml.token_type"][0] == [1] * 256 + [3, 3, 3]
    assert (md["tokenizer.ggml.bos_token_id"], md["tokenizer.ggml.eos_token_id"],
            md["tokenizer.ggml.padding_token_id"], md["tokenizer.ggml.mask_token_id"],
            md["tokenizer.ggml.add_bos_token"]) == (256, 256, 258, 257, False)
    gguf_tok = load_tokenizer(_gguf_with(md, tmp_path / "t.gguf"))
    hf = Tokenizer.from_file(str(DEMO_DIR / "target" / "tokenizer.json"))
    for text in TEXTS:
        assert gguf_tok.encode(text) == hf.encode(text, add_special_tokens=False).ids, text


def test_shipped_pair_carries_the_same_vocabulary():
    """The drafter inherits the target's vocabulary (llama.cpp's --target-model-dir)."""
    def vocab(name):
        r = GGUFReader(DEMO_DIR / "gguf" / name)
        return {k: f.contents() for k, f in r.fields.items()
                if k.startswith("tokenizer.") and k != "tokenizer.ggml.mask_token_id"}

    target, drafter = vocab("target.gguf"), vocab("drafter.gguf")
    assert target["tokenizer.ggml.model"] == "gpt2" and len(target["tokenizer.ggml.tokens"]) == 259
    assert drafter == target


def _qwen_like_dir(path):
    """A byte-level BPE with the qwen2 split and real merges (merge order matters: "l l" before
    "he l" would give another split of "hello")."""
    alphabet = byte_level_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w"), ("1", "2")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GPT2_PRE_SPLITS["qwen2"]), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIALS])
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "add_bos_token": False}))
    return path, tok, len(vocab)


def test_qwen_like_vocabulary_names_its_split_and_keeps_merge_order(tmp_path):
    src, hf, n = _qwen_like_dir(tmp_path / "qwen")
    md = tokenizer_metadata(src, vocab_size=n + len(SPECIALS) + 2)  # embedding rows > tokens
    assert md["tokenizer.ggml.pre"] == "qwen2"
    assert md["tokenizer.ggml.merges"] == ["h e", "l l", "he ll", "hell o", "Ġ w", "1 2"]
    tokens, types = md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"][0]
    assert tokens[-2:] == [f"[PAD{n + 3}]", f"[PAD{n + 4}]"] and types[-2:] == [5, 5]
    assert types[n:n + 3] == [3, 3, 3]
    assert md["tokenizer.ggml.eos_token_id"] == n + 2
    gguf_tok = load_tokenizer(_gguf_with(md, tmp_path / "q.gguf"))
    for text in [*TEXTS, "hello world 1234", "<|im_start|>hello<|im_end|>"]:
        assert gguf_tok.encode(text) == hf.encode(text, add_special_tokens=False).ids, text


def test_sentencepiece_and_missing_tokenizers_write_nothing(tmp_path):
    assert tokenizer_metadata(tmp_path) == {}
    (tmp_path / "tokenizer.json").write_text(json.dumps(
        {"model": {"type": "BPE", "byte_fallback": True, "vocab": {}, "merges": []}}))
    assert tokenizer_metadata(tmp_path) == {}


def test_unknown_split_is_a_clear_error(tmp_path):
    src, _, _ = _qwen_like_dir(tmp_path / "odd")
    spec = json.loads((src / "tokenizer.json").read_text())
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = r"\d+|\D+"
    (src / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(Exception, match="no llama.cpp name.*GPT2_PRE_SPLITS"):
        tokenizer_metadata(src)


# Every special token the converters write, under the key gguf-py's writer uses for it
# (gguf.Keys.Tokenizer; "seperator" is gguf's historical spelling, which llama.cpp reads).
# gguf-py 0.19 has no constant for the CLS token: its key is llama.cpp's
# LLM_KV_TOKENIZER_CLS_ID (src/llama-arch.cpp), "tokenizer.ggml.cls_token_id".
SPECIAL_ROLES = [("bos_token", "<|bos|>", Keys.Tokenizer.BOS_ID),
                 ("eos_token", "<|im_end|>", Keys.Tokenizer.EOS_ID),
                 ("unk_token", "<|unk|>", Keys.Tokenizer.UNK_ID),
                 ("sep_token", "<|sep|>", Keys.Tokenizer.SEP_ID),
                 ("pad_token", "<|endoftext|>", Keys.Tokenizer.PAD_ID),
                 ("cls_token", "<|cls|>", "tokenizer.ggml.cls_token_id"),
                 ("mask_token", "<|mask|>", Keys.Tokenizer.MASK_ID)]


def test_special_token_keys_are_gguf_pys_spellings(tmp_path):
    # Catches a key respelled ("separator_token_id", "pad_token_id", "unk_token_id"): llama.cpp
    # would then find no such token and the GGUF reader here none either.
    assert Keys.Tokenizer.SEP_ID == "tokenizer.ggml.seperator_token_id"
    src, _, _ = _qwen_like_dir(tmp_path / "all")
    extra = [t for _, t, _ in SPECIAL_ROLES if t not in SPECIALS]
    tok = Tokenizer.from_file(str(src / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(t, special=True) for t in extra])
    tok.save(str(src / "tokenizer.json"))
    (src / "tokenizer_config.json").write_text(json.dumps(
        {**{role: text for role, text, _ in SPECIAL_ROLES}, "add_bos_token": False}))
    md = tokenizer_metadata(src)
    written = {k: v for k, v in md.items() if k.endswith("_token_id")}
    assert written == {key: tok.token_to_id(text) for _, text, key in SPECIAL_ROLES}
    assert len(set(written.values())) == len(SPECIAL_ROLES)  # seven different tokens
