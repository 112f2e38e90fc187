"""Text <-> token ids for a checkpoint directory or a GGUF file; chat templates (docs/tokenizer.md).

:func:`load_tokenizer` returns a :class:`Tokenizer` backed by a ``tokenizers.Tokenizer``:

- **a directory** holding ``tokenizer.json`` is loaded as it is; ``tokenizer_config.json``
  names the special tokens, says whether BOS is added and may hold the chat template
  (else ``chat_template.jinja`` does);
- **a GGUF file** has no ``tokenizer.json``: its ``tokenizer.ggml.*`` metadata is rebuilt into a
  ``tokenizers`` pipeline, for the two tokenizer models in use (``tokenizer.ggml.model``):

  ``"llama"`` (SentencePiece; Llama 2, Gemma): normalizer ``[Prepend("▁") if
  add_space_prefix] + Replace(" ", "▁")``; a custom pre-tokenizer cutting the text into pieces
  by llama.cpp's rule (``src/llama-vocab.cpp``, ``llm_tokenizer_spm_session``: merge the
  adjacent pair whose merged token has the highest ``tokenizer.ggml.scores`` entry, leftmost
  first; :func:`~dflash_ref.io.spm.spm_pieces`); model
  ``BPE(byte_fallback=True, ignore_merges=True)`` mapping each piece to its id and an unknown
  character to ``<0xNN>`` byte tokens; decoder
  ``Replace("▁", " "), ByteFallback, Fuse [, Strip one leading space if add_space_prefix]``.
  (A BPE merge list ranked by score is not the same: it breaks ties between different merged
  tokens of equal score by rank, not by position.)

  ``"gpt2"`` (byte-level BPE; Qwen): model ``BPE`` with ``tokenizer.ggml.merges`` in file order;
  pre-tokenizer ``Split(regex named by tokenizer.ggml.pre, isolated)`` then
  ``ByteLevel(use_regex=False)``; decoder ``ByteLevel``.

  In both, tokens of type CONTROL (3) become special added tokens and USER_DEFINED (4) plain
  added tokens, so ``<start_of_turn>`` or ``<|im_start|>`` in the text is one id. This follows
  transformers ``src/transformers/integrations/gguf/gguf_tokenizer_mapping.py`` (the GGUF
  tokenizer builders) and ``src/transformers/integrations/ggml.py`` (GGUFLlamaConverter,
  GGUFGPTConverter in older releases), including its two Gemma rules (see
  :func:`_llama_backend`).

**BOS rule.** :meth:`Tokenizer.encode` prepends BOS exactly when the checkpoint says so: GGUF
``tokenizer.ggml.add_bos_token`` (absent: True for "llama", as llama.cpp and transformers do;
for "gpt2" True only for the llama3 pre-tokenizers, as llama.cpp does); a directory's
``tokenizer_config.json`` ``add_bos_token`` (absent: whether the ``tokenizer.json``
post-processor puts the BOS token first). EOS is never added.

**Chat templates** are rendered by :mod:`dflash_ref.io.chat_template` (jinja2, the way
transformers' ``apply_chat_template`` does), with the special-token strings (``bos_token``,
``eos_token``, ...) as template variables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.chat_template import render_chat_template
from dflash_ref.io.gguf_io import GGUFFile
from dflash_ref.io.json_file import read_json
from dflash_ref.io.spm import SpmPreTokenizer
from dflash_ref.io.stop_tokens import generation_config_eos, gguf_stop_ids

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type; gguf.TokenType)
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED, TOKEN_BYTE = (
    range(1, 7))
SPACE_MARK = "\u2581"  # "▁", SentencePiece's visible space
GGUF_TOKENIZER_MODELS = ("llama", "gpt2")
_GEMMA_ARCHES = ("gemma", "gemma2", "gemma3")  # the two Gemma rules in _llama_backend

# Pre-tokenizer split patterns named by tokenizer.ggml.pre (the originals in each model's
# tokenizer.json; llama.cpp src/llama-vocab.cpp, llm_tokenizer_bpe, spells the same patterns).
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_QWEN2_SPLIT = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35_SPLIT = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                 r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_PRE_SPLITS: dict[str, str | None] = {  # None: GPT-2's own regex (ByteLevel(use_regex=True))
    "default": None, "gpt-2": None, "gpt2": None,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
    "qwen35": _QWEN35_SPLIT,
    "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
}
_BOS_BY_DEFAULT_PRES = ("llama3", "llama-v3", "llama-bpe")  # llama.cpp sets add_bos for these

# the named special tokens a chat template may read (transformers SPECIAL_TOKENS_ATTRIBUTES)
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                       "cls_token", "mask_token")


class Tokenizer:
    """Text <-> ids for one checkpoint. Build it with :func:`load_tokenizer`.

    Attributes: ``bos_token_id`` / ``eos_token_id`` (int or None), ``stop_token_ids`` (the ids
    that end a generation, EOS among them: :mod:`dflash_ref.io.stop_tokens`), ``vocab_size``
    (ids the tokenizer can produce, added tokens included), ``add_bos`` (the BOS rule, module
    docstring), ``special_tokens`` (name -> string, e.g. ``{"bos_token": "<bos>"}``),
    ``chat_template`` (str or None), ``backend`` (the ``tokenizers.Tokenizer``), ``source``
    (where it came from).
    """

    def __init__(self, backend, *, special_tokens: Mapping[str, str], add_bos: bool,
                 chat_template: str | None, source: str, stop_ids: Sequence[int] = ()):
        self.backend = backend
        self.special_tokens = {k: v for k, v in special_tokens.items() if v is not None}
        self.add_bos = bool(add_bos)
        self.chat_template = chat_template
        self.source = source
        self.bos_token_id = self._id_of("bos_token")
        self.eos_token_id = self._id_of("eos_token")
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        eos = () if self.eos_token_id is None else (self.eos_token_id,)
        self.stop_token_ids = tuple(sorted({int(i) for i in (*eos, *stop_ids)}))
        if self.add_bos and self.bos_token_id is None:
            raise FormatError(f"{source} says to add a BOS token but names none that is in its "
                              f"vocabulary (bos_token={self.special_tokens.get('bos_token')!r}); "
                              "fix the checkpoint's tokenizer metadata")

    def _id_of(self, name: str) -> int | None:
        token = self.special_tokens.get(name)
        return None if token is None else self.backend.token_to_id(token)

    def __repr__(self) -> str:
        return (f"Tokenizer({self.source!r}, vocab_size={self.vocab_size}, "
                f"bos={self.bos_token_id}, eos={self.eos_token_id}, add_bos={self.add_bos})")

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Ids of ``text``; special tokens written in it are single ids.

        BOS is prepended when ``add_bos`` (default: the checkpoint's rule, ``self.add_bos``).
        Pass ``add_bos=False`` for text that already starts with BOS, such as a chat template's
        output whose template writes ``{{ bos_token }}`` (Gemma's does).
        """
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if self.add_bos if add_bos is None else add_bos:
            if self.bos_token_id is None:
                raise ValueError(f"{self.source} has no BOS token; call encode(..., add_bos=False)")
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` with special (CONTROL) tokens such as BOS/EOS left out.

        Raises :class:`~dflash_ref.errors.ConfigError` for an id outside [0, vocab_size) (the
        fast tokenizer would drop it and return less text without a word)."""
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ConfigError(f"decode: ids {bad[:8]} are outside this tokenizer's vocabulary "
                              f"[0, {self.vocab_size}) ({self.source}); decode ids made by the "
                              f"model this tokenizer belongs to")
        return self.backend.decode(ids, skip_special_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        """Id of one vocabulary entry spelled as stored ("<start_of_turn>", "▁the"), else None."""
        return self.backend.token_to_id(token)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True, *,
                            chat_template: str | None = None, **kwargs: Any) -> str:
        """The prompt text for ``messages`` (``[{"role": "user", "content": "..."}, ...]``).

        Rendered from ``chat_template`` if given, else the checkpoint's own template; ``kwargs``
        become extra template variables (``tools=...``, ``enable_thinking=False``, ...).
        Returns text: encode it with ``encode(text, add_bos=False)`` when it starts with BOS.
        """
        template = chat_template if chat_template is not None else self.chat_template
        if template is None:
            raise ValueError(
                f"{self.source} has no chat template (no tokenizer.chat_template in a GGUF, no "
                "chat_template in tokenizer_config.json or chat_template.jinja in a directory); "
                "base models usually have none: use encode() on plain text, or pass "
                "chat_template=... with the instruct model's template")
        variables = {**self.special_tokens, **kwargs}
        where = ("the chat_template passed" if chat_template is not None
                 else f"the chat template of {self.source}")
        return render_chat_template(template, messages, add_generation_prompt,
                                    template_source=where, **variables)


# ---------------------------------------------------------------------------- loading


def load_tokenizer(path: str | Path | GGUFFile) -> Tokenizer:
    """The tokenizer of a checkpoint directory (``tokenizer.json``) or of a ``.gguf`` file.

    An already opened :class:`~dflash_ref.io.gguf_io.GGUFFile` is accepted too: parsing a
    262k-token vocabulary is most of the time it takes to open a GGUF, so a caller that loads
    the model from the same file should open it once.
    """
    if isinstance(path, GGUFFile):
        return _from_gguf(path)
    path = Path(path)
    if path.is_dir():
        return _from_directory(path)
    if path.is_file():
        return _from_gguf(GGUFFile(path))
    raise FormatError(f"{path} does not exist; pass a checkpoint directory holding "
                      "tokenizer.json, or a .gguf file")


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, Mapping):
        return value.get("content")
    return value if isinstance(value, str) else None


def _from_directory(path: Path) -> Tokenizer:
    from tokenizers import Tokenizer as Backend

    tokenizer_json = path / "tokenizer.json"
    if not tokenizer_json.is_file():
        present = sorted(p.name for p in path.iterdir())
        raise FormatError(
            f"{path} has no tokenizer.json (it holds {present}); dflash-ref reads the fast "
            "tokenizer format only: save one with transformers "
            "(AutoTokenizer.from_pretrained(...).save_pretrained(dir)) or pass the GGUF file")
    try:
        backend = Backend.from_file(str(tokenizer_json))
    except Exception as e:  # the tokenizers library raises a bare Exception
        raise FormatError(f"{tokenizer_json} is not a tokenizer the tokenizers library can read "
                          f"({e}); re-save it with transformers (AutoTokenizer.from_pretrained"
                          f"(...).save_pretrained(dir)) or restore the original file") from e
    config_path = path / "tokenizer_config.json"
    config = read_json(config_path, "the tokenizer then uses tokenizer.json's defaults")
    if config is None:
        config = {}
    elif not isinstance(config, dict):
        raise FormatError(f"{config_path} holds a JSON {type(config).__name__}, expected an "
                          f"object {{...}}; fix the file or remove it")
    special = {name: _token_text(config.get(name)) for name in SPECIAL_TOKEN_NAMES}
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default")
    jinja_file = path / "chat_template.jinja"
    if template is None and jinja_file.is_file():
        template = jinja_file.read_text(encoding="utf-8")
    add_bos = config.get("add_bos_token")
    if not isinstance(add_bos, bool):  # the post-processor decides (TemplateProcessing)
        bos_id = backend.token_to_id(special["bos_token"]) if special["bos_token"] else None
        first = backend.encode("", add_special_tokens=True).ids[:1]
        add_bos = bos_id is not None and first == [bos_id]
    return Tokenizer(backend, special_tokens=special, add_bos=add_bos, chat_template=template,
                     source=str(path), stop_ids=generation_config_eos(path))


def _from_gguf(gguf: GGUFFile) -> Tokenizer:
    path = gguf.path
    meta = gguf.metadata
    model = meta.get("tokenizer.ggml.model")
    if model is None or "tokenizer.ggml.tokens" not in meta:
        raise FormatError(
            f"{path.name} has no tokenizer metadata (tokenizer.ggml.model and "
            "tokenizer.ggml.tokens are missing); it was written without a vocabulary: "
            "re-convert it with llama.cpp's convert_hf_to_gguf.py, or load the tokenizer from "
            "the HF checkpoint directory (tokenizer.json)")
    if model not in GGUF_TOKENIZER_MODELS:
        raise FormatError(
            f"{path.name} has tokenizer.ggml.model={model!r}; dflash-ref reads "
            f"{list(GGUF_TOKENIZER_MODELS)} (SentencePiece BPE and byte-level BPE); load the "
            "tokenizer from the model's HF directory (tokenizer.json) instead")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens))
    if len(types) != len(tokens):
        raise FormatError(f"{path.name}: tokenizer.ggml.token_type has {len(types)} entries but "
                          f"tokenizer.ggml.tokens has {len(tokens)}; the file is inconsistent")
    if model == "llama":
        backend, spelled = _llama_backend(meta, tokens, types, gguf.arch, path.name)
        add_bos_default = True
    else:
        backend, spelled = _gpt2_backend(meta, tokens, types, path.name)
        add_bos_default = meta.get("tokenizer.ggml.pre") in _BOS_BY_DEFAULT_PRES
    special = {}
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        token_id = meta.get(f"tokenizer.ggml.{key}")
        special[name] = spelled[token_id] if token_id is not None else None
    add_bos = meta.get("tokenizer.ggml.add_bos_token", add_bos_default)
    return Tokenizer(backend, special_tokens=special, add_bos=add_bos,
                     chat_template=meta.get("tokenizer.chat_template"), source=str(path),
                     stop_ids=gguf_stop_ids(meta, tokens))


def _added_tokens(backend, spelled: Sequence[str], types: Sequence[int],
                  keep: Sequence[bool] | None = None):
    """CONTROL tokens as special added tokens (those ``keep`` allows), USER_DEFINED ones as
    plain added tokens: both are then matched whole in the text before the model runs."""
    from tokenizers import AddedToken

    keep = [True] * len(spelled) if keep is None else keep
    vocab = backend.get_vocab()
    control = [AddedToken(t, normalized=False, special=True)
               for t, k, ok in zip(spelled, types, keep) if k == TOKEN_CONTROL and ok]
    user = [AddedToken(t, normalized=False, special=False)
            for t, k in zip(spelled, types) if k == TOKEN_USER_DEFINED and t in vocab]
    backend.add_special_tokens(control)
    backend.add_tokens(user)


def _llama_backend(meta: Mapping[str, Any], tokens: list[str], types: list[int],
                   arch: str | None, name: str):
    """SentencePiece from ``tokenizer.ggml.{tokens,scores,token_type,add_space_prefix}``.

    Two Gemma rules (transformers' ``gemma_tokenizer`` GGUF builder): a token made only of
    spaces is stored as real spaces ("  ") but matched as "▁▁", so it is respelled; and a merged
    token scores minus its file position, which for Gemma 3's NORMAL tokens is the same order as the
    scores (its scores are minus the position among them).
    """
    from tokenizers import Tokenizer as Backend
    from tokenizers import decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    is_gemma = arch in _GEMMA_ARCHES
    if is_gemma:
        tokens = [SPACE_MARK * len(t) if " " in t and not t.strip() else t for t in tokens]
        scores = [-float(i) for i in range(len(tokens))]
    else:
        scores = meta.get("tokenizer.ggml.scores")
        if scores is None or len(scores) != len(tokens):
            raise FormatError(f"{name}: tokenizer.ggml.scores is missing or has the wrong length; "
                              "a 'llama' (SentencePiece) vocabulary needs one score per token")
    vocab = {t: i for i, t in enumerate(tokens)}
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else None
    backend = Backend(BPE(vocab=vocab, merges=[], unk_token=unk, fuse_unk=True,
                          byte_fallback=True, ignore_merges=True))
    backend.pre_tokenizer = pre_tokenizers.PreTokenizer.custom(
        SpmPreTokenizer({t: float(s) for t, s in zip(tokens, scores)}))
    add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    steps = [normalizers.Prepend(SPACE_MARK)] if add_space_prefix else []
    backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", SPACE_MARK)])
    decode = [decoders.Replace(SPACE_MARK, " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        decode.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(decode)
    _added_tokens(backend, tokens, types)
    return backend, tokens


def byte_level_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character table (openai/gpt-2 ``src/encoder.py``)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in table:
            table[b], extra = chr(256 + extra), extra + 1
    return table


def _gpt2_backend(meta: Mapping[str, Any], tokens: list[str], types: list[int], name: str):
    """Byte-level BPE from ``tokenizer.ggml.{tokens,merges,pre,token_type}``."""
    from tokenizers import Regex, decoders, pre_tokenizers
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import BPE

    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in GPT2_PRE_SPLITS:
        raise FormatError(
            f"{name} has tokenizer.ggml.pre={pre!r}, a pre-tokenizer dflash-ref does not know; "
            f"known: {sorted(GPT2_PRE_SPLITS)}; add its split regex (llama.cpp "
            "src/llama-vocab.cpp, llm_tokenizer_bpe) to GPT2_PRE_SPLITS")
    merges_meta = meta.get("tokenizer.ggml.merges")
    if not merges_meta:
        raise FormatError(f"{name}: tokenizer.ggml.model='gpt2' needs tokenizer.ggml.merges, "
                          "which is missing; re-convert the model with llama.cpp")
    merges = []
    for m in merges_meta:
        parts = m.split(" ")
        if len(parts) != 2:
            raise FormatError(f"{name}: merge {m!r} is not two tokens separated by one space")
        merges.append((parts[0], parts[1]))
    alphabet = byte_level_alphabet()
    letters = set(alphabet.values())
    # a token outside the byte alphabet (a raw special such as "<|im_start|>" is inside it)
    # is spelled byte by byte, as transformers' byte_level_tokenizer does
    spelled = [t if set(t) <= letters else "".join(alphabet[b] for b in t.encode("utf-8"))
               for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}
    # a merge whose product is no token cannot make an id (llama.cpp spells such a symbol byte by
    # byte); tokenizers refuses it, so it is dropped (io/vocab_gguf.py INERT_MERGE is one)
    merges = [(a, b) for a, b in merges if a + b in vocab]
    backend = Backend(BPE(vocab=vocab, merges=merges))
    split = GPT2_PRE_SPLITS[pre]
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    # a CONTROL token outside the byte alphabet is a mislabel: skipped (transformers does too)
    _added_tokens(backend, spelled, types, keep=[set(t) <= letters for t in tokens])
    return backend, spelled
