"""The compute-dtype rule shared by every NumPy reference op (docs/backend.md, "Dtypes").

Reference compute is float32. A float64 input stays float64 so that tests can check an algorithm
against its own closed form at ~1e-12; every other dtype (f16, bf16 stored as f32, ints) is
computed in float32. The CuPy twins accept float32 only.
"""

import numpy as np


def compute_dtype(*arrays) -> np.dtype:
    """float64 if any input is float64, else float32."""
    if any(np.asarray(a).dtype == np.float64 for a in arrays if a is not None):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def as_compute(x, dtype: np.dtype) -> np.ndarray:
    """``x`` as a NumPy array of the compute dtype (no copy when it already is)."""
    return np.asarray(x, dtype=dtype)
