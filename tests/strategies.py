"""Hypothesis strategies shared by the op tests: small, awkward shapes; no subnormals."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

# Awkward sizes on purpose: not multiples of 32 or of a block (STYLE.md, after FLA's tests).
AWKWARD = st.sampled_from([1, 2, 3, 5, 7, 31, 33, 63, 64, 100, 257])


def f32_arrays(shape, lo: float = -8.0, hi: float = 8.0, min_abs: float = 0.0):
    """float32 arrays with finite, non-subnormal elements in [lo, hi]."""
    elements = st.floats(lo, hi, width=32, allow_nan=False, allow_infinity=False,
                         allow_subnormal=False)
    if min_abs > 0:
        elements = elements.filter(lambda v: abs(v) >= min_abs)
    return hnp.arrays(np.float32, shape, elements=elements)


@st.composite
def rows_and_width(draw, max_rows: int = 6):
    """A shape [rows, n] with awkward n."""
    return (draw(st.integers(1, max_rows)), draw(AWKWARD))
