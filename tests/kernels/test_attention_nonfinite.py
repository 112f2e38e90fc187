"""The non-finite attention rule (docs/conventions.md, "Non-finite attention") for every attention
kernel: emulated on the CPU, run on a GPU (``gpu``).

The expected values are tests/ops/attention_rule.py's row-by-row float64 evaluation of the rule
(independent of the kernels and of dflash_ref/ops/attention.py). The emulations are the kernels'
transcriptions that the other tests in this folder check against the reference: decode v2
(attention_decode_*, with and without a key split, then its combine), decode v3
(attention_decode_v3_*: the case's 8 rows per kv head, at d = 8, and zero-padded to d = 64 and
d = 256, its two-slot kernel), v1
(attention_fwd_*, the fallback decode and the tree / masked kernel, with its combine), prefill
v1 (attention_prefill_*), prefill v2 (attention_prefill_v2_f32, each ring depth) and the
tensor-core prefill (attention_prefill_tc_f32: 3xTF32 MMAs, each ring depth). Each models
fmaxf (NaN dropped from a max), the online softmax's shift (att_softmax_shift) and which V rows
a row multiplies.
Plausible bugs each case catches: a row's "seen" taken from an fmaxf max (case 1, prefill v2), V
multiplied for a key the row does not see (case 2, prefill v2 and the reference), e^(-inf + inf)
= NaN for a row of -inf scores (case 3, every kernel), a NaN split dropped by an "l > 0" combine
(case 1 with splits), 0 written where the rule says NaN (case 4); on tensor cores, an MMA that
multiplies a masked key's non-finite V (case 2 and the garbage slots, without the V check) and a
3xTF32 split whose lo part of an inf is tf32(inf - inf) = NaN (case 3).
"""

from __future__ import annotations

import numpy as np
import pytest

from dflash_ref.ops.masks import MaskSpec
from kernels_cupy import attention_prefill as kpf
from kernels_cupy import attention_prefill_tc as ktc
from kernels_cupy.attention import plan_launch
from tests.kernels.test_attention_decode_plan import emulate_decode
from tests.kernels.test_attention_decode_v3 import emulate_decode_v3
from tests.kernels.test_attention_plan import _emulate_forward
from tests.kernels.test_attention_prefill import _emulate_prefill
from tests.kernels.test_attention_prefill_tc import emulate_prefill_tc
from tests.kernels.test_attention_prefill_v2 import emulate_prefill_v2
from tests.ops.attention_rule import SCALE, cases, check_rule

CASE_NAMES = [c[0] for c in cases(np.random.default_rng(0))]


def _case(name, Tk=90):
    return next(c for c in cases(np.random.default_rng(1), Tk) if c[0] == name)


def _padded(case, d):
    """The case with head dim ``d``: q / k / v padded with zero columns (a zero column adds 0 to
    every score and is 0 in every finite row): decode v3's d = 64 and d = 256 kernels."""
    name, q, k, v, spec = case
    pad = [(0, 0), (0, 0), (0, d - q.shape[2])]
    return (name, *(np.pad(x, pad) for x in (q, k, v)), spec)


def _verify_block(case):
    """A 16-query-row verify block from a case: its 4 rows 4 times over, on one kv head (GQA 4:
    64 rows per kv head, decode v3's 8-row warps at d <= 128, two row blocks at d = 256)."""
    name, q, k, v, spec = case
    rows = MaskSpec(np.tile(np.asarray(spec.q_pos), 4), spec.k_pos, causal=spec.causal,
                    window=spec.window, window_mode=spec.window_mode, base_pos=spec.base_pos)
    return name, np.tile(q, (4, 1, 1)), k[:, :1], v[:, :1], rows


@pytest.fixture(autouse=True)
def _quiet():
    with np.errstate(all="ignore"):  # NaN and inf are the point here
        yield


@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("sm_count", [1, 132])  # one split; splits of 16-32 keys
def test_decode_v2_emulated(name, sm_count):
    case = _case(name)
    _, q, k, v, spec = case
    for dt in (np.float64, np.float32):
        out, _ = emulate_decode(*(x.astype(dt) for x in (q, k, v)), spec, SCALE,
                                sm_count=sm_count)
        check_rule(out, case, what=f"decode v2 {dt.__name__} sm_count={sm_count}")


@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("sm_count", [1, 132])  # one split; splits of 64 keys
@pytest.mark.parametrize("d", [8, 64, 256])  # 8 rows: 2 row groups x 4 key warps; NV = 2
def test_decode_v3_emulated(name, sm_count, d):
    case = _padded(_case(name, 300), d)
    _, q, k, v, spec = case
    for dt in (np.float64, np.float32):
        out = emulate_decode_v3(*(x.astype(dt) for x in (q, k, v)), spec, SCALE,
                                sm_count=sm_count)
        check_rule(out, case, what=f"decode v3 d={d} {dt.__name__} sm_count={sm_count}")


