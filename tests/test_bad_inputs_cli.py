"""The bad-input table of the command line (issue 25): every case is one ``error:`` line on
stderr, a non-zero exit, no traceback, and no file changed; argument errors are found before any
model loads.

Each row: (id, argv, expected exit status, words the error line must hold, whether it must be
refused before a model loads). ``{x}`` in argv is a path of the fixture below. The Python-API
half of the table lives with the generate() validation.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_ref.cli import main
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target

tokenizers = pytest.importorskip("tokenizers")


def _word_tokenizer(path):
    """A word-level tokenizer over the tiny target's 256 ids: 'w0' .. 'w255'."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(256)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    tok.save(str(path / "tokenizer.json"))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """Models, files a user owns, and one exported case (written once, by the API)."""
    from dflash_ref.io.convert_target import convert_target
    from dflash_ref.oracle.export import export_case

    r = tmp_path_factory.mktemp("bad_inputs")
    t = write_tiny_target(r / "t", "qwen3", seed=5, max_position_embeddings=24)
    _word_tokenizer(t)
    write_tiny_drafter(r / "d", t, seed=6)
    wide = write_tiny_target(r / "wide_t", "qwen3", seed=7, hidden_size=96)
    write_tiny_drafter(r / "wide_d", wide, seed=8)
    convert_target(t, r / "t.gguf", "f32")
    shutil.copytree(t, r / "badgen")  # a checkpoint whose generation_config.json is broken
    (r / "badgen" / "generation_config.json").write_text('{"eos_token_id": [2,')
    (r / "notes.txt").write_text("a user's notes\n")
    (r / "notgguf.bin").write_bytes(b"PK\x03\x04 not a gguf file at all")
    (r / "bad.jinja").write_text("{% if %}broken")
    (r / "raises.jinja").write_text("{{ raise_exception('no system role here') }}")
    (r / "latin1.jinja").write_bytes(b"caf\xe9 {{ messages }}")
    for name in ("work", "home", "repo", "cwd"):  # folders a user owns; all but work look like
        (r / name).mkdir()  # cases (a manifest.json), so only the place itself refuses them
        (r / name / "notes.txt").write_text(f"{name}: do not delete\n")
        if name != "work":
            (r / name / "manifest.json").write_text("{}\n")
    (r / "repo" / ".git").mkdir()
    export_case(r / "case", t, r / "d", [3, 17, 42], max_new_tokens=2, gguf=False)
    shutil.copytree(r / "case", r / "lost_step")
    (r / "lost_step" / "step0000.safetensors").unlink()
    return r


def snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under ``root``: its content hash (files) or '<dir>'."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "<dir>"
    return out


GEN = ["generate", "--target", "{t}", "--prompt", "w3 w17"]
DEMO = ["demo", "--target", "{t}", "--drafter", "{d}"]
EXPORT = ["oracle", "export", "{root}/new_case", "--target", "{t}", "--drafter", "{d}"]
EXPORT_IDS = [*EXPORT, "--ids", "3,17"]
CUPY_HERE = pytest.importorskip("dflash_ref.backend").cupy_unavailable_reason() is None

