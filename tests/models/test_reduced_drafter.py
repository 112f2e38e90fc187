"""A drafter with a reduced draft vocabulary (its own ``lm_head.weight`` rows and ``d2t``) in the
real layout, made from the shipped demo pair (tests/models/reduced.py): lossless against plain
decoding, equal to the full-head drafter when d2t covers every id, the same through
``convert`` -> GGUF -> ``from_gguf``, the GGUF as gguf-py (llama.cpp's reader) sees it, and a bad
map refused with one line before any weight is read."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dflash_ref.cli import main
from dflash_ref.errors import ConfigError, FormatError
from dflash_ref.io.convert_drafter import convert_drafter
from dflash_ref.models.draft_head import FILL
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.spec_decode.loop import generate
from tests.io.convert_helpers import rewrite
from tests.models.reduced import DEMO, TEXT_IDS, write_reduced_drafter

PROMPTS = json.loads((DEMO / "held_out_prompts.json").read_text())["prompts"][:2]
NEW = 32
V = 259  # the demo target's vocabulary


def _target():
    return TargetModel.from_pretrained(DEMO / "target")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = tmp_path_factory.mktemp("reduced")
    reduced = write_reduced_drafter(root / "reduced", TEXT_IDS)
    gguf = convert_drafter(reduced, root / "reduced.gguf", "bf16", target=DEMO / "target")
    return {"root": root, "reduced": reduced, "gguf": gguf}


def _block(drafter, prompt):
    """The drafter's block logits [B, V] after ``prompt`` (stateless form)."""
    feats = drafter.be.to_numpy(drafter.target.forward(np.asarray(prompt),
                                                       drafter.target.new_state()).features)
    return drafter.forward_block(feats, np.arange(len(prompt)), anchor_token=prompt[-1],
                                 anchor_position=len(prompt))


def test_greedy_speculative_decoding_is_plain_decoding(made):
    # The target verifies with its full head: the reduced head changes only the drafts. Catches
    # a draft id emitted unmapped (the demo's text ids are not the draft rows 0..96).
    target = _target()
    drafter = DFlashDrafter.from_pretrained(made["reduced"], target)
    for prompt in PROMPTS:
        plain = generate(target, None, prompt, NEW)
        spec = generate(target, drafter, prompt, NEW)
        assert spec.tokens == plain.tokens
        assert spec.tau > 1.5  # drafts are accepted: they are target ids (3.9 and 1.6 here)


def test_a_reduced_drafter_drafts_only_d2t_ids_and_scatters_float32_min(made):
    drafter = DFlashDrafter.from_pretrained(made["reduced"], _target())
    logits = drafter.be.to_numpy(_block(drafter, PROMPTS[0]))  # [B, V]
    outside = np.setdiff1d(np.arange(V), TEXT_IDS)
    assert (logits[:, outside] == np.float32(FILL)).all()
    assert np.isin(drafter.draft_tokens(logits), TEXT_IDS).all()


def test_a_map_covering_every_id_equals_the_full_head_drafter(made):
    # d2t = identity and the head = the target's rows: the same logits bit for bit, the same
    # drafts and the same run (catches a head that differs from the borrowed one: a softcap or
    # multiplier dropped, rows off by one).
    target = _target()
    full = DFlashDrafter.from_pretrained(DEMO / "drafter", target)
    every = DFlashDrafter.from_pretrained(
        write_reduced_drafter(made["root"] / "every", np.arange(V)), _target())
    assert np.array_equal(_block(every, PROMPTS[0]), _block(full, PROMPTS[0]))
    a = generate(full.target, full, PROMPTS[1], NEW)
    b = generate(every.target, every, PROMPTS[1], NEW)
    assert a.tokens == b.tokens and a.acceptance_lengths == b.acceptance_lengths


def test_the_row_order_of_the_map_does_not_matter(made):
    # The same ids in reverse row order: every target id gets the same logit (catches a scatter
    # that assumes ascending d2t, or maps a row to the id of its sorted position).
    fwd = DFlashDrafter.from_pretrained(made["reduced"], _target())
    rev = DFlashDrafter.from_pretrained(
        write_reduced_drafter(made["root"] / "reversed", TEXT_IDS[::-1]), _target())
    a, b = _block(fwd, PROMPTS[0]), _block(rev, PROMPTS[0])
    assert np.allclose(a, b, rtol=0, atol=1e-5)  # one row per column: only BLAS order differs
    assert (fwd.draft_tokens(a) == rev.draft_tokens(b)).all()


def test_directory_to_gguf_to_from_gguf_gives_the_same_logits_and_run(made):
    # BF16 on disk both ways, so the logits agree exactly (catches d2t written as offsets, or
    # read back without undoing the absolute ids, or the head's rows transposed).
    d_dir = DFlashDrafter.from_pretrained(made["reduced"], _target())
    d_gguf = DFlashDrafter.from_gguf(made["gguf"], _target())
    assert d_gguf.config.draft_vocab_size == TEXT_IDS.size
    assert (d_gguf.draft_head.ids == TEXT_IDS).all()
    assert np.array_equal(_block(d_dir, PROMPTS[0]), _block(d_gguf, PROMPTS[0]))
    a = generate(d_dir.target, d_dir, PROMPTS[1], NEW)
    b = generate(d_gguf.target, d_gguf, PROMPTS[1], NEW)
    assert a.tokens == b.tokens and a.acceptance_lengths == b.acceptance_lengths


