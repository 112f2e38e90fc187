"""llama.cpp on a drafter with a reduced draft vocabulary: its converter, and its DFlash loop
(docs/interop.md, "A reduced draft vocabulary").

In the pinned source only the DSpark class (``DSparkModel``: ``draft_vocab_size``,
``model.d2t``, written as I64 ``d2t + arange``) reads a reduced vocabulary; ``DFlashModel``
(``DFlashDraftModel``) maps every tensor through its name table, which has no ``d2t``. So the
same directory converts under a DSpark architecture, and its ``d2t`` and ``output.weight`` are
the oracle for ours; under ``DFlashDraftModel`` llama.cpp's converter refuses it, and
``dflash-ref convert`` is the way to the GGUF (llama.cpp's runtime reads either file).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from gguf import GGUFReader

from dflash_ref.io.convert_drafter import convert_drafter
from tests.llamacpp.harness import convert_with_llamacpp
from tests.models.reduced import DEMO, TEXT_IDS, write_reduced_drafter

pytestmark = pytest.mark.llamacpp


def _tensors(path) -> dict:
    return {t.name: t for t in GGUFReader(path).tensors}


def test_llamacpp_writes_the_same_d2t_and_reduced_head_as_ours(llamacpp_src, tmp_path):
    src = write_reduced_drafter(tmp_path / "reduced", TEXT_IDS[::-1],  # descending rows
                                config_changes={"architectures": ["DSparkDraftModel"]})
    theirs, ours = tmp_path / "theirs.gguf", tmp_path / "ours.gguf"
    convert_with_llamacpp(llamacpp_src, src, "--target-model-dir", DEMO / "target",
                          "--outfile", theirs, "--outtype", "bf16")
    cfg = json.loads((src / "config.json").read_text())
    cfg["architectures"] = ["DFlashDraftModel"]  # ours: the plain DFlash drafter it is
    (src / "config.json").write_text(json.dumps(cfg))
    convert_drafter(src, ours, "bf16", target=DEMO / "target", progress=False)
    a, b = _tensors(theirs), _tensors(ours)
    for name in ("d2t", "output.weight"):
        assert (a[name].tensor_type, list(a[name].shape)) == (b[name].tensor_type,
                                                              list(b[name].shape))
        assert np.array_equal(np.asarray(a[name].data), np.asarray(b[name].data)), name
    assert np.asarray(a["d2t"].data).tolist() == TEXT_IDS[::-1].tolist()  # absolute ids


def test_llamacpps_dflash_converter_has_no_d2t(llamacpp_src, tmp_path):
    # Pins the gap: when llama.cpp's DFlashModel learns d2t this fails, and docs/interop.md's
    # "A reduced draft vocabulary" changes with it.
    src = write_reduced_drafter(tmp_path / "reduced", TEXT_IDS)
    with pytest.raises(AssertionError, match="Can not map tensor 'model.d2t'"):
        convert_with_llamacpp(llamacpp_src, src, "--target-model-dir", DEMO / "target",
                              "--outfile", tmp_path / "theirs.gguf", "--outtype", "bf16")


def test_llamacpp_drafts_and_accepts_as_we_do_with_a_reduced_head(llamacpp, tmp_path):
    """The reduced drafter's GGUF (ours) next to the shipped target GGUF in llama.cpp's DFlash
    loop and in ours: llama.cpp reports the d2t map, the output is plain greedy decoding's, and
    the accepted drafts per step agree (tests/llamacpp/test_dflash.py drives both loops)."""
    from dflash_ref.demo_text import decode_bytes
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel
    from dflash_ref.oracle.llamacpp_loop import spec_steps
    from dflash_ref.spec_decode.loop import generate
    from tests.llamacpp.test_dflash import (
        GGUF,
        N_DRAFT,
        N_NEW,
        PROMPTS,
        _before_first_short,
        llamacpp_loop,
    )

    drafter_gguf = convert_drafter(write_reduced_drafter(tmp_path / "reduced", TEXT_IDS),
                                   tmp_path / "reduced.gguf", "bf16", target=DEMO / "target",
                                   progress=False)
    target = TargetModel.from_gguf(GGUF / "target.gguf")
    drafter = DFlashDrafter.from_gguf(drafter_gguf, target)
    ids = PROMPTS[0]
    p = llamacpp.run("llama-speculative-simple", "-m", GGUF / "target.gguf", "-md", drafter_gguf,
                     "--spec-type", "draft-dflash", "--spec-draft-n-max", N_DRAFT, "-n", N_NEW,
                     "-p", decode_bytes(ids), "--temp", "0", "-t", "1", "-c", "512", "-v",
                     until="n_accept")
    assert f"draft_vocab_size = {TEXT_IDS.size}" in p.stderr_text  # llama.cpp read d2t
    plain = generate(target, None, ids, N_NEW + N_DRAFT + 1).tokens
    assert generate(target, drafter, ids, N_NEW + N_DRAFT + 1).tokens == plain
    theirs = list(p.stdout.lstrip(b"\n")[len(ids):].rstrip(b"\n"))
    assert len(theirs) >= N_NEW and theirs == plain[:len(theirs)]
    steps = spec_steps(p.stderr_text)
    accepted = _before_first_short(steps)
    assert len(accepted) >= len(steps) - 2 and sum(accepted) > 0, steps
    _, ours = llamacpp_loop(target, drafter, ids, N_NEW + N_DRAFT + 1)
    assert accepted == ours[:len(accepted)], (steps, ours)