# (id, argv, exit status, words in the error line, refused before any model loads)
CASES = [
    # generate: arguments
    ("gen_max_new_tokens_0", [*GEN, "--max-new-tokens", "0"], 2, ["--max-new-tokens", ">= 1"],
     True),
    ("gen_max_new_tokens_neg", [*GEN, "--max-new-tokens", "-5"], 2, ["--max-new-tokens"], True),
    ("gen_max_new_tokens_float", [*GEN, "--max-new-tokens", "2.5"], 2, ["not an integer"], True),
    ("gen_block_size_0", [*GEN, "--block-size", "0"], 2, ["--block-size", ">= 1"], True),
    ("gen_block_size_neg", [*GEN, "--block-size", "-2"], 2, ["--block-size"], True),
    ("gen_draft_p_min_neg", [*GEN, "--draft-p-min", "-0.1"], 2, ["--draft-p-min", ">= 0"], True),
    ("gen_draft_p_min_nan", [*GEN, "--draft-p-min", "nan"], 2, ["--draft-p-min", "finite"],
     True),
    ("gen_temperature_neg", [*GEN, "--temperature", "-1", "--seed", "0"], 2, ["--temperature"],
     True),
    ("gen_temperature_nan", [*GEN, "--temperature", "nan", "--seed", "0"], 2, ["finite"], True),
    ("gen_temperature_inf", [*GEN, "--temperature", "inf", "--seed", "0"], 2, ["finite"], True),
    ("gen_temperature_without_seed", [*GEN, "--temperature", "0.7"], 2, ["--seed"], True),
    ("gen_seed_negative", [*GEN, "--seed", "-1"], 2, ["--seed", ">= 0"], True),
    ("gen_seed_text", [*GEN, "--seed", "abc"], 2, ["--seed", "not an integer"], True),
    ("gen_backend_unknown", [*GEN, "--backend", "torch"], 2, ["--backend", "numpy"], True),
    ("gen_weights_bf16_numpy", [*GEN, "--backend", "numpy", "--weights", "bf16"], 2,
     ["--weights bf16", "cupy backend", "drop --weights"], True),
    ("gen_weights_unknown", [*GEN, "--weights", "fp8"], 2, ["--weights", "invalid choice"], True),
    ("demo_weights_bf16_numpy", [*DEMO, "--weights", "bf16"], 2,  # demo's default: numpy
     ["--weights bf16", "cupy backend"], True),
    ("gen_missing_target", ["generate", "--target", "{root}/no/such", "--prompt", "w1"], 1,
     ["--target", "no such file"], True),
    ("gen_missing_drafter", [*GEN, "--drafter", "no/such/dir"], 1,
     ["--drafter", "no such file"], True),
    ("gen_no_prompt", ["generate", "--target", "{t}"], 2, ["--prompt"], True),
    ("gen_chat_template_missing", [*GEN, "--chat", "--chat-template", "nosuch"], 1,
     ["--chat-template", "gemma3"], True),
    ("gen_chat_template_syntax", [*GEN, "--chat", "--chat-template", "{root}/bad.jinja"], 1,
     ["--chat-template", "syntax error"], True),
    ("gen_chat_template_not_utf8", [*GEN, "--chat", "--chat-template", "{root}/latin1.jinja"],
     1, ["--chat-template", "UTF-8"], True),
    ("gen_chat_template_without_chat", [*GEN, "--chat-template", "gemma3"], 2, ["--chat"],
     True),
    ("gen_chat_without_template", [*GEN, "--chat"], 1, ["no chat template", "--chat-template"],
     True),
    ("gen_chat_template_raises", [*GEN, "--chat", "--chat-template", "{root}/raises.jinja"], 1,
     ["chat template failed", "no system role here"], True),
    ("gen_generation_config_not_json", ["generate", "--target", "{root}/badgen", "--prompt",
                                        "w3"], 1, ["generation_config.json", "not valid JSON"],
     True),
    ("gen_target_not_gguf", ["generate", "--target", "{root}/notgguf.bin", "--prompt", "w1"],
     1, ["notgguf.bin", "not a GGUF"], True),
    ("gen_drafter_width", [*GEN, "--drafter", "{root}/wide_d"], 1,
     ["hidden_size 96", "hidden_size 64"], True),
    ("gen_past_positions", [*GEN, "--max-new-tokens", "40"], 1,
     ["max_position_embeddings 24", "--max-new-tokens"], True),
    # demo
    ("demo_prompt_not_ids", ["demo", "--prompt", "1,2,x"], 2, ["--prompt", "'x'"], True),
    ("demo_prompt_empty", ["demo", "--prompt", ","], 2, ["--prompt", "no id"], True),
    ("demo_max_new_tokens_0", ["demo", "--max-new-tokens", "0"], 2, ["--max-new-tokens"], True),
    ("demo_block_size_neg", ["demo", "--block-size", "-2"], 2, ["--block-size"], True),
    ("demo_missing_drafter", ["demo", "--target", "{t}", "--drafter", "no/such/dir"], 1,
     ["--drafter", "no such file"], True),
    ("demo_only_target", ["demo", "--target", "{t}"], 2, ["both --target and --drafter"], True),
    ("demo_text_without_bytes", [*DEMO, "--text", "hello"], 2, ["--text", "byte-level"], True),
    ("demo_prompt_past_vocab", [*DEMO, "--prompt", "3,999"], 1, ["999", "vocabulary of 256"],
     True),
    ("demo_drafter_width", ["demo", "--target", "{t}", "--drafter", "{root}/wide_d"], 1,
     ["hidden_size 96"], True),
    # convert / inspect / compare-weights
    ("convert_missing_folder", ["convert", "{d}", "{root}/no/such/out.gguf"], 1,
     ["OUT", "does not exist", "mkdir"], True),
    ("convert_out_is_dir", ["convert", "{d}", "{root}/work"], 1, ["OUT", "is a directory"],
     True),
    ("convert_missing_src", ["convert", "{root}/nosrc", "{root}/x.gguf"], 1,
     ["SRC", "no such file"], True),
    ("convert_bad_qtype", ["convert", "{d}", "{root}/x.gguf", "--qtype", "q3"], 2, ["--qtype"],
     True),
    ("convert_missing_target", ["convert", "{d}", "{root}/x.gguf", "--target", "{root}/nt"], 1,
     ["--target", "no such file"], True),
    ("convert_target_is_gguf", ["convert", "{d}", "{root}/x.gguf", "--target", "{root}/t.gguf"],
     1, ["--target takes the target's checkpoint directory", "got the file", "t.gguf",
         "pass the HF directory"], True),
    ("convert_target_is_binary", ["convert", "{d}", "{root}/x.gguf", "--target",
                                  "{root}/notgguf.bin"], 1, ["--target", "directory"], True),
    ("inspect_not_gguf", ["inspect", "{root}/notgguf.bin"], 1, ["not GGUF", "b'PK"], True),
    ("inspect_missing", ["inspect", "{root}/missing.gguf"], 1, ["no such file"], True),
    ("compare_weights_missing", ["compare-weights", "{d}", "{root}/missing.gguf"], 1,
     ["B", "no such file"], True),
    ("compare_weights_factor_neg", ["compare-weights", "{d}", "{d}", "--threshold-factor",
                                    "-1"], 2, ["--threshold-factor", "> 0"], True),
    # oracle export
    ("export_ids_not_int", [*EXPORT, "--ids", "3,abc"], 2, ["--ids", "'abc'"], True),
    ("export_ids_empty", [*EXPORT, "--ids", ", ,"], 2, ["--ids"], True),
    ("export_detail_steps_bad", [*EXPORT_IDS, "--detail-steps", "0,x"], 2, ["--detail-steps"],
     True),
    ("export_max_new_tokens_0", [*EXPORT_IDS, "--max-new-tokens", "0"], 2,
     ["--max-new-tokens"], True),
    ("export_missing_target", ["oracle", "export", "{root}/new_case", "--target", "{root}/nt",
                               "--drafter", "{d}", "--ids", "3"], 1, ["--target"], True),
    ("export_bad_gate", [*EXPORT_IDS, "--gate", "nosuch"], 1, ["--gate", "entropy"], True),
    ("export_bad_pager", [*EXPORT_IDS, "--pager", "chunk=4"], 1, ["--pager", "pool=P"], True),
    ("export_sampled_without_seed", [*EXPORT_IDS, "--temperature", "1"], 2, ["--seed"], True),
    ("export_non_empty_without_force", ["oracle", "export", "{root}/work", "--target", "{t}",
                                        "--drafter", "{d}", "--ids", "3"], 1,
     ["not empty", "--force"], True),
    ("export_force_not_a_case", ["oracle", "export", "{root}/work", "--target", "{t}",
                                 "--drafter", "{d}", "--ids", "3", "--force"], 1,
     ["not an exported case", "manifest.json"], True),
    ("export_force_home", ["oracle", "export", "{root}/home", "--target", "{t}", "--drafter",
                           "{d}", "--ids", "3", "--force"], 1, ["home directory"], True),
    ("export_force_repo_root", ["oracle", "export", "{root}/repo", "--target", "{t}",
                                "--drafter", "{d}", "--ids", "3", "--force"], 1,
     ["repository root"], True),
    ("export_force_cwd", ["oracle", "export", ".", "--target", "{t}", "--drafter", "{d}",
                          "--ids", "3", "--force"], 1, ["current directory"], True),
    ("export_force_parent_of_cwd", ["oracle", "export", "..", "--target", "{t}", "--drafter",
                                    "{d}", "--ids", "3", "--force"], 1, ["current directory"],
     True),
    ("export_force_bad_target_keeps_case", ["oracle", "export", "{root}/case", "--target",
                                            "{root}/tt", "--drafter", "{d}", "--ids", "3",
                                            "--force"], 1, ["--target", "no such file"], True),
    ("export_force_wide_drafter_keeps_case", ["oracle", "export", "{root}/case", "--target",
                                              "{t}", "--drafter", "{root}/wide_d", "--ids", "3",
                                              "--force"], 1, ["hidden_size 96"], False),
    ("export_out_is_file", ["oracle", "export", "{root}/notes.txt", "--target", "{t}",
                            "--drafter", "{d}", "--ids", "3"], 1, ["is a file"], True),
    # oracle compare
    ("compare_tolerance_neg", ["oracle", "compare", "{root}/case", "{root}/case",
                               "--tolerance-scale", "-1"], 2, ["--tolerance-scale", "> 0"],
     True),
    ("compare_tolerance_nan", ["oracle", "compare", "{root}/case", "{root}/case",
                               "--tolerance-scale", "nan"], 2, ["--tolerance-scale", "finite"],
     True),
    ("compare_tolerance_zero", ["oracle", "compare", "{root}/case", "{root}/case",
                                "--tolerance-scale", "0"], 2, ["--tolerance-scale"], True),
    ("compare_lost_step_file", ["oracle", "compare", "{root}/lost_step", "{root}/case"], 1,
     ["step0000.safetensors", "export the case again"], True),
    ("compare_reference_not_a_case", ["oracle", "compare", "{root}/work", "{root}/case"], 1,
     ["no manifest.json"], True),
    ("compare_missing_other", ["oracle", "compare", "{root}/case", "{root}/nothing"], 1,
     ["OTHER", "no such file"], True),
    # explain
    ("explain_ablation_unknown", ["explain", "--ablations", "nope"], 2,
     ["--ablations", "not an ablation"], True),
    ("explain_only_target", ["explain", "--target", "{t}"], 2, ["both --target and --drafter"],
     True),
    ("explain_thinking_without_chat", ["explain", "--text", "w3", "--thinking"], 2,
     ["--thinking", "--chat"], True),
    ("explain_missing_drafter", ["explain", "--target", "{t}", "--drafter", "no/such/dir",
                                 "--ids", "3"], 1, ["--drafter", "no such file"], True),
    ("explain_no_prompt", ["explain", "--target", "{t}", "--drafter", "{d}"], 2,
     ["--ids", "--text"], True),
    ("explain_chat_without_template", ["explain", "--target", "{t}", "--drafter", "{d}",
                                       "--text", "w3", "--chat"], 2, ["no chat template"], True),
    ("explain_compare_missing", ["explain", "--compare", "{root}/case", "{root}/no/such"], 1,
     ["--compare", "no such file"], True),
    ("explain_ids_past_vocab", ["explain", "--target", "{t}", "--drafter", "{d}", "--ids",
                                "3,999"], 1, ["999", "vocabulary of 256"], False),
    # the command line itself
    ("unknown_command", ["frobnicate"], 2, ["invalid choice"], True),
    ("unknown_option", ["generate", "--target", "{t}", "--prompt", "w1", "--nope"], 2,
     ["unrecognized arguments"], True),
]
if CUPY_HERE:  # a GPU machine: cupy is a valid backend there
    CASES = [c for c in CASES if "cupy" not in c[0]]
