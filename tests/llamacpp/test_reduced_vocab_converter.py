"""llama.cpp's convert_hf_to_gguf.py on a drafter with a reduced draft vocabulary
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
