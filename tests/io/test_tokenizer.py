"""load_tokenizer on tiny tokenizers built in the tests (docs/tokenizer.md).

Expected ids are derived by hand from each vocabulary (the derivation is in the comment beside
each case): for a directory, from the BPE merges written here; for a GGUF "llama" vocabulary,
from llama.cpp's SentencePiece rule (src/llama-vocab.cpp, llm_tokenizer_spm_session: merge the
adjacent pair whose merged token has the highest score, leftmost first; characters outside the
vocabulary become <0xNN> byte tokens; a space is prefixed to each text fragment when
add_space_prefix); for a GGUF "gpt2" vocabulary, from its merges and the split regex that
tokenizer.ggml.pre names. Chat templates are checked against hand-written strings.
"""

from __future__ import annotations

import json

import jinja2
import pytest
from tokenizers import AddedToken, Tokenizer, pre_tokenizers, processors
from tokenizers.models import BPE

from dflash_ref.errors import FormatError
from dflash_ref.io.gguf_io import GGUFFile
from dflash_ref.io.tokenizer import load_tokenizer, render_chat_template

# ------------------------------------------------------------------ a checkpoint directory

DIR_VOCAB = ["<s>", "</s>", "<unk>", "<|im_start|>", "<|im_end|>",  # 0-4 special
             "h", "e", "l", "o", "w", "r", "d", "he", "ll", "hell", "hello"]  # 5-15
DIR_MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o")]
# trim_blocks drops the newline after each {% %} tag, lstrip_blocks the indent before one:
# without them the output below would carry blank lines and four spaces per message
CHATML = ("{{ bos_token }}\n"
          "{% for m in messages %}\n"
          "    {% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}\n"
          "<|im_start|>{{ m['role'] }}\n"
          "{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}\n"
          "{% if add_generation_prompt %}\n"
          "<|im_start|>assistant\n"
          "{% endif %}")


def write_dir_tokenizer(path, *, config=None, bos_post_processor=True, jinja=None):
    tok = Tokenizer(BPE(vocab={t: i for i, t in enumerate(DIR_VOCAB)}, merges=DIR_MERGES,
                        unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True) for t in DIR_VOCAB[:5]])
    if bos_post_processor:
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", 0)])
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    if config is not None:
        (path / "tokenizer_config.json").write_text(json.dumps(config))
    if jinja is not None:
        (path / "chat_template.jinja").write_text(jinja)
    return path


CONFIG = {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True},
          "unk_token": "<unk>", "chat_template": CHATML}


def test_directory_ids_bos_and_special_tokens(tmp_path):
    tok = load_tokenizer(write_dir_tokenizer(tmp_path / "d", config=CONFIG))
    assert (tok.bos_token_id, tok.eos_token_id, tok.vocab_size) == (0, 1, 16)
    # no add_bos_token in the config: the post-processor "<s> $A" puts BOS first
    assert tok.add_bos
    # "hello": h e l l o -> he l l o -> he ll o -> hell o -> hello (15); "world" has no merge
    assert tok.encode("hello world") == [0, 15, 9, 8, 10, 7, 11]
    # "held": h e l d -> he l d
    assert tok.encode("held", add_bos=False) == [12, 7, 11]
    assert tok.encode("<|im_start|>hello<|im_end|>") == [0, 3, 15, 4]


def test_directory_bos_flag_in_config_wins(tmp_path):
    off = load_tokenizer(write_dir_tokenizer(tmp_path / "off", config={**CONFIG,
                                                                      "add_bos_token": False}))
    assert off.encode("hello") == [15]
    on = load_tokenizer(write_dir_tokenizer(tmp_path / "on", config={**CONFIG,
                                                                    "add_bos_token": True},
                                            bos_post_processor=False))
    assert on.encode("hello") == [0, 15]
    none = load_tokenizer(write_dir_tokenizer(tmp_path / "none", config=CONFIG,
                                              bos_post_processor=False))
    assert none.encode("hello") == [15]


def test_directory_decode_skips_special_tokens(tmp_path):
    tok = load_tokenizer(write_dir_tokenizer(tmp_path / "d", config=CONFIG))
    # no decoder in this tokenizer.json: `tokenizers` joins the kept tokens with one space
    assert tok.decode([0, 3, 15, 4, 12, 1]) == "hello he"


