"""Where a generation ends: the stop token ids of a checkpoint directory or a GGUF file
(``Tokenizer.stop_token_ids``; docs/tokenizer.md, "Where a generation stops").

A directory: EOS and ``generation_config.json``'s ``eos_token_id`` (an id or a list: Gemma's
``[1, 106]``, ``<end_of_turn>`` included), as transformers' ``generate`` stops. A GGUF: llama.cpp's
end-of-generation set (``src/llama-vocab.cpp``, ``special_eog_ids``): EOS, the ids of
``tokenizer.ggml.{eot,eom,fim_pad,fim_rep,fim_sep}_token_id``, and every token spelled as one of
:data:`EOG_TEXTS` (``<end_of_turn>``, ``<|im_end|>``, ``<|eot_id|>``, ...), less ``<|end|>``
where ``<|return|>`` or ``<|flush|>`` and ``<|call|>`` or ``<|calls|>`` end generations too, and
``</s>`` where ``<|tool_response>`` or ``<|plamo:eos|>`` does; llama.cpp also finds FIM tokens by
their text, which this leaves to their keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dflash_ref.errors import FormatError
from dflash_ref.io.json_file import read_json

EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~["})
"""Tokens that end a generation by their text: llama.cpp's list (``src/llama-vocab.cpp``, build
11434, where ``special_eog_ids`` is filled)."""
EOG_KEYS = ("eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep")
"""``tokenizer.ggml.<key>_token_id``: ids that end a generation whatever their text."""


def gguf_stop_ids(meta: Mapping[str, Any], tokens: Sequence[str]) -> list[int]:
    """llama.cpp's end-of-generation ids of a GGUF vocabulary ``tokens`` (module
    docstring)."""
    ids = {int(meta[f"tokenizer.ggml.{k}_token_id"]) for k in EOG_KEYS
           if meta.get(f"tokenizer.ggml.{k}_token_id") is not None}
    ids |= {i for i, t in enumerate(tokens) if t in EOG_TEXTS}
    ids = {i for i in ids if 0 <= i < len(tokens)}
    texts = {tokens[i]: i for i in ids}
    call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and call and ("<|return|>" in texts or "<|flush|>" in texts):
        ids.discard(texts["<|end|>"])  # o200k_harmony, solar-open: <|end|> ends a message only
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        ids.discard(texts["</s>"])  # gemma4, plamo: a normal token
    return sorted(ids)


def generation_config_eos(directory: Path) -> list[int]:
    """``generation_config.json``'s ``eos_token_id`` in ``directory`` (an id or a list), [] without
    the file or the key."""
    path = directory / "generation_config.json"
    config = read_json(path, "generation then stops at the tokenizer's EOS only")
    eos = config.get("eos_token_id") if isinstance(config, dict) else None
    eos = [eos] if isinstance(eos, int) and not isinstance(eos, bool) else eos
    if eos is None:
        return []
    if not (isinstance(eos, list) and all(isinstance(i, int) and not isinstance(i, bool)
                                          and i >= 0 for i in eos)):
        raise FormatError(f"{path}: eos_token_id is {eos!r}, expected a token id or a "
                          f"list of them; fix the file or remove the key")
    return eos