def test_gguf_py_reads_d2t_as_i64_absolute_ids_and_the_reduced_output(made):
    # What llama.cpp's loader reads (src/models/dflash.cpp: d2t {Vd} I64, output {n_embd, Vd}).
    from gguf import GGUFReader

    r = GGUFReader(made["gguf"])
    t = {x.name: x for x in r.tensors}
    assert t["d2t"].tensor_type.name == "I64"
    assert np.asarray(t["d2t"].data).tolist() == TEXT_IDS.tolist()  # absolute, not offsets
    assert [int(n) for n in t["output.weight"].shape] == [128, TEXT_IDS.size]  # ggml {H, Vd}
    assert "token_embd.weight" not in t  # the block's embeddings stay the target's


def test_compare_weights_pairs_the_head_and_the_map_of_both_forms(made):
    # lm_head.weight is output.weight in the GGUF, and d2t is offsets in one, absolute ids in
    # the other: catches either side compared as stored (one-sided rows, a d2t outlier).
    from dflash_ref.io.compare import compare_weights

    rows = {r.name: r for r in compare_weights(made["reduced"], made["gguf"], show=False)}
    assert not any(r.flagged for r in rows.values()), [r for r in rows.values() if r.flagged]
    assert rows["d2t"].max_abs == 0.0 and rows["lm_head.weight"].max_abs == 0.0


def test_lucebox_naming_refuses_a_reduced_drafter(made, tmp_path):
    with pytest.raises(ConfigError, match="lucebox naming has no reduced draft vocabulary"):
        convert_drafter(made["reduced"], tmp_path / "x.gguf", naming="lucebox")
    assert not (tmp_path / "x.gguf").exists()


# -- a bad map: one error line, before any weight is read ---------------------------------------

BAD = {
    "duplicate": (np.r_[TEXT_IDS[:-1], TEXT_IDS[0]], "to the same target id 9"),
    "out_of_range": (np.r_[TEXT_IDS[:-1], V], "target id 259, outside the target vocabulary"),
}


@pytest.fixture(scope="module")
def bad_dirs(made):
    out = {}
    for name, (ids, _) in BAD.items():
        d2t = ids - np.arange(ids.size)
        out[name] = write_reduced_drafter(made["root"] / name, TEXT_IDS, d2t=d2t)
    out["short"] = write_reduced_drafter(made["root"] / "short", TEXT_IDS,
                                         d2t=np.zeros(5, np.int64))
    out["undeclared"] = write_reduced_drafter(made["root"] / "undeclared", TEXT_IDS,
                                              config_changes={"draft_vocab_size": None})
    return out


@pytest.mark.parametrize("name", sorted(BAD))
def test_from_pretrained_refuses_a_bad_map_before_reading_a_weight(bad_dirs, name, monkeypatch):
    import dflash_ref.models.drafter_loading as loading

    target = _target()

    def no_weights(*args, **kwargs):
        raise AssertionError("a weight was read before the map was checked")

    monkeypatch.setattr(loading, "read_checkpoint_weights", no_weights)
    with pytest.raises(FormatError, match=BAD[name][1]):
        DFlashDrafter.from_pretrained(bad_dirs[name], target)


def test_from_gguf_refuses_a_bad_map(made, tmp_path):
    bad = np.r_[TEXT_IDS[:-1], TEXT_IDS[3]].astype(np.int64)
    path = rewrite(made["gguf"], tmp_path / "bad.gguf", tensors={"d2t": bad})
    with pytest.raises(FormatError, match=r"rows \[3, 96\] to the same target id 33"):
        DFlashDrafter.from_gguf(path, _target())


@pytest.mark.parametrize("name", ["duplicate", "out_of_range", "short", "undeclared"])
def test_generate_cli_says_one_error_line_before_a_model_loads(bad_dirs, name, capsys,
                                                               monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the map was checked")

    monkeypatch.setattr(TargetModel, "from_pretrained", refuse)
    status = main(["generate", "--target", str(DEMO / "target"), "--drafter",
                   str(bad_dirs[name]), "--prompt", "def f():", "--max-new-tokens", "4"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and len(err) == 1 and err[0].startswith("error: ") and "d2t" in err[0]


def test_convert_cli_refuses_a_bad_map_and_writes_nothing(bad_dirs, tmp_path, capsys):
    out = tmp_path / "bad.gguf"
    status = main(["convert", str(bad_dirs["duplicate"]), str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 1 and len(err) == 1 and "d2t" in err[0] and not out.exists()


@pytest.mark.gpu
def test_a_reduced_drafter_on_cupy_drafts_as_on_numpy(made):
    # The same xp calls on both backends (xp.full, a fancy-index scatter and gather); catches a
    # host array reaching device code or d2t left on the host for the scatter.
    from dflash_ref.testing import Tolerance, assert_close

    cpu = DFlashDrafter.from_pretrained(made["reduced"], _target())
    t_gpu = TargetModel.from_pretrained(DEMO / "target", backend="cupy")
    gpu = DFlashDrafter.from_pretrained(made["reduced"], t_gpu)
    a, b = _block(cpu, PROMPTS[0]), _block(gpu, PROMPTS[0])
    assert_close(b, a, Tolerance(1e-4, 1e-4, "cuBLAS vs NumPy BLAS, 3 layers"),
                 op="reduced drafter", case="demo")
    assert (cpu.draft_tokens(a) == gpu.draft_tokens(b)).all()
    plain = generate(t_gpu, None, PROMPTS[1], NEW).tokens
    assert generate(t_gpu, gpu, PROMPTS[1], NEW).tokens == plain
