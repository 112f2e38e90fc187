"""Run llama.cpp's convert_hf_to_gguf.py on a checkpoint it would refuse for its vocabulary only.

    python tests/llamacpp/run_llamacpp_converter.py LLAMACPP_SRC [convert_hf_to_gguf.py args]

Two things in llama.cpp's converter stop it before any weight is read, and both are about the
tokenizer, not the model (docs/interop.md, "Both converters agree"):

1. ``TextModel.get_vocab_base_pre`` names a byte-level pre-tokenizer by the SHA-256 of the ids
   of a fixed text; the demo's 256-byte vocabulary is in no list, so it raises
   ``NotImplementedError("BPE pre-tokenizer was not recognized")``. Here an unrecognised hash
   is named ``"default"``, what dflash-ref writes for a vocabulary without merges (no split can
   change its ids).
2. Qwen's ``set_vocab`` tries SentencePiece first and falls back to GPT-2 BPE on
   ``FileNotFoundError``; without the ``sentencepiece`` package installed the import fails
   first. Here a missing ``tokenizer.model`` raises FileNotFoundError before the import, as it
   does with the package.

Everything else (tensor names, shapes, metadata) is llama.cpp's own code, unchanged.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main() -> None:
    src = Path(sys.argv[1])
    sys.path[:0] = [str(src / "gguf-py"), str(src)]
    sys.argv = [str(src / "convert_hf_to_gguf.py"), *sys.argv[2:]]
    import convert_hf_to_gguf as conv
    from conversion.base import TextModel

    original_pre = TextModel.get_vocab_base_pre
    original_spm = TextModel._create_vocab_sentencepiece

    def vocab_base_pre(self, tokenizer):
        try:
            return original_pre(self, tokenizer)
        except NotImplementedError:
            return "default"

    def create_vocab_sentencepiece(self):
        if not (self.dir_model / "tokenizer.model").is_file():
            raise FileNotFoundError(f"File not found: {self.dir_model / 'tokenizer.model'}")
        return original_spm(self)

    TextModel.get_vocab_base_pre = vocab_base_pre
    TextModel._create_vocab_sentencepiece = create_vocab_sentencepiece
    conv.main()


if __name__ == "__main__":
    main()
