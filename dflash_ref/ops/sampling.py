"""The sampling law the drafter and the verifier share (host float64; not ops: no CuPy twin).

Public source: the authors' release, PyPI ``dflash`` 0.1.0, ``dflash/model.py``
(``_sampling_probs``, ``sample``); docs/spec_decode.md, "Sampling".

**The sampling distribution** (:func:`sampling_probs`), applied to the target's rows and to a
DFlash drafter's rows alike, in this order:

1. ``x = logits / T``;
2. top-k (``0 < k < V``): keep the k largest x (equal values: the lower id first), the rest get
   probability 0;
3. ``p = softmax(x)`` over the kept entries;
4. top-p (``top_p < 1``): sort p descending (equal values: the lower id first) and keep an entry
   iff the mass strictly before it is ``< top_p`` (the first entry is always kept); renormalise.

Below ``T = 1e-5`` decoding is greedy: the argmax, as the HF reference's ``sample(logits, T)``.
Probabilities are formed on the host in float64, so a token is a function of (logits, uniform
draw) only and a seed gives the same tokens on NumPy and CuPy (a float32 device softmax would
move the inverse-CDF boundaries by rounding).

These functions live below the models (``ops``) because both sides use them: a drafter proposes
with them (:class:`DraftProposal`), the loop's verifiers check against them. They take the
backend duck-typed (anything with ``to_numpy``, or a backend name for host arrays), like
:func:`~dflash_ref.ops.reductions.argmax_rows_checked`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dflash_ref.errors import ConfigError
from dflash_ref.ops.reductions import argmax_rows_checked, check_finite_logits

GREEDY_BELOW_TEMPERATURE = 1e-5
"""HF ref ``sample(logits, T)``: a temperature below this is greedy (argmax), not sampling."""


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen: temperature, top-p, top-k, and the seed of the draws.

    Checked as the release checks them: ``temperature >= 0``, ``top_p`` in (0, 1], an integer
    ``top_k >= 0`` (0 disables top-k). Below ``T = 1e-5`` decoding is greedy and the filters and
    the seed are unused.

    Attributes:
        temperature: T; 0 (the default) is greedy.
        top_p, top_k: the filters of :func:`sampling_probs`, applied to the target's and the
            drafter's rows alike.
        seed: an int or a ``np.random.Generator`` (used as is, so its draws continue across
            calls); ``generate`` requires one when T > 0, so that a sampled run is reproducible.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | np.random.Generator | None = None

    def __post_init__(self):
        t, p, k, seed = self.temperature, self.top_p, self.top_k, self.seed

        def real(x):
            return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)

        if not (real(t) and real(p) and isinstance(k, (int, np.integer))
                and not isinstance(k, bool) and math.isfinite(t) and t >= 0 and 0 < p <= 1
                and k >= 0):
            raise ConfigError(f"sampling needs a finite temperature >= 0, top_p in (0, 1] and an "
                              f"integer top_k >= 0 (0: no top-k); got temperature={t!r}, "
                              f"top_p={p!r}, top_k={k!r}; pass e.g. SamplingParams(temperature="
                              f"0.8, top_p=0.95, top_k=40, seed=0)")
        if not (seed is None or isinstance(seed, np.random.Generator)
                or (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool))):
            raise ConfigError(f"sampling seed must be an int, a numpy.random.Generator or None; "
                              f"got {seed!r} ({type(seed).__name__}); pass e.g. seed=0")

    @property
    def greedy(self) -> bool:
        """T < 1e-5: tokens are the argmax."""
        return self.temperature < GREEDY_BELOW_TEMPERATURE

    def generator(self) -> np.random.Generator:
        """The draws' generator: ``seed`` itself when it is one, else ``default_rng(seed)``."""
        if isinstance(self.seed, np.random.Generator):
            return self.seed
        return np.random.default_rng(self.seed)


GREEDY = SamplingParams()
"""The default law, greedy decoding (checked once, here, rather than built per call)."""


@dataclass(frozen=True)
class DraftProposal:
    """What a drafter proposes for one block (``drafter.propose``).

    Attributes:
        tokens: [n-1] int64 host, the drafts d_1..d_{n-1} (argmax rows, a DFlash 2 selector path,
            or sampled).
        q: None for greedy drafts; for sampled drafts the distribution each was drawn from:
            [n-1, V], or [n-1, k] on ``candidates`` (DFlash 2: ``softmax(score / T)`` over a
            row's candidates).
        candidates: None, or [n-1, k] int64 the token ids ``q`` is defined on (DFlash 2).
        p_draft: None, or [n-1] float64 host: the drafter's own probability of each draft,
            renormalised over the row's ``top_k`` best (asked for with ``scored=top_k``, by a
            verifier that sizes its block by them).
    """

    tokens: np.ndarray
    q: np.ndarray | None = None
    candidates: np.ndarray | None = None
    p_draft: np.ndarray | None = None


def as_generator(rng) -> np.random.Generator:
    """``rng`` as a ``np.random.Generator``: a Generator is used as is, an int seeds a new one.

    Sampling always takes an explicit generator or seed, so a sampled run is reproducible and
    its distribution can be tested.
    """
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise TypeError(
        f"rng must be a numpy.random.Generator or an int seed, got {type(rng).__name__}; "
        f"pass numpy.random.default_rng(seed)"
    )


