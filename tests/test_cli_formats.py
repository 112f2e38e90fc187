"""The formats subcommands: `dflash-ref convert | inspect | compare-weights` on tiny files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from gguf import GGUFReader

import dflash_ref
from dflash_ref.cli import main
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_formats")
    t = write_tiny_target(root / "t", "qwen3", seed=2)
    return {"root": root, "target": t, "drafter": write_tiny_drafter(root / "d", t, seed=3),
            "other": write_tiny_drafter(root / "d2", t, seed=4)}


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("naming, arch, ids_line", [
    ("llama.cpp", "dflash", "dflash.target_layers"),
    ("lucebox", "qwen35-dflash-draft", "qwen35-dflash-draft.dflash.target_layer_ids"),
])
def test_convert_then_inspect_drafter(dirs, tmp_path, capsys, naming, arch, ids_line):
    out = tmp_path / "d.gguf"
    code, text, err = run(capsys, "convert", dirs["drafter"], out, "--qtype", "q8_0",
                          "--naming", naming, "--target", dirs["target"])
    assert code == 0, err
    assert f"arch {arch}" in text and "25 tensors" in text and "F32, Q8_0" in text
    assert GGUFReader(out).fields["general.architecture"].contents() == arch
    code, text, err = run(capsys, "inspect", out)
    assert code == 0, err
    lines = text.splitlines()
    ids = next(line for line in lines if line.strip().startswith(ids_line))
    assert ids.split()[-2:] == (["[1,", "3]"] if naming == "llama.cpp" else ["[0,", "2]"])
    assert "ARRAY[INT32]" in ids
    assert any("rope.freq_base" in line and "1000000.0" in line for line in lines)
    assert any("layer_norm_rms_epsilon" in line and "1e-06" in line for line in lines)
    assert "captures [0, 2]" in text  # derived config: HF ids either way
    assert ("HF ids + 1" in text) == (naming == "llama.cpp")
    assert text.rstrip().endswith("warnings: none")


def test_inspect_warns_when_metadata_contradicts_weights(dirs, tmp_path, capsys):
    from tests.io.convert_helpers import rewrite

    out = tmp_path / "d.gguf"
    assert run(capsys, "convert", dirs["drafter"], out, "--naming", "lucebox")[0] == 0
    bad = rewrite(out, tmp_path / "bad.gguf", {"qwen35-dflash-draft.dflash.n_target_layers": 4})
    code, text, _ = run(capsys, "inspect", bad)
    assert code == 0
    assert "n_target_layers is 4 but fc implies 2 captured layers; the weights win" in text
    assert "captures [0, 2]" in text


def test_inspect_checkpoint_directory(dirs, tmp_path, capsys):
    code, text, _ = run(capsys, "inspect", dirs["drafter"])
    assert code == 0
    assert "checkpoint" in text and "25 tensors" in text and "dflash_config" in text
    assert "DFlash drafter (zlab layout)" in text and "warnings: none" in text
    src = tmp_path / "d"
    shutil.copytree(dirs["drafter"], src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["intermediate_size"] = 100
    (src / "config.json").write_text(json.dumps(cfg))
    code, text, _ = run(capsys, "inspect", src)
    assert code == 0
    assert "intermediate_size=100 but layers.0.mlp.gate_proj.weight is [128, 64]" in text
    code, text, _ = run(capsys, "inspect", dirs["target"], "--all")
    assert "qwen3 target" in text and "model.layers.3.mlp.up_proj.weight" in text


def test_convert_and_inspect_target(dirs, tmp_path, capsys):
    out = tmp_path / "t.gguf"
    code, text, err = run(capsys, "convert", dirs["target"], out, "--qtype", "bf16")
    assert code == 0, err
    assert "arch qwen3 (target, llama.cpp names)" in text
    code, text, _ = run(capsys, "inspect", out)
    assert "qwen3 target" in text and "token_embd.weight" in text and "rope[full_attention]" in text


def test_compare_weights_exit_codes(dirs, tmp_path, capsys):
    out = tmp_path / "d.gguf"
    run(capsys, "convert", dirs["drafter"], out, "--qtype", "bf16")
    code, text, _ = run(capsys, "compare-weights", dirs["drafter"], out)
    assert code == 0 and "25 compared" in text and "outlier" not in text
    code, text, _ = run(capsys, "compare-weights", dirs["other"], out)  # another drafter
    assert code == 1 and "outlier" in text


def test_errors_are_one_line_on_stderr(dirs, tmp_path, capsys):
    src = tmp_path / "d"
    shutil.copytree(dirs["drafter"], src)
    cfg = json.loads((src / "config.json").read_text())
    del cfg["rope_theta"]
    (src / "config.json").write_text(json.dumps(cfg))
    code, _, err = run(capsys, "convert", src, tmp_path / "x.gguf")
    assert code == 1
    assert err.startswith("error: drafter config.json: no RoPE base")
    code, _, err = run(capsys, "convert", dirs["drafter"], tmp_path / "x.gguf", "--qtype", "q4_k")
    assert code == 1 and "Q4_K block (256)" in err and "--fallback" in err
    code, _, err = run(capsys, "convert", dirs["drafter"], tmp_path / "x.gguf", "--qtype", "q4_k",
                       "--fallback", "q8_0")
    assert code == 0 and err.count("warning:") == 15  # fc + 7 matrices x 2 layers
    code, _, err = run(capsys, "inspect", tmp_path / "missing.gguf")
    assert code == 1 and err.startswith("error:")


def test_compare_weights_matches_the_demo_target_with_its_own_gguf(capsys):
    """Issue 25 item 7: target names were not mapped ("0 compared, 46 only in a, 46 only in b").
    The shipped GGUF was written by the converter from the shipped checkpoint, so all 46 tensors
    must match (BF16 matrices copied bit for bit, F32 norms)."""
    root = Path(dflash_ref.__file__).parent / "data" / "demo"
    code, text, err = run(capsys, "compare-weights", root / "target", root / "gguf" / "target.gguf")
    assert code == 0, err
    assert text.strip().splitlines()[-1].startswith("46 compared; rel RMS mean 0.000e+00")


@pytest.mark.parametrize("family", ["qwen3", "gemma3", "qwen3_5"])
def test_compare_weights_maps_every_target_family_back_to_hf_values(family, tmp_path, capsys):
    """Each family the converter writes compares with its checkpoint at F32 within float32
    rounding (the +1 / -1 and exp / log round; docs/formats.md): the names (Gemma's four norms,
    Qwen3.5's GDN tensors) and the values llama.cpp stores otherwise (Gemma's norm + 1,
    ssm_a = -exp(A_log), the conv shape, tiled value heads) are mapped back.
    A wrong map shows as one-sided rows or a nonzero error, never as a pass."""
    from dflash_ref.io.safetensors_io import open_checkpoint

    src = write_tiny_target(tmp_path / "t", family, seed=9)
    out = tmp_path / "t.gguf"
    assert run(capsys, "convert", src, out, "--qtype", "f32")[0] == 0
    code, text, err = run(capsys, "compare-weights", src, out)
    n = len(open_checkpoint(src))
    assert code == 0, text + err
    summary = text.strip().splitlines()[-1]
    assert summary.startswith(f"{n} compared; rel RMS mean ")
    assert float(summary.split("max ")[1]) <= 1e-6  # the F32 budget; a norm off by 1 is ~1e2
