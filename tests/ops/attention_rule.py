"""The non-finite attention rule (docs/conventions.md, "Non-finite attention") written out row by
row in float64 Python, and the cases that exercise it. The oracle of tests/ops/test_attention.py
(the NumPy reference) and tests/kernels/test_attention_nonfinite.py (every kernel, emulated on
the CPU and run on a GPU); it shares no code with dflash_ref/ops/attention.py.

Each case is (name, q [Tq, nh, d], k / v [Tk, nkv, d], MaskSpec): a few rows with different
views of 2-3 key tiles of 32, garbage (NaN, inf) in slots no row sees, and the special values
placed where the rule says what happens.
"""

from __future__ import annotations

import math

import numpy as np

from dflash_ref.ops.masks import MaskSpec, visible

SCALE = 0.25
NH, NKV, D = 4, 2, 8  # GQA 2


def rule_attention(q, k, v, vis, scale=SCALE) -> np.ndarray:
    """out [Tq, nh, d] by the rule; vis [Tq, Tk] bool. A key j outside J_i (the row's visible
    keys) is never looked at. NaN / +inf score in J_i: the row is NaN. -inf score: p = 0. No
    mass (J_i empty or all -inf): sum_j 0 * v_j, i.e. 0 unless a visible V is non-finite.
    Otherwise sum_j p_j v_j / sum_j p_j with Python floats (0 * inf = NaN, as the rule says)."""
    Tq, nh, d = q.shape
    g = nh // k.shape[1]
    out = np.zeros((Tq, nh, d))
    for i in range(Tq):
        J = [j for j in range(k.shape[0]) if vis[i, j]]
        for h in range(nh):
            kh = h // g
            s = [scale * math.fsum(float(a) * float(b) for a, b in zip(q[i, h], k[j, kh]))
                 if np.isfinite(k[j, kh]).all() and np.isfinite(q[i, h]).all()
                 else scale * float(np.dot(q[i, h].astype(float), k[j, kh].astype(float)))
                 for j in J]
            if any(math.isnan(x) or x == math.inf for x in s):
                out[i, h] = math.nan
                continue
            finite = [x for x in s if x != -math.inf]
            mx = max(finite) if finite else 0.0
            p = [0.0 if x == -math.inf else math.exp(x - mx) for x in s]
            L = sum(p)
            for c in range(d):
                o = sum(pj * float(v[j, kh, c]) for pj, j in zip(p, J))
                out[i, h, c] = o / L if L > 0 else o
    return out


def _base(rng, Tk, q_pos, k_pos=None, **mask):
    Tq = len(q_pos)
    q = rng.uniform(0.5, 1.5, (Tq, NH, D)) * rng.choice([-1, 1], (Tq, NH, D))
    q[..., 0] = np.abs(q[..., 0]) + 0.5  # > 0: an inf in k[..., 0] gives that sign's inf score
    k = rng.standard_normal((Tk, NKV, D))
    v = rng.standard_normal((Tk, NKV, D))
    k_pos = np.arange(Tk) if k_pos is None else k_pos
    spec = MaskSpec(np.asarray(q_pos), np.asarray(k_pos), **mask)
    garbage = np.flatnonzero(~visible(spec).any(axis=0))  # slots no row sees: NaN / inf
    k[garbage, :, 1::2], k[garbage, :, ::2] = np.nan, np.inf
    v[garbage, :, 1::2], v[garbage, :, ::2] = np.inf, np.nan
    return q, k, v, spec


def cases(rng, Tk: int = 90) -> list[tuple]:
    """(name, q, k, v, spec) in float64; Tk >= 90 keys (three tiles of 32, the last partial)."""
    out = []
    # 1. A whole key tile NaN in K (32..63): row at 40 sees only NaN scores in that tile (the
    #    step prefill v2 once skipped); rows at 20 (before it) stay finite.
    q, k, v, spec = _base(rng, Tk, [40, 20, Tk - 1, 33], causal=True)
    k[32:64] = np.nan
    out.append(("nan_scores_whole_tile", q, k, v, spec))
    # 2. Non-finite V in slots only some rows see: rows at 30 and 44 do not see slots 45, 50
    #    and must stay finite; the rows at Tk - 1 and 50 see them: column 2 NaN, column 5
    #    non-finite. Each pair of consecutive rows holds one that sees them and one that not.
    q, k, v, spec = _base(rng, Tk, [30, Tk - 1, 44, 50], causal=True)
    v[50, :, 2] = np.nan
    v[45, :, 5] = np.inf
    out.append(("nonfinite_v_partly_visible", q, k, v, spec))
    # 3. -inf scores (k[..., 0] = -inf, q[..., 0] > 0) on slots 10..30 under a window of 10:
    #    the row at 25 sees 16..25, all -inf: no mass, zeros; except column 1, where the visible
    #    slot 20's V is NaN (multiplied by p = 0); the row at 35 sees 26..35: finite; the row at
    #    Tk - 1 sees no -inf score.
    q, k, v, spec = _base(rng, Tk, [25, 35, Tk - 1, 12], causal=True, window=10)
    k[10:31, :, 0] = -np.inf
    v[20, :, 1] = np.nan
    out.append(("neg_inf_scores", q, k, v, spec))
    # 4. A fully masked row (position 0, whose only key slot is invalid) beside rows that see
    #    +inf scores (slot 5, k[..., 0] = +inf: NaN rows) and rows that do not (position 3).
    k_pos = np.arange(Tk)
    k_pos[0] = -1
    q, k, v, spec = _base(rng, Tk, [0, Tk - 1, 3, 64], k_pos=k_pos, causal=True)
    k[5, :, 0] = np.inf
    out.append(("fully_masked_row_and_pos_inf", q, k, v, spec))
    return out


def check_rule(got, case, atol=1e-5, rtol=1e-4, what="") -> None:
    """got [Tq, nh, d] against the rule: the same NaN / non-finite pattern (NaN where the rule
    gives NaN from a score; non-finite, NaN or inf, where a visible V made it so) and the finite
    values within (atol, rtol)."""
    name, q, k, v, spec = case
    want = rule_attention(q, k, v, visible(spec))
    msg = f"{what} {name}"
    np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want), err_msg=msg)
    both = np.isfinite(want)
    np.testing.assert_allclose(got[both], want[both], rtol=rtol, atol=atol, err_msg=msg)
