"""``dflash-ref explain`` end to end on the shipped pair: the report, the figures, --text and
--compare (the bad inputs are rows of tests/test_bad_inputs_cli.py)."""

from __future__ import annotations

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
