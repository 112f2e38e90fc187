"""Test helpers that double as the oracle API for other implementations.

- :func:`assert_close`: one comparison for the whole project. Per element,
  ``|actual - expected| <= atol + rtol * |expected|`` (``numpy.testing.assert_allclose``), never
  "max abs OR max rel over the tensor". Tolerances come from :data:`TOLERANCES`, each with its
  reason, and the error message names the op, the tensor and the case.
- :func:`check_twin`: run an op on NumPy and on CuPy with the same inputs and compare on the host.
- :func:`gpu_skip_reason`: why ``gpu`` tests cannot run here (``None`` when they can).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from dflash_ref.backend import cupy_unavailable_reason, get_backend


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
        "different association of the same sums; measured <= 1e-13 (spec/gdn.md §2.3)"
    ),
    "float32_gdn": Tolerance(
        1e-4, 1e-4, "float32 delta rule (recurrent or chunked, NumPy or CuPy) vs float64 or "
        "another float32 order: outputs sum K products per token over a carried state; "
        "measured <= 2e-5 abs beyond 1e-4 rel with |o| <= ~10 (spec/gdn.md §5.1)"
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


def gpu_skip_reason() -> str | None:
    """``None`` when CuPy and a CUDA device are usable, else the reason ``gpu`` tests skip."""
    return cupy_unavailable_reason()


def gpu_required() -> bool:
    """``DFLASH_REQUIRE_GPU=1`` turns ``gpu`` skips into failures (set it on GPU machines)."""
    return os.environ.get("DFLASH_REQUIRE_GPU", "") not in ("", "0")


def check_twin(op: str, args: tuple, kwargs: dict | None = None, tol: str = "float32_elementwise",
               case: str = "") -> None:
    """Run ``op`` on the NumPy reference and the CuPy twin with the same host inputs; compare.

    ``args`` are NumPy arrays or scalars; arrays are copied to the device for the twin.
    Tuple outputs are compared element by element.
    """
    kwargs = kwargs or {}
    np_be, cp_be = get_backend("numpy"), get_backend("cupy")
    expected = getattr(np_be.ops, op)(*args, **kwargs)
    dev_args = tuple(cp_be.to_backend(a) if isinstance(a, np.ndarray) else a for a in args)
    actual = getattr(cp_be.ops, op)(*dev_args, **kwargs)
    if isinstance(expected, tuple):
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, tol, op=op, tensor=f"output[{i}]", case=case)
    else:
        assert_close(actual, expected, tol, op=op, case=case)
