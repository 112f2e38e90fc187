"""``dflash-ref generate --chat``: what the CLI sends the model.

No earlier test passed ``--chat`` through the CLI, so a chat path that added a second BOS, lost
the generation prompt or split the special tokens into text went unseen. The expected ids are
written by hand from the template and the vocabulary below (one user turn, the template's own
BOS and nothing else added, each special token one id).
"""

from __future__ import annotations

import json

import pytest

from dflash_ref.cli import main
from dflash_ref.io.tokenizer import load_tokenizer
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode import loop
from dflash_ref.tiny import write_tiny_target

tokenizers = pytest.importorskip("tokenizers")

SPECIAL = {"<s>": 250, "<|user|>": 251, "<|end|>": 252, "<|assistant|>": 253}
TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>"
            "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _chat_tokenizer(path):
    """Words 'w0'..'w249' and four special tokens at ids 250..253; the config asks for BOS, so
    plain text gets one, and a chat template that writes its own must not get a second."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(250)} | SPECIAL | {"w254": 254, "w255": 255}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "<|end|>", "add_bos_token": True,
        "chat_template": TEMPLATE}))


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    t = write_tiny_target(tmp_path_factory.mktemp("cli_chat") / "t", "qwen3", seed=5)
    _chat_tokenizer(t)
    return t


def _sent(monkeypatch):
    """Record the ids and stop tokens the CLI hands to generate()."""
    sent = {}
    real = loop.generate

    def spy(target, drafter, ids, n, **kw):
        sent.update(ids=[int(i) for i in ids], stops=list(kw.get("stop_token_ids") or []))
        return real(target, drafter, ids, n, **kw)

    monkeypatch.setattr(loop, "generate", spy)
    return sent


def test_generate_chat_sends_one_bos_the_turn_and_the_generation_prompt(target_dir, capsys,
                                                                           monkeypatch):
    sent = _sent(monkeypatch)
    argv = ["generate", "--target", str(target_dir), "--prompt", "w3 w17 w42", "--chat",
            "--max-new-tokens", "5", "--backend", "numpy"]
    assert main(argv) == 0
    # <s> <|user|> w3 w17 w42 <|end|> <|assistant|>: the template's BOS only, specials whole
    expected = [250, 251, 3, 17, 42, 252, 253]
    assert sent["ids"] == expected
    assert sent["stops"] == [252]  # eos_token
    out = capsys.readouterr().out.splitlines()
    # --chat prints the continuation only (not the rendered template), then the statistics
    target, tok = TargetModel.from_pretrained(target_dir), load_tokenizer(target_dir)
    cont = loop.generate(target, None, expected, 5, stop_token_ids=[252]).tokens
    assert out[0] == tok.decode(expected + cont)[len(tok.decode(expected)):]
    assert out[1].startswith(f"[{len(cont)} tokens, tau ")


def test_generate_without_chat_adds_the_configured_bos(target_dir, capsys, monkeypatch):
    sent = _sent(monkeypatch)
    argv = ["generate", "--target", str(target_dir), "--prompt", "w3 w17 w42",
            "--max-new-tokens", "2", "--backend", "numpy"]
    assert main(argv) == 0
    assert sent["ids"] == [250, 3, 17, 42]  # add_bos_token: one BOS, then the words


def test_generate_stops_at_generation_configs_end_of_turn_too(tmp_path_factory, monkeypatch):
    # A directory whose generation_config.json lists EOS and an end-of-turn id (Gemma's
    # [1, 106]): the CLI hands generate both, as transformers' generate stops at both. Catches
    # the CLI passing eos_token_id alone (a chat turn would run past its end).
    t = write_tiny_target(tmp_path_factory.mktemp("cli_stops") / "t", "qwen3", seed=5)
    _chat_tokenizer(t)
    (t / "generation_config.json").write_text(json.dumps({"eos_token_id": [252, 254]}))
    sent = _sent(monkeypatch)
    assert main(["generate", "--target", str(t), "--prompt", "w3", "--chat",
                 "--max-new-tokens", "2", "--backend", "numpy"]) == 0
    assert sent["stops"] == [252, 254]
