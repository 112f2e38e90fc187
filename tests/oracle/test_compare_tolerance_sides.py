"""compare_cases with a manifest whose atol and rtol differ: each is used on its own side.

Every shipped manifest states atol == rtol for the float kinds, so a compare that swapped the two
(reading a manifest's atol as its rtol, or testing ``rtol + atol * |ref|``) passed every earlier
test. The expected verdicts are hand values of ``|other - ref| <= atol + rtol * |ref|``
(docs/golden_vectors.md, "Tolerance semantics") for perturbations placed on purpose.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from dflash_ref.oracle.compare import compare_cases

GOLDEN = Path(__file__).resolve().parents[2] / "tests" / "golden"
KEY = "step0000.target.logits"


def _case(tmp_path, name, atol, rtol):
    """The qwen3_chain case with its logits tolerance set to (atol, rtol)."""
    case = tmp_path / name
    shutil.copytree(GOLDEN / "qwen3_chain", case)
    m = json.loads((case / "manifest.json").read_text())
    m["tolerances"]["logits"] = {"atol": atol, "rtol": rtol, "why": "test"}
    (case / "manifest.json").write_text(json.dumps(m))
    return case


def _perturbed(tmp_path, index_of, delta):
    """A copy of the case whose KEY has ``delta`` added at ``index_of(ref)``."""
    other = tmp_path / f"other_{abs(hash((index_of.__name__, delta)))}"
    shutil.copytree(GOLDEN / "qwen3_chain", other)
    (other / "manifest.json").unlink()
    f = other / "step0000.safetensors"
    t = load_file(str(f))
    ref = t[KEY].copy()
    i = index_of(ref)
    r = float(ref.flat[i])
    ref.flat[i] += np.float32(delta)
    t[KEY] = ref
    save_file(t, str(f))
    return other, r


def largest(ref):
    return int(np.argmax(np.abs(ref)))


def smallest(ref):
    return int(np.argmin(np.abs(ref)))


def test_compare_rtol_only_manifest_scales_with_the_reference(tmp_path):
    ref = _case(tmp_path, "ref", atol=0.0, rtol=0.01)
    other, r = _perturbed(tmp_path, largest, 0.0)
    assert abs(r) > 4.0  # so 0.4% of it is above an atol of 0.01 (a swap would fail this)
    other, r = _perturbed(tmp_path, largest, 0.004 * abs(r))  # within rtol * |ref|
    assert compare_cases(ref, other).equal
    other, r = _perturbed(tmp_path, smallest, 0.003)  # |ref| tiny: 0.003 > 0.01 * |ref|
    assert abs(r) < 0.2
    report = compare_cases(ref, other)
    assert report.first is not None and report.first.key == KEY
    assert "atol 0 + rtol 0.01 * |ref|" in report.first.describe()


def test_compare_atol_only_manifest_is_absolute(tmp_path):
    ref = _case(tmp_path, "ref", atol=0.01, rtol=0.0)
    other, r = _perturbed(tmp_path, smallest, 0.008)  # within atol, whatever |ref|
    assert compare_cases(ref, other).equal
    other, r = _perturbed(tmp_path, largest, 0.02)  # above atol; rtol 0 allows nothing more
    assert abs(r) > 4.0  # a swap (rtol 0.01 * |ref| > 0.04) would let this pass
    assert compare_cases(ref, other).first.key == KEY


@pytest.mark.parametrize("scale", [3.0])
def test_compare_tolerance_scale_multiplies_both_sides(tmp_path, scale):
    ref = _case(tmp_path, "ref", atol=0.01, rtol=0.0)
    other, _ = _perturbed(tmp_path, largest, 0.02)
    assert not compare_cases(ref, other).equal
    assert compare_cases(ref, other, tolerance_scale=scale).equal  # 0.02 <= 0.03
