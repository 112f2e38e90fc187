"""``dflash-ref generate``: prompt text in, the greedy continuation's text out, then statistics."""

from __future__ import annotations

import pytest

from dflash_ref.cli import main
from dflash_ref.io.tokenizer import load_tokenizer
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target

tokenizers = pytest.importorskip("tokenizers")


def _word_tokenizer(path):
    """A word-level tokenizer over the tiny target's 256 ids: 'w0' .. 'w255', space-separated."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(256)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(path / "tokenizer.json"))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_generate")
    t = write_tiny_target(root / "t", "qwen3", seed=5, tie_word_embeddings=False)
    d = write_tiny_drafter(root / "d", t, seed=6)
    _word_tokenizer(t)
    return t, d


@pytest.mark.parametrize("with_drafter", [False, True])
def test_generate_prints_the_continuation_text_then_stats(pair, capsys, with_drafter):
    t, d = pair
    argv = ["generate", "--target", str(t), "--prompt", "w3 w17 w42", "--max-new-tokens", "6",
            "--backend", "numpy"] + (["--drafter", str(d)] if with_drafter else [])
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    # Expected: the same greedy continuation, decoded by the tokenizer, after the prompt.
    target = TargetModel.from_pretrained(t)
    drafter = DFlashDrafter.from_pretrained(d, target) if with_drafter else None
    tok = load_tokenizer(t)
    ids = generate(target, drafter, tok.encode("w3 w17 w42"), 6).tokens
    prompt = tok.encode("w3 w17 w42")
    assert out[0] == tok.decode(prompt + ids)
    assert out[0].split() == ["w3", "w17", "w42"] + [f"w{i}" for i in ids]
    assert out[1].startswith("[6 tokens, tau ")


def test_draft_p_min_reaches_the_loop_as_the_cut_chain_and_keeps_the_text(pair, capsys,
                                                                          monkeypatch):
    # Catches the option parsed but never handed to generate (the plain chain verifies), or
    # handed with another p_min.
    import dflash_ref.spec_decode.loop as loop
    from dflash_ref.spec_decode.confident_verify import ConfidentChainVerifier

    t, d = pair
    seen = []
    monkeypatch.setattr(loop, "generate", lambda *a, **kw: (
        seen.append(kw["verify"]), generate(*a, **kw))[1])
    base = ["generate", "--target", str(t), "--prompt", "w3 w17 w42", "--max-new-tokens", "6",
            "--backend", "numpy", "--drafter", str(d)]
    assert main(base) == 0
    plain_chain = capsys.readouterr().out.splitlines()[0]
    assert main(base + ["--draft-p-min", "0.25"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == plain_chain
    assert seen[0] == "chain" and seen[1] == ConfidentChainVerifier(p_min=0.25)


def test_generate_refuses_sampling_without_a_seed(pair, capsys):
    t, _ = pair
    assert main(["generate", "--target", str(t), "--prompt", "w1", "--temperature", "1"]) == 2
    assert "--seed" in capsys.readouterr().err


def test_chat_template_file_wraps_the_prompt_on_a_checkpoint_without_one(pair, tmp_path, capsys,
                                                                         monkeypatch):
    """Issue 25 item 4: ``--chat`` on a checkpoint without a template needs a way to give one.
    The file's template puts w1 before and w2 after the user text, so the ids the loop gets are
    known by hand: w1 w3 w17 w2 = [1, 3, 17, 2]."""
    import dflash_ref.spec_decode.loop as loop

    t, _ = pair
    template = tmp_path / "chat.jinja"
    template.write_text("w1 {{ messages[0]['content'] }} w2")
    seen = []
    monkeypatch.setattr(loop, "generate", lambda tg, d, ids, *a, **kw: (
        seen.append(list(ids)), generate(tg, d, ids, *a, **kw))[1])
    argv = ["generate", "--target", str(t), "--prompt", "w3 w17", "--max-new-tokens", "2",
            "--backend", "numpy", "--chat", "--chat-template", str(template)]
    assert main(argv) == 0
    assert seen == [[1, 3, 17, 2]]
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("[2 tokens")


def test_shipped_chat_template_names_resolve_and_parse():
    from dflash_ref.cli_generate import chat_template_names, read_chat_template

    assert "gemma3" in chat_template_names()
    assert "<start_of_turn>" in read_chat_template("gemma3")
