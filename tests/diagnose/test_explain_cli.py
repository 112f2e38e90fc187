"""``dflash-ref explain`` end to end on the shipped pair: the report, the figures, --text and
--compare (the bad inputs are rows of tests/test_bad_inputs_cli.py)."""

from __future__ import annotations

import io
import sys
from pathlib import Path

from dflash_ref.cli import main

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def test_explain_on_the_shipped_pair_writes_the_figures(tmp_path, capsys):
    rc = main(["explain", "--ablations", "features zeroed", "--max-new-tokens", "16",
               "--plot", str(tmp_path / "figs")])
    out = capsys.readouterr().out
    assert rc == 0
    assert out.startswith("tau ") and "ablation features zeroed" in out
    assert "check mask token id    ok   257 is the added token '<|mask|>'" in out
    for name in ("acceptance.png", "context.png", "ablations.png"):
        data = (tmp_path / "figs" / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n"


def test_explain_text_goes_through_the_byte_tokenizer(capsys):
    rc = main(["explain", "--target", str(Path(__file__).resolve().parents[2] / "dflash_ref"
                                          / "data" / "demo" / "target"),
               "--drafter", str(Path(__file__).resolve().parents[2] / "dflash_ref" / "data"
                                / "demo" / "drafter"),
               "--text", "\tdef put(self, item):\n\t\treturn self._put(item)\n",
               "--ablations", "none", "--max-new-tokens", "12"])
    out = capsys.readouterr().out
    assert rc == 0 and "prompts did not go through the chat template" in out


def test_explain_compare(capsys):
    case = str(GOLDEN / "qwen3_chain")
    assert main(["explain", "--compare", case, case]) == 0
    assert capsys.readouterr().out.startswith("EQUAL")


def test_dflash_ref_explain_is_the_function():
    import dflash_ref
    from dflash_ref.diagnose import explain

    assert dflash_ref.explain is explain


DEMO = Path(__file__).resolve().parents[2] / "dflash_ref" / "data" / "demo"
TEXT = "\tdef put(self, item):\n\t\treturn self._put(item)\n"


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def _tau(out: str) -> str:
    return out.splitlines()[0].split(" over ")[0]


def test_explain_loads_a_gguf_pair_with_the_ggufs_tokenizer(capsys):
    # the GGUF pair is the directory pair converted (tests/test_demo_checkpoints.py: same
    # tokens), and the GGUF's own vocabulary encodes --text: the same report's first line.
    # Catches a GGUF target refused or read without its tokenizer, a GGUF drafter loaded as
    # a directory
    common = ["--text", TEXT, "--ablations", "none", "--max-new-tokens", "12"]
    assert main(["explain", "--target", str(DEMO / "gguf" / "target.gguf"), "--drafter",
                 str(DEMO / "gguf" / "drafter.gguf"), *common]) == 0
    gguf = capsys.readouterr().out
    assert main(["explain", "--target", str(DEMO / "target"), "--drafter", str(DEMO / "drafter"),
                 *common]) == 0
    plain = capsys.readouterr().out
    assert _tau(gguf) == _tau(plain) and _tau(gguf).startswith("tau ")
    assert "time: " in gguf and "baseline" in gguf.splitlines()[-1]


def test_text_without_a_tokenizer_names_the_missing_file(tmp_path, capsys):
    target = tmp_path / "target"
    target.mkdir()
    for name in ("config.json", "model.safetensors"):
        (target / name).symlink_to(DEMO / "target" / name)
    rc = main(["explain", "--target", str(target), "--drafter", str(DEMO / "drafter"),
               "--text", "hi"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1
    assert "has no tokenizer.json" in err and "pass the GGUF file" in err


def test_a_target_that_is_not_gguf_is_named(tmp_path, capsys):
    bad = tmp_path / "model.gguf"
    bad.write_text("not a model")
    rc = main(["explain", "--target", str(bad), "--drafter", str(DEMO / "drafter"), "--ids", "3"])
    err = capsys.readouterr().err
    assert rc == 1 and "the file is not GGUF" in err and str(bad) in err


def test_progress_on_a_terminal_and_none_in_a_pipe(monkeypatch, capsys):
    args = ["explain", "--ablations", "features zeroed", "--max-new-tokens", "8"]
    assert main(args) == 0
    assert capsys.readouterr().err == ""  # capsys's stderr is not a terminal: quiet
    tty = Terminal()
    monkeypatch.setattr(sys, "stderr", tty)
    assert main(args) == 0
    shown = tty.getvalue()
    for phase in ("tokenizer", "loading the target target", "loading the drafter drafter",
                  "baseline", "features zeroed"):
        assert f"explain: {phase}: " in shown, phase  # each phase's closing line
    assert "tok/s" in shown or "tok]" in shown  # the tqdm bar of a run


def test_auto_ablations_by_target_size():
    # the demo target: 259 x 128 + 4 x 12 x 128^2 parameters, far below 50M: every ablation;
    # Gemma 3 270M: 262144 x 640 + 18 x 12 x 640^2 = 256M: only "features zeroed"
    from types import SimpleNamespace

    from dflash_ref.diagnose.ablations import ABLATIONS
    from dflash_ref.diagnose.cli import auto_ablations, auto_new_tokens, parameters

    gemma = SimpleNamespace(hidden_size=640, vocab_size=262144, num_hidden_layers=18)
    assert parameters(gemma) == 262144 * 640 + 18 * 12 * 640 * 640
    assert auto_ablations(gemma) == ["features zeroed"] and auto_new_tokens(gemma) == 32
    small = SimpleNamespace(hidden_size=128, vocab_size=259, num_hidden_layers=4)
    assert auto_ablations(small) == list(ABLATIONS) and auto_new_tokens(small) == 64
    # the boundary: exactly 50M parameters is big (catches > for >=)
    edge = SimpleNamespace(hidden_size=1000, vocab_size=50_000, num_hidden_layers=0)
    assert parameters(edge) == 50_000_000 and auto_new_tokens(edge) == 32
