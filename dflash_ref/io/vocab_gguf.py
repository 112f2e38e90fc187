"""A checkpoint's tokenizer as GGUF ``tokenizer.ggml.*`` metadata, the way llama.cpp reads it
(docs/formats.md, "Tokenizer keys"; docs/interop.md).

llama.cpp refuses a model file without a vocabulary (``error loading model vocabulary: key not
found in model: tokenizer.ggml.model``), so both converters write one:
:func:`tokenizer_metadata` for the target's directory, and the drafter inherits its target's
(llama.cpp's ``convert_hf_to_gguf.py --target-model-dir`` does the same: the draft model shares
the target's vocabulary and llama.cpp checks that they match).

Written for a byte-level BPE ``tokenizer.json`` (GPT-2 / Qwen / the demo's 256 bytes):

======================================  ====================================================
``tokenizer.ggml.model``                ``"gpt2"``
``tokenizer.ggml.pre``                  the name whose split regex equals the
                                        tokenizer.json ``Split`` pattern
                                        (:data:`~dflash_ref.io.tokenizer.GPT2_PRE_SPLITS`);
                                        ``"default"`` for a vocabulary without merges, which
                                        no split can change (the demo: one token per byte)
``tokenizer.ggml.tokens``               every id in order, ``[PAD{i}]`` for an id that no
                                        token has (as llama.cpp's converter pads up to the
                                        embedding's rows)
``tokenizer.ggml.token_type``           special added tokens CONTROL (3), other added tokens
                                        USER_DEFINED (4), padding UNUSED (5), the rest
                                        NORMAL (1)
``tokenizer.ggml.merges``               ``"a b"`` in tokenizer.json order; a vocabulary
                                        without merges gets the one inert merge
                                        :data:`INERT_MERGE` (llama.cpp needs the key, and
                                        ``gguf``'s writer refuses an empty array)
``tokenizer.ggml.*_token_id``           bos, eos, unknown, seperator, padding, cls, mask:
                                        from tokenizer_config.json's names
``tokenizer.ggml.add_bos_token``        the directory's BOS rule (:mod:`dflash_ref.io.tokenizer`)
``tokenizer.chat_template``             when the directory has one
======================================  ====================================================

A SentencePiece vocabulary (Gemma's ``tokenizer.model``) is not written: its scores are not in
``tokenizer.json``; convert such a target with llama.cpp's converter for use in llama.cpp.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dflash_ref.errors import FormatError
from dflash_ref.io.tokenizer import (
    GPT2_PRE_SPLITS,
    TOKEN_CONTROL,
    TOKEN_NORMAL,
    TOKEN_UNUSED,
    TOKEN_USER_DEFINED,
    load_tokenizer,
)

# tokenizer_config.json name -> tokenizer.ggml key (gguf-py's SpecialVocab writes the same seven;
# "seperator" is gguf's spelling)
SPECIAL_KEYS = (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                ("unk_token", "unknown_token_id"), ("sep_token", "seperator_token_id"),
                ("pad_token", "padding_token_id"), ("cls_token", "cls_token_id"),
                ("mask_token", "mask_token_id"))

# Bytes 0x00 and 0x01 in GPT-2's byte alphabet. Their join "Āā" is no token, so the merge can
# never produce an id: llama.cpp spells an unknown merged symbol byte by byte (src/llama-vocab.cpp,
# llm_tokenizer_bpe_session), and dflash-ref's reader drops merges whose product is no token.
INERT_MERGE = "\u0100 \u0101"

# the canonical llama.cpp name for each split regex (the first name listed in GPT2_PRE_SPLITS)
_PRE_OF_SPLIT = {}
for _name, _split in GPT2_PRE_SPLITS.items():
    _PRE_OF_SPLIT.setdefault(_split, _name)


def _split_of(pre_tokenizer: dict | None, where: str) -> tuple[str | None, bool]:
    """(Split regex or None, whether ByteLevel applies GPT-2's own regex) of tokenizer.json's
    pre_tokenizer; a FormatError for anything that is not byte-level."""
    steps = [] if pre_tokenizer is None else (
        pre_tokenizer.get("pretokenizers", [pre_tokenizer])
        if pre_tokenizer.get("type") == "Sequence" else [pre_tokenizer])
    kinds = [s.get("type") for s in steps]
    if "ByteLevel" not in kinds or set(kinds) - {"Split", "ByteLevel"}:
        raise FormatError(f"{where}: pre_tokenizer {kinds} is not byte-level BPE "
                          "(Split + ByteLevel); dflash-ref writes GGUF vocabularies of that kind "
                          "only: convert this model with llama.cpp's convert_hf_to_gguf.py")
    splits = [s["pattern"].get("Regex") for s in steps if s.get("type") == "Split"]
    byte_level = steps[kinds.index("ByteLevel")]
    return (splits[0] if splits else None), bool(byte_level.get("use_regex", True))


def tokenizer_metadata(src_dir, vocab_size: int | None = None) -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` keys of the checkpoint directory ``src_dir`` (module doc).

    ``vocab_size``: the embedding's rows; ids past the tokenizer's are padded. Returns ``{}``
    when the directory has no ``tokenizer.json`` or it is a SentencePiece vocabulary (nothing
    to write; llama.cpp then cannot load the file, docs/interop.md).
    """
    src = Path(src_dir)
    if src.is_file():
        src = src.parent
    path = src / "tokenizer.json"
    if not path.is_file():
        return {}
    spec = json.loads(path.read_text(encoding="utf-8"))
    model = spec.get("model", {})
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        return {}  # SentencePiece-style (Gemma): module doc
    split, gpt2_regex = _split_of(spec.get("pre_tokenizer"), str(path))
    merges = [m if isinstance(m, str) else " ".join(m) for m in (model.get("merges") or [])]
    if not merges:
        pre = "default"  # one token per byte whatever the split
    elif split is not None and split in _PRE_OF_SPLIT:
        pre = _PRE_OF_SPLIT[split]
    elif split is None and gpt2_regex:
        pre = "gpt-2"
    else:
        raise FormatError(f"{path}: the pre-tokenizer split {split!r} has no llama.cpp name "
                          f"dflash-ref knows ({sorted(GPT2_PRE_SPLITS)}); add it to "
                          "GPT2_PRE_SPLITS with llama.cpp's name (src/llama-vocab.cpp)")
    by_id: dict[int, tuple[str, int]] = {i: (t, TOKEN_NORMAL) for t, i in model["vocab"].items()}
    for added in spec.get("added_tokens", []):
        kind = TOKEN_CONTROL if added.get("special") else TOKEN_USER_DEFINED
        by_id[added["id"]] = (added["content"], kind)
    n = max(max(by_id) + 1, vocab_size or 0)
    tokens = [by_id.get(i, (f"[PAD{i}]", TOKEN_UNUSED)) for i in range(n)]
    tok = load_tokenizer(src)
    md: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": [t for t, _ in tokens],
        "tokenizer.ggml.token_type": ([k for _, k in tokens], "INT32"),
        "tokenizer.ggml.merges": merges or [INERT_MERGE],
    }
    for name, key in SPECIAL_KEYS:
        text = tok.special_tokens.get(name)
        token_id = tok.token_to_id(text) if text is not None else None
        if token_id is not None:
            md[f"tokenizer.ggml.{key}"] = token_id
    md["tokenizer.ggml.add_bos_token"] = bool(tok.add_bos)
    if tok.chat_template:
        md["tokenizer.chat_template"] = tok.chat_template
    return md


__all__ = ["INERT_MERGE", "tokenizer_metadata"]
