"""The q/k norms and RoPE of an attention layer as one op (``FusedNormRope``,
dflash_ref/models/fused.py) against the reference's four calls (``NormRope``,
dflash_ref/models/layers.py): equal bit for bit on NumPy on every family, which layers take it,
and that observing the taps changes nothing.

Equality is exact by construction (the ``qk_norm_rope`` reference is the composition of
``rms_norm`` and ``rope``, tests/ops/test_qk_norm_rope.py); these tests catch the model side:
a weight or eps taken from the wrong norm, the wrong RoPE spec (a sliding layer's theta on a
global layer, a lost linear factor or rotary dim), a tap fed the wrong tensor, or a layer
whose RoPE the op cannot do (Gemma 4's proportional RoPE) fused anyway.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from dflash_ref.backend import Backend, get_backend
from dflash_ref.models.fused import FusedNormRope
from dflash_ref.models.gemma4 import ProportionalRope
from dflash_ref.models.layers import Identity, NormRope, RMSNorm
from dflash_ref.models.target import TargetModel
from dflash_ref.testing import Tolerance, assert_close
from tests.models.test_fused_norms import HF_CASES, family_model, run_steps

CASES = ["qwen3", "qwen3_5", "gemma3", *HF_CASES]


def attentions(model: TargetModel) -> list:
    """Every attention mixer of the model (a wrapped mixer's block), GDN mixers left out."""
    mixers = [getattr(layer.mixer, "block", layer.mixer) for layer in model.layers]
    return [m for m in mixers if hasattr(m, "norm_rope")]


def both(case: str, backend="numpy") -> tuple[TargetModel, TargetModel]:
    """The target of ``case`` as it runs, and with the reference q/k norms and RoPE."""
    return family_model(case, backend), family_model(case, backend, fused=("add_rms_norm",))


@pytest.mark.parametrize("case", CASES)
def test_the_fused_layers_equal_the_reference_bit_for_bit(case):
    # run_steps: prefill and a decode with every tap observed, then a tree verify unobserved.
    fused, reference = both(case)
    assert any(type(a.norm_rope) is FusedNormRope for a in attentions(fused))
    assert all(type(a.norm_rope) is NormRope for a in attentions(reference))
    got, want = run_steps(fused), run_steps(reference)
    assert got.keys() == want.keys()
    assert any(k[-1] == "q" for k in got) and any(k[-1] == "k_rope" for k in got)
    for key, w in want.items():
        np.testing.assert_array_equal(got[key], w, err_msg=f"{case}: {key}")


def test_which_layers_fuse():
    # Every layer of the plain families; on Gemma 4 the sliding layers (default RoPE) but not
    # the full ones (proportional RoPE, its own cos/sin tables).
    for case in ("qwen3", "qwen3_5", "gemma3", "qwen35_moe"):
        assert all(type(a.norm_rope) is FusedNormRope for a in attentions(family_model(case)))
    model = family_model("gemma4_dense")
    kinds = {type(a.norm_rope).__name__: type(a.rope) for a in attentions(model)}
    assert kinds["NormRope"] is ProportionalRope and "FusedNormRope" in kinds
    for a in attentions(model):
        sliding = model.config.layer_types[a.idx] == "sliding_attention"
        assert (type(a.norm_rope) is FusedNormRope) == sliding, a.idx


def test_fits_refuses_what_one_op_cannot_do():
    be = get_backend("numpy")
    w = np.ones(4, np.float32)
    rope = family_model("qwen3").layers[0].mixer.rope
    assert FusedNormRope.fits(NormRope(0, RMSNorm(be, w, 1e-6, 0.0), Identity(), rope))
    # two eps (or two offsets): the op takes one of each
    assert not FusedNormRope.fits(NormRope(0, RMSNorm(be, w, 1e-6, 0.0),
                                           RMSNorm(be, w, 1e-5, 0.0), rope))
    assert not FusedNormRope.fits(NormRope(0, RMSNorm(be, w, 1e-6, 0.0),
                                           RMSNorm(be, w, 1e-6, 1.0), rope))
    assert not FusedNormRope.fits(NormRope(0, Identity(), Identity(), object()))  # other RoPE


def test_one_op_per_attention_layer_and_nothing_more_for_an_unobserved_forward():
    calls = Counter()
    ref = get_backend("numpy")

    def counted(name):
        def op(*args, **kwargs):
            calls[name] += 1
            return getattr(ref.ops, name)(*args, **kwargs)
        return op

    ops = SimpleNamespace(**{**vars(ref.ops), **{n: counted(n) for n in
                                                 ("qk_norm_rope", "rope", "rms_norm")}})
    model = family_model("qwen3", Backend("numpy", np, ops))
    model.forward(np.arange(3, 9), model.new_state())
    L = len(model.layers)
    # L fused ops; no RoPE alone; rms_norm: only layer 0's input norm (the rest are fused adds)
    assert calls == Counter({"qk_norm_rope": L, "rms_norm": 1}), calls


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_the_fused_layers_equal_the_reference_on_cupy(case):
    # One kernel against rms_norm_f32 then rope_neox_f32: the same float32 math, the norm's
    # scale applied as x * inv * w in both, the rotation's FMA contracted by each kernel alone.
    fused, reference = both(case, backend="cupy")
    got, want = run_steps(fused), run_steps(reference)
    tol = Tolerance(1e-4, 1e-4, "the same float32 math in two kernels or one (FMA contraction "
                                "and sincosf per kernel), carried through 4-6 layers")
    for key, w in want.items():
        assert_close(got[key], w, tol, op="FusedNormRope", tensor=str(key), case=case)