else:
    CASES += [
        ("gen_backend_cupy_without_gpu", [*GEN, "--backend", "cupy"], 2,
         ["cupy is unavailable", "--backend numpy"], True),
        ("demo_backend_cupy_without_gpu", ["demo", "--backend", "cupy"], 2,
         ["cupy is unavailable"], True),
        ("export_backend_cupy_without_gpu", [*EXPORT_IDS, "--backend", "cupy"], 2,
         ["cupy is unavailable"], True),
        ("gen_weights_bf16_auto_without_gpu", [*GEN, "--weights", "bf16"], 2,
         ["--weights bf16", "found no usable GPU"], True),
    ]


def test_the_table_has_at_least_forty_cases():
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)


class _Loaded(Exception):
    pass


@pytest.mark.parametrize("argv, status, words, before_load",
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_error_line_and_changes_nothing(root, argv, status, words, before_load,
                                                         capsys, monkeypatch):
    from dflash_ref.models.target import TargetModel

    monkeypatch.setenv("HOME", str(root / "home"))
    monkeypatch.chdir(root / "cwd")
    loads = []
    if before_load:
        def refuse(*args, **kwargs):
            loads.append(args)
            raise _Loaded("a model was loaded before the arguments were refused")

        monkeypatch.setattr(TargetModel, "from_pretrained", refuse)
        monkeypatch.setattr(TargetModel, "from_gguf", refuse)
    argv = [a.format(root=root, t=root / "t", d=root / "d") for a in argv]
    before = snapshot(root)
    assert run_main(argv) == status
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for w in words:
        assert w in lines[0], lines[0]
    assert "Traceback" not in err
    assert not loads
    assert snapshot(root) == before


def run_main(argv) -> int:
    """main's exit status, also where argparse refuses the arguments (it raises SystemExit)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_force_replaces_an_exported_case_only_when_the_new_one_is_complete(root, tmp_path,
                                                                           monkeypatch, capsys):
    """A failure while writing (here the GGUF step) leaves the old case as it was and no
    temporary folder behind; a success replaces it."""
    import dflash_ref.oracle.export as export

    case = tmp_path / "case"
    shutil.copytree(root / "case", case)
    before = snapshot(tmp_path)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "_write_gguf", disk_full)
    argv = ["oracle", "export", str(case), "--target", str(root / "t"), "--drafter",
            str(root / "d"), "--ids", "5,6", "--max-new-tokens", "1", "--force"]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left" in err[0]
    assert snapshot(tmp_path) == before
    monkeypatch.undo()
    assert main([*argv, "--no-gguf"]) == 0
    assert json.loads((case / "manifest.json").read_text())["run"]["prompt_ids"] == [5, 6]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["case"]


def _cli(*argv: str | bytes, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "dflash_ref.cli", *argv], capture_output=True,
                          env=env, timeout=300, **kw)


def test_non_utf8_prompt_is_one_error_line(root):
    proc = _cli(b"generate", b"--target", str(root / "t").encode(), b"--prompt", b"caf\xe9")
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert err.strip().startswith("error: ") and "not valid UTF-8" in err
    assert len(err.strip().splitlines()) == 1


def test_debug_shows_the_traceback(root):
    proc = _cli("--debug", "inspect", str(root / "notgguf.bin"))
    assert proc.returncode != 0
    assert "Traceback" in proc.stderr.decode() and "FormatError" in proc.stderr.decode()


def test_inspect_into_a_closed_pipe_is_quiet(root):
    """``dflash-ref inspect X | head -1``: the reader leaves; no BrokenPipeError traceback."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run(f"'{sys.executable}' -m dflash_ref.cli inspect --all "
                          f"'{root / 't.gguf'}' | head -1", shell=True, capture_output=True,
                          env=env, timeout=300)
    assert proc.stdout.decode().startswith("GGUF ")
    assert "Traceback" not in proc.stderr.decode() and "BrokenPipe" not in proc.stderr.decode()