@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("d", [8, 256])
def test_decode_v3_verify_block_emulated(name, d):
    case = _padded(_verify_block(_case(name, 300)), d)
    _, q, k, v, spec = case
    for sm_count in (1, 132):
        out = emulate_decode_v3(q.astype(np.float32), k.astype(np.float32),
                                v.astype(np.float32), spec, SCALE, sm_count=sm_count)
        check_rule(out, case, what=f"decode v3 verify block d={d} sm_count={sm_count}")


@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("Tk", [90, 600])  # 600: two key splits on 64 SMs
def test_v1_forward_emulated(name, Tk):
    case = _case(name, Tk)
    _, q, k, v, spec = case
    if Tk == 600:
        assert plan_launch(len(q), q.shape[1], k.shape[1], q.shape[2], Tk, 64)["n_splits"] > 1
    out = _emulate_forward(q, k, v, spec, SCALE, sm_count=64)[0]
    check_rule(out, case, what=f"attention_fwd Tk={Tk}")


@pytest.mark.parametrize("name", CASE_NAMES)
def test_prefill_v1_emulated(name):
    case = _case(name)
    _, q, k, v, spec = case
    plan = kpf.plan_prefill(*q.shape[:2], k.shape[1], q.shape[2], k.shape[0], 96 * 1024)
    check_rule(_emulate_prefill(q, k, v, spec, SCALE, None, plan)[0], case, what="prefill v1")


@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_prefill_v2_emulated(name, stages):
    case = _case(name)
    _, q, k, v, spec = case
    plan = kpf.plan_prefill_v2(*q.shape[:2], k.shape[1], q.shape[2], 10**6, 10**7)
    plan = {**plan, "stages": stages, "shared_mem": kpf.prefill_v2_shared_bytes(q.shape[2],
                                                                                 stages)}
    check_rule(emulate_prefill_v2(q, k, v, spec, SCALE, None, plan)[0], case,
               what=f"prefill v2 stages={stages}")


def _tc_plan(q, k, stages):
    plan = ktc.plan_prefill_tc(*q.shape[:2], k.shape[1], q.shape[2], 10**6, 10**7)
    return {**plan, "stages": stages, "shared_mem": ktc.shared_bytes(q.shape[2], stages)}


@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_prefill_tc_emulated(name, stages):
    case = _case(name)
    _, q, k, v, spec = case
    out, stats = emulate_prefill_tc(q, k, v, spec, SCALE, None, _tc_plan(q, k, stages))
    check_rule(out, case, what=f"prefill tc stages={stages}")
    if name == "nonfinite_v_partly_visible":  # a masked key's NaN / inf V: CUDA cores
        assert stats["fallback"] > 0


@pytest.mark.parametrize(("name", "part"), [("nonfinite_v_partly_visible", "check_v"),
                                            ("neg_inf_scores", "guard")])
def test_prefill_tc_needs_its_v_check_and_its_split_guard(name, part):
    # Without the masked keys' V check, -0 x NaN from a slot the row does not see reaches it
    # (rule 1); without the split's guard, an inf operand's lo is NaN and a -inf score turns
    # NaN (rule 3).
    case = _case(name)
    _, q, k, v, spec = case
    out, _ = emulate_prefill_tc(q, k, v, spec, SCALE, None, _tc_plan(q, k, 2), **{part: False})
    with pytest.raises(AssertionError):
        check_rule(out, case, what=f"prefill tc without {part}")


# ---------------------------------------------------------------- on a GPU

KERNELS = ["decode", "decode_v2", "prefill", "prefill_v2", "prefill_tc"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("Tk", [90, 4100])  # 4100: 8 key splits
@pytest.mark.parametrize("d", [8, 64, 256])
def test_decode_v3_follows_the_rule_on_a_gpu(name, Tk, d):
    import cupy as cp

    from kernels_cupy.attention import attention_using

    case = _padded(_case(name, Tk), d)
    _, q, k, v, spec = case
    dev = [cp.asarray(x.astype(np.float32)) for x in (q, k, v)]
    check_rule(cp.asnumpy(attention_using("decode_v3", *dev, spec, scale=SCALE)), case,
               what=f"decode_v3 d={d}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASE_NAMES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("Tk", [90, 4100])  # 4100: key splits in decode v1 and v2
def test_every_kernel_follows_the_rule_on_a_gpu(name, kernel, Tk):
    import cupy as cp

    from kernels_cupy.attention import attention_using
    from kernels_cupy.linear import has_tensor_cores

    case = _case(name, Tk)
    _, q, k, v, spec = case
    dev = [cp.asarray(x.astype(np.float32)) for x in (q, k, v)]
    if kernel == "prefill_tc" and not has_tensor_cores(cp.cuda.Device().id):
        pytest.skip("the tensor-core prefill kernel needs sm_80+")
    got = cp.asnumpy(attention_using(kernel, *dev, spec, scale=SCALE))
    check_rule(got, case, what=kernel)


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASE_NAMES)
def test_the_auto_choice_follows_the_rule_on_a_gpu(name):
    import cupy as cp

    from kernels_cupy.attention import attention

    case = _case(name)
    _, q, k, v, spec = case
    got = attention(*(cp.asarray(x.astype(np.float32)) for x in (q, k, v)), spec, scale=SCALE)
    check_rule(cp.asnumpy(got), case, what="auto")