def to_host(be, x) -> np.ndarray:
    """``x`` as a host array: through ``be.to_numpy`` for a Backend, else a CuPy array's
    ``get()`` or ``np.asarray`` (a backend name)."""
    if hasattr(be, "to_numpy"):
        return be.to_numpy(x)
    return x.get() if type(x).__module__.startswith("cupy") else np.asarray(x)


def target_probs(be, logits, temperature: float, role: str = "verify") -> np.ndarray:
    """softmax(logits / T) per row, on the host in float64 (steps 1 and 3, no filter).

    Args:
        be: the backend holding ``logits`` (a Backend, or a name for host arrays).
        logits: [..., V].
        temperature: T > 0.
        role: named in the error when the logits are non-finite.
    Returns:
        [..., V] float64, rows sum to 1.
    Raises:
        NonFiniteLogitsError: a row holds NaN or +-inf (checked on the host copy made anyway).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
    host = to_host(be, logits)
    check_finite_logits(host, role)
    x = host.astype(np.float64) / float(temperature)
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))  # [..., V]
    return e / np.sum(e, axis=-1, keepdims=True)


def sampling_probs(be, logits, temperature: float, top_p: float = 1.0, top_k: int = 0,
                   role: str = "verify") -> np.ndarray:
    """The release's sampling distribution per row (module docstring, steps 1-4).

    Args:
        logits: [..., V] (backend array).
    Returns:
        [..., V] float64 on the host, rows sum to 1. Without top-p / top-k this is exactly
        :func:`target_probs`.
    """
    p = target_probs(be, logits, temperature, role)  # softmax(logits / T), float64
    V = p.shape[-1]
    if 0 < top_k < V:
        x = to_host(be, logits).astype(np.float64)
        order = np.argsort(-x, axis=-1, kind="stable")  # descending, ties: lower id first
        keep = np.zeros(p.shape, dtype=bool)
        np.put_along_axis(keep, order[..., :top_k], True, axis=-1)
        p = np.where(keep, p, 0.0)
        p = p / p.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p  # mass strictly before each entry
        keep = np.zeros(p.shape, dtype=bool)
        np.put_along_axis(keep, order, before < top_p, axis=-1)
        p = np.where(keep, p, 0.0)
        p = p / p.sum(axis=-1, keepdims=True)
    return p


def sample_from_probs(probs, u) -> np.ndarray:
    """Inverse-CDF sampling: the first token whose cumulative probability exceeds ``u * total``.

    ``token = min{i : c_i > u * c_(V-1)}`` with ``c = cumsum(probs)``. A token of probability 0 is
    never chosen (its cumulative equals its predecessor's). Rows need not be normalised.

    Args:
        probs: [..., V] non-negative, at least one positive entry per row.
        u: [...] uniform draws in [0, 1).
    Returns:
        [...] int64.
    """
    p = np.asarray(probs, dtype=np.float64)
    c = np.cumsum(p, axis=-1)  # [..., V]
    x = np.asarray(u, dtype=np.float64) * c[..., -1]  # [...]
    ids = np.sum(c <= x[..., None], axis=-1)  # [...]
    # x can round up to the total when u is within 2^-53 of 1: fall back to the last positive token.
    last_positive = p.shape[-1] - 1 - np.argmax(p[..., ::-1] > 0, axis=-1)
    return np.minimum(ids, last_positive).astype(np.int64)


def sample_tokens(be, logits, law: SamplingParams, rng, role: str = "target") -> np.ndarray:
    """One token per row: the argmax when ``law`` is greedy, else one draw per row from
    :func:`sampling_probs` (one uniform per row, in row order).

    The prefill's first token and each plain step's token (HF ref ``sample(logits, T)``, with the
    release's top-p / top-k).

    Args:
        logits: [R, V] (backend array).
        rng: ``np.random.Generator`` or int seed (unused when greedy).
        role: named in the error when the logits are non-finite.
    Returns:
        [R] int64 host array.
    Raises:
        NonFiniteLogitsError: a row holds NaN or +-inf.
    """
    if law.greedy:
        return argmax_rows_checked(be, logits, role)
    probs = sampling_probs(be, logits, law.temperature, law.top_p, law.top_k, role)  # [R, V]
    return sample_from_probs(probs, as_generator(rng).random(probs.shape[:-1]))


def sample_rows(be, logits, law: SamplingParams, rng) -> DraftProposal:
    """Sampled drafts, one per row: ``d_j ~ q_j = sampling_probs(row j)`` (one uniform per row).

    Args:
        logits: [n-1, V] the draft rows 1..n-1 (backend array).
        rng: ``np.random.Generator``.
    Returns:
        :class:`DraftProposal` with ``tokens`` [n-1] and ``q`` [n-1, V].
    """
    q = sampling_probs(be, logits, law.temperature, law.top_p, law.top_k)  # [n-1, V]
    return DraftProposal(sample_from_probs(q, rng.random(q.shape[:-1])), q)
