"""Test helpers that double as the oracle API for other implementations.

- :func:`assert_close`: one comparison for the whole project. Per element,
  ``|actual - expected| <= atol + rtol * |expected|`` (``numpy.testing.assert_allclose``), never
  "max abs OR max rel over the tensor". Tolerances come from :data:`TOLERANCES`, each with its
  reason, and the error message names the op, the tensor and the case.

- :mod:`dflash_ref.testing.lossless`: the harness that proves a speculative sampler lossless
  (against the target's exact law: chi-square on the emitted sequences and on each position,
  exact binomial tails of every event, ds4's max deviation, impossible outputs;
  docs/lossless.md), over :mod:`dflash_ref.testing.chisquare`.

- :mod:`dflash_ref.testing.conform`: a running server's completions judged against dflash-ref
  (greedy margins, the sampled law of the first tokens, acceptance; docs/conformance.md), the
  library of ``dflash-ref conform``.

The project's own GPU-test plumbing (the twin check, the skip rule) is in tests/gpu.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol: float
    reason: str


TOLERANCES: dict[str, Tolerance] = {
    "exact": Tolerance(0.0, 0.0, "integer results (argmax ids) or bit-exact copies"),
    "float64": Tolerance(
        1e-12, 1e-12, "float64 closed form vs float64 reference: only rounding at 2^-52 remains"
    ),
    "float32_elementwise": Tolerance(
        2e-6, 1e-6, "expf/sincosf differ from NumPy by <= 2 ulp; one or two products round"
    ),
    "float32_rowsum": Tolerance(
        1e-5, 1e-6, "sums of <= 8192 terms in another order (tree vs pairwise): ~sqrt(n) ulp"
    ),
    "float32_rope": Tolerance(
        1e-5, 1e-5, "same float32 angle; sincosf ulp error and x1 cos - x2 sin cancellation"
    ),
    "float32_vs_float64": Tolerance(
        1e-5, 1e-6, "a float32 computation against its float64 closed form (rel eps 6e-8 x n)"
    ),
    "float32_attention": Tolerance(
        1e-4, 5e-5,
        "float32 attention vs another evaluation order (tiled online softmax vs two-pass, or "
        "float64): dot products over d <= 256 and sums over up to ~3e4 keys in another order; "
        "outputs are convex combinations of v rows (|v| <= ~4 in tests), so atol scales with |v|",
    ),
    "float64_gdn": Tolerance(
        1e-10, 1e-10, "float64 chunked (WY/UT, triangular inverse) vs recurrent delta rule: "
        "different association of the same sums; measured <= 1e-13 (docs/gdn.md)"
    ),
    "float32_gdn": Tolerance(
        1e-4, 1e-4, "float32 delta rule (recurrent or chunked, NumPy or CuPy) vs float64 or "
        "another float32 order: outputs sum K products per token over a carried state; "
        "measured <= 2e-5 abs beyond 1e-4 rel with |o| <= ~10 (docs/gdn.md)"
    ),
}


def assert_close(actual, expected, tol: str | Tolerance, *, op: str, tensor: str = "output",
                 case: str = "") -> None:
    """Assert ``actual`` matches ``expected`` elementwise within the named tolerance.

    Both arguments may be NumPy or CuPy arrays (CuPy is copied to the host). Shapes must match
    exactly; NaN matches NaN only if both sides have it at the same place.
    """
    t = TOLERANCES[tol] if isinstance(tol, str) else tol
    a, e = _host(actual), _host(expected)
    where = f"{op}: {tensor}" + (f" [{case}]" if case else "")
    if a.shape != e.shape:
        raise AssertionError(f"{where}: shape {a.shape} != expected {e.shape}")
    np.testing.assert_allclose(
        a, e, rtol=t.rtol, atol=t.atol, equal_nan=True,
        err_msg=f"{where} (rtol={t.rtol}, atol={t.atol}: {t.reason})",
    )


def _host(x) -> np.ndarray:
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return np.asarray(x)
