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


TREE_SHAPES = ("chain", "star", "random", "deep_wide", "forest")


def tree_parents(shape: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """[n] parents of a draft tree in topological order (parents[i] < i, -1 for a root).

    chain: 0 <- 1 <- 2 ...; star: every node under the root; random: a uniform earlier parent;
    deep_wide: mostly the previous node (deep branches), sometimes the root (a new branch);
    forest: random, but some later nodes are roots too (each continues the committed state).
    """
    idx = np.arange(n)
    if shape == "chain":
        return idx - 1
    if shape == "star":
        return np.where(idx == 0, -1, 0)
    parents = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)], dtype=np.int64)
    if shape == "deep_wide":
        parents[1:] = np.where(rng.random(n - 1) < 0.75, idx[1:] - 1, 0)
    elif shape == "forest":
        parents[rng.random(n) < 0.25] = -1
    return parents


@st.composite
def trees(draw, max_nodes: int = 12):
    """Parents [n] of a tree drawn from :data:`TREE_SHAPES`, 1 <= n <= max_nodes."""
    shape = draw(st.sampled_from(TREE_SHAPES))
    n = draw(st.integers(1, max_nodes))
    return tree_parents(shape, n, np.random.default_rng(draw(st.integers(0, 2**32 - 1))))


def root_to_node(parents, i: int) -> list[int]:
    """The node indices from node i's root down to node i (a chain run's token order)."""
    path = [int(i)]
    while parents[path[-1]] >= 0:
        path.append(int(parents[path[-1]]))
    return path[::-1]