def test_inspect_reads_four_bytes_of_a_file_not_all_of_it(root, monkeypatch, capsys):
    """A multi-gigabyte model must not be read whole to check its magic."""
    big = root.parent / "big_not_gguf.bin"
    with open(big, "wb") as f:
        f.write(b"ZIP!")
        f.truncate(3 * 1024**3)  # sparse: 3 GiB that read_bytes() would load
    try:
        monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("read the whole file"))
        assert main(["inspect", str(big)]) == 1
        assert "not GGUF" in capsys.readouterr().err
    finally:
        big.unlink()


def test_convert_failing_mid_write_leaves_the_old_file_and_no_partial(root, tmp_path,
                                                                       monkeypatch, capsys):
    """``convert --force`` onto a GGUF it wrote earlier: a failure while writing (a full disk)
    keeps the old file byte for byte and leaves no temporary file; a success replaces it. (Any
    other existing file is never replaced: tests/test_writes.py.)"""
    import gguf

    out = tmp_path / "model.gguf"
    assert main(["convert", str(root / "d"), str(out), "--qtype", "f32"]) == 0
    capsys.readouterr()
    before = snapshot(tmp_path)

    def disk_full(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", disk_full)
    assert main(["convert", str(root / "d"), str(out), "--force"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left" in err[0]
    assert snapshot(tmp_path) == before
    monkeypatch.undo()
    assert main(["convert", str(root / "d"), str(out), "--force"]) == 0
    assert out.read_bytes()[:4] == b"GGUF"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]
