"""The compute-dtype rule of the NumPy reference ops (docs/backend.md, "Dtypes"): float32, or
float64 when an input is float64 (closed-form tests); the CuPy twins take float32 only.
"""

import numpy as np


def in_compute_dtype(*arrays):
    """The inputs as arrays of the compute dtype (float64 if any is float64, else float32), not
    copied when already so; None stays None. One input: the array; several: a tuple, in order."""
    f64 = any(np.asarray(a).dtype == np.float64 for a in arrays if a is not None)
    dt = np.float64 if f64 else np.float32
    out = tuple(None if a is None else np.asarray(a, dtype=dt) for a in arrays)
    return out[0] if len(out) == 1 else out