def test_directory_chat_template(tmp_path):
    tok = load_tokenizer(write_dir_tokenizer(tmp_path / "d", config=CONFIG))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert tok.apply_chat_template(messages) == (
        "<s>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert tok.apply_chat_template(messages[:1], add_generation_prompt=False) == (
        "<s>\n<|im_start|>user\nhi<|im_end|>\n")
    with pytest.raises(jinja2.TemplateError, match="no tools here"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_chat_template_variables_and_tojson(tmp_path):
    tok = load_tokenizer(write_dir_tokenizer(tmp_path / "d", config=CONFIG))
    template = "{{ eos_token }}|{{ unk_token }}|{{ messages[0]['content'] | tojson }}|{{ extra }}"
    # transformers' tojson is json.dumps(ensure_ascii=False): no HTML escaping of < > &,
    # no \u escapes; jinja2's built-in filter would give "\u003cb\u003e..."
    out = tok.apply_chat_template([{"role": "user", "content": "<b>é & 'q'</b>"}],
                                  chat_template=template, extra=3)
    assert out == "</s>|<unk>|\"<b>é & 'q'</b>\"|3"
    assert render_chat_template("{{ tools }}{{ documents }}{{ add_generation_prompt }}",
                                []) == "NoneNoneTrue"


def test_chat_template_from_jinja_file(tmp_path):
    config = {k: v for k, v in CONFIG.items() if k != "chat_template"}
    tok = load_tokenizer(write_dir_tokenizer(tmp_path / "d", config=config,
                                             jinja="[{{ messages[0]['content'] }}]"))
    assert tok.apply_chat_template([{"role": "user", "content": "x"}]) == "[x]"
    bare = load_tokenizer(write_dir_tokenizer(tmp_path / "bare", config=config))
    with pytest.raises(ValueError, match="no chat template"):
        bare.apply_chat_template([{"role": "user", "content": "x"}])


def test_directory_without_tokenizer_json(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "tokenizer.model").write_bytes(b"")
    with pytest.raises(FormatError, match=r"no tokenizer\.json.*tokenizer\.model"):
        load_tokenizer(tmp_path / "ckpt")
    with pytest.raises(FormatError, match="does not exist"):
        load_tokenizer(tmp_path / "missing")


# ------------------------------------------------------------------ GGUF files

NORMAL, UNKNOWN, CONTROL, USER, BYTE = 1, 2, 3, 4, 6


def write_tokenizer_gguf(path, arch, model, tokens, types, *, scores=None, merges=None,
                         pre=None, bos=None, eos=None, unk=None, pad=None, add_bos=None,
                         add_space_prefix=None, chat_template=None):
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    if model is not None:
        w.add_tokenizer_model(model)
        w.add_token_list(tokens)
        w.add_token_types(types)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    for value, add in ((bos, w.add_bos_token_id), (eos, w.add_eos_token_id),
                       (unk, w.add_unk_token_id), (pad, w.add_pad_token_id),
                       (add_bos, w.add_add_bos_token),
                       (add_space_prefix, w.add_add_space_prefix),
                       (chat_template, w.add_chat_template)):
        if value is not None:
            add(value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# A SentencePiece ("llama") vocabulary. "▁a" comes before "ab" in the file but scores lower,
# so a rule that ranked merges by position instead of score would give other ids.
LLAMA_TOKENS = ["<unk>", "<s>", "</s>", "<|turn|>", "<0xC3>", "<0xA9>",  # 0-5
                "▁", "a", "b", "c", "▁a", "ab", "bc", "▁c"]  # 6-13
LLAMA_TYPES = [UNKNOWN, CONTROL, CONTROL, CONTROL, BYTE, BYTE] + [NORMAL] * 8
LLAMA_SCORES = [0.0] * 6 + [-10.0] * 4 + [-5.0, -2.0, -3.0, -4.0]


@pytest.fixture
def llama_gguf(tmp_path):
    return write_tokenizer_gguf(tmp_path / "spm.gguf", "llama", "llama", LLAMA_TOKENS, LLAMA_TYPES,
                                scores=LLAMA_SCORES, bos=1, eos=2, unk=0, add_bos=True,
                                add_space_prefix=True, chat_template="{{ bos_token }}!")


@pytest.mark.parametrize("text, ids", [
    # " ab" -> ▁ a b; bigrams ▁a (-5), ab (-2): ab first; "▁ab" is not a token -> [▁, ab]
    ("ab", [1, 6, 11]),
    # ▁ a b c; bigrams ▁a -5, ab -2, bc -3: ab; then neither "▁ab" nor "abc" exists
    ("abc", [1, 6, 11, 9]),
    # ▁ c ▁ a: ▁c (-4) before ▁a (-5); both merge
    ("c a", [1, 13, 10]),
    # é = C3 A9 is not in the vocabulary: its UTF-8 bytes as <0xC3> <0xA9>
    ("é", [1, 6, 4, 5]),
    # the control token is one id; each text fragment gets its own prefix space: ▁a | ▁ b
    ("a<|turn|>b", [1, 10, 3, 6, 8]),
])
def test_gguf_llama_ids(llama_gguf, text, ids):
    assert load_tokenizer(llama_gguf).encode(text) == ids


def test_gguf_llama_attributes_and_decode(llama_gguf):
    tok = load_tokenizer(llama_gguf)
    assert (tok.bos_token_id, tok.eos_token_id, tok.vocab_size, tok.add_bos) == (1, 2, 14, True)
    # specials dropped; ▁a ▁ b -> " a b"; the prefix space is stripped again
    assert tok.decode([1, 10, 3, 6, 8, 2]) == "a b"
    assert tok.decode([6, 4, 5]) == "é"  # byte tokens fuse back into UTF-8
    assert tok.apply_chat_template([]) == "<s>!"  # tokenizer.chat_template
    assert load_tokenizer(GGUFFile(llama_gguf)).encode("ab") == [1, 6, 11]  # an open file


def test_gguf_llama_bos_flag(tmp_path):
    off = write_tokenizer_gguf(tmp_path / "off.gguf", "llama", "llama", LLAMA_TOKENS,
                               LLAMA_TYPES, scores=LLAMA_SCORES, bos=1, eos=2, add_bos=False)
    assert load_tokenizer(off).encode("ab") == [6, 11]
    # no flag: llama.cpp and transformers both add BOS to a SentencePiece vocabulary
    absent = write_tokenizer_gguf(tmp_path / "absent.gguf", "llama", "llama", LLAMA_TOKENS,
                                  LLAMA_TYPES, scores=LLAMA_SCORES, bos=1, eos=2)
    assert load_tokenizer(absent).encode("ab") == [1, 6, 11]


# Gemma's layout: no prefix space, "\n" and a run of spaces are USER_DEFINED tokens, the run
# stored as real spaces ("  "); merges follow file order (Gemma's scores are -position).
GEMMA_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>",  # 0-4
                "\n", "  ", "▁", "a", "b", "▁b"]  # 5-10
GEMMA_TYPES = [CONTROL] * 5 + [USER, USER] + [NORMAL] * 4
GEMMA_SCORES = [-1000.0] * 5 + [0.0, 0.0, -0.0, -1.0, -2.0, -3.0]


@pytest.fixture
def gemma_gguf(tmp_path):
    return write_tokenizer_gguf(tmp_path / "gemma.gguf", "gemma3", "llama", GEMMA_TOKENS,
                                GEMMA_TYPES, scores=GEMMA_SCORES, bos=2, eos=1, unk=3,
                                add_bos=True, add_space_prefix=False)


@pytest.mark.parametrize("text, ids", [
    ("a b", [2, 8, 10]),  # a▁b: (▁, b) -> ▁b
    # a▁▁b: (▁, ▁) -> "  " (6, spelled ▁▁) ranks before (▁, b) -> ▁b (10)
    ("a  b", [2, 8, 6, 9]),
    ("<start_of_turn>a\n", [2, 4, 8, 5]),  # control and user-defined tokens whole
    ("\n\n", [2, 5, 5]),
])
def test_gguf_gemma_ids(gemma_gguf, text, ids):
    assert load_tokenizer(gemma_gguf).encode(text) == ids


def test_gguf_special_tokens_read_under_gguf_pys_keys(tmp_path):
    # The file is written by gguf-py's own add_{bos,eos,unk,pad}_token_id (gguf.Keys.Tokenizer);
    # a chat template reads each by name. Catches a reader key respelled ("pad_token_id",
    # "unk_token_id"): the token would be None and the template would render it empty.
    path = write_tokenizer_gguf(tmp_path / "sp.gguf", "gemma3", "llama", GEMMA_TOKENS,
                                GEMMA_TYPES, scores=GEMMA_SCORES, bos=2, eos=1, unk=3, pad=0,
                                add_bos=True, add_space_prefix=False,
                                chat_template="{{ bos_token }}{{ eos_token }}{{ unk_token }}"
                                              "{{ pad_token }}")
    tok = load_tokenizer(path)
    assert tok.special_tokens == {"bos_token": "<bos>", "eos_token": "<eos>",
                                  "unk_token": "<unk>", "pad_token": "<pad>"}
    assert (tok.bos_token_id, tok.eos_token_id) == (2, 1)
    assert tok.apply_chat_template([]) == "<bos><eos><unk><pad>"


def test_gguf_gemma_decode(gemma_gguf):
    tok = load_tokenizer(gemma_gguf)
    assert tok.decode([2, 4, 8, 6, 9, 5, 1]) == "a  b\n"  # no prefix space to strip


# Byte-level BPE ("gpt2"): space is "Ġ" and newline "Ċ" in GPT-2's byte alphabet.
GPT2_TOKENS = ["h", "i", "Ġ", "t", "1", "2", "Ċ", "hi", "Ġt", "12",  # 0-9
               "<|im_start|>", "<|im_end|>", "<|endoftext|>"]  # 10-12
GPT2_TYPES = [NORMAL] * 10 + [CONTROL] * 3
GPT2_MERGES = ["h i", "Ġ t", "1 2"]


def gpt2_gguf(tmp_path, pre, **kw):
    return write_tokenizer_gguf(tmp_path / f"{pre}.gguf", "qwen2", "gpt2", GPT2_TOKENS,
                                GPT2_TYPES, merges=GPT2_MERGES, pre=pre, eos=12, **kw)


def test_gguf_gpt2_ids_follow_the_pre_tokenizer(tmp_path):
    qwen = load_tokenizer(gpt2_gguf(tmp_path, "qwen2"))
    # qwen2 splits "hi", " t", "\n", "1", "2" (one digit per piece): "1 2" cannot merge
    assert qwen.encode("hi t\n12") == [7, 8, 6, 4, 5]
    # GPT-2's regex keeps " ?\p{N}+" together: "12" merges
    assert load_tokenizer(gpt2_gguf(tmp_path, "gpt-2")).encode("hi t\n12") == [7, 8, 6, 9]
    assert qwen.encode("<|im_start|>hi<|im_end|>") == [10, 7, 11]
    assert (qwen.add_bos, qwen.bos_token_id, qwen.eos_token_id) == (False, None, 12)
    assert qwen.decode([10, 7, 8, 6, 11, 12]) == "hi t\n"


def test_gguf_gpt2_bos_flag(tmp_path):
    tok = load_tokenizer(gpt2_gguf(tmp_path, "qwen2", bos=12, add_bos=True))
    assert tok.encode("hi") == [12, 7]


def test_gguf_errors(tmp_path):
    with pytest.raises(FormatError, match=r"no tokenizer metadata.*convert_hf_to_gguf"):
        load_tokenizer(write_tokenizer_gguf(tmp_path / "none.gguf", "llama", None, [], []))
    bert = write_tokenizer_gguf(tmp_path / "bert.gguf", "bert", "bert", ["[CLS]"], [CONTROL])
    with pytest.raises(FormatError, match=r"tokenizer\.ggml\.model='bert'.*'llama', 'gpt2'"):
        load_tokenizer(bert)
    with pytest.raises(FormatError, match=r"tokenizer\.ggml\.pre='mystery'.*known"):
        load_tokenizer(gpt2_gguf(tmp_path, "mystery"))
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf")
    with pytest.raises(FormatError, match="not a GGUF file"):
        load_tokenizer(tmp_path / "junk.gguf")
