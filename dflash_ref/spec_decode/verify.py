"""Chain verifiers: greedy, and sampled at temperature > 0 (z-lab/dflash ``dflash/model.py``).

One verify step sees the block that was drafted and the target's output for it:

    block     = [t_s, d_1, ..., d_{B-1}]   [B]     anchor (last committed token) + B-1 drafts
    posterior = target token per block row [B]     row j predicts position s+j+1

Row j of the target saw block[0..j], so its token is the target's choice for the position where
draft d_{j+1} sits. The accepted count is

    a = length of the longest prefix with block[1+j] == posterior[j], j = 0..B-2  (0 <= a <= B-1)

and the bonus is ``posterior[a]``: the target's own token right after the last accepted draft
(after a rejection it replaces the rejected draft; after a full accept it is a free extra token).
The step commits ``block[1..a]`` and the bonus, so the output grows by ``a + 1`` tokens and the
next anchor is the bonus (``s <- s + a + 1``). The target KV cache and the drafter's context keep
verify rows 0..a (the old anchor and the a accepted drafts); the bonus is in no cache yet.

Greedy: posterior = argmax per row (``be.ops.argmax_rows``). Sampled (HF ref ``sample``): the
posterior is drawn per row from softmax(logits / T). Accepting a draft iff it equals the sampled
target token is speculative sampling with a one-hot draft distribution q = e_d (the HF ref drafts
greedily), so it is lossless: see :func:`chain_rejection_core` for the explicit form and the proof
that the two give the same distribution.

Everything returned is on the host (Python ints and NumPy arrays): the loop branches on it.
Non-finite logits are refused, never turned into a token: every verifier raises
:class:`~dflash_ref.errors.NonFiniteLogitsError` when a row holds NaN or +-inf (docs/conventions.md,
"Non-finite logits").
Tree verification (DDTree) lives in :mod:`dflash_ref.spec_decode.ddtree`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dflash_ref.backend import Backend, as_backend
from dflash_ref.ops.reductions import argmax_rows_checked, check_finite_logits

GREEDY_BELOW_TEMPERATURE = 1e-5
"""HF ref ``sample(logits, T)``: a temperature below this is greedy (argmax), not sampling."""


@dataclass(frozen=True)
class ChainVerifyResult:
    """Outcome of one chain verify step (docs/spec_decode.md).

    Attributes:
        a: accepted drafts, 0 <= a <= B-1.
        accepted: ``block[1 : 1+a]``, the accepted draft tokens.
        bonus: ``posterior[a]``, the target's token after the last accepted draft.
        posterior: [B] int64, the target's token per block row (argmax, or sampled); the
            rejection form samples only up to the bonus, so there it is [a+1].
    """

    a: int
    accepted: tuple[int, ...]
    bonus: int
    posterior: np.ndarray

    @property
    def committed(self) -> tuple[int, ...]:
        """The ``a + 1`` tokens this step appends after the anchor: accepted drafts, then bonus.

        With the anchor at position s they fill positions s+1..s+a+1; the bonus at s+a+1 is the
        next anchor.
        """
        return (*self.accepted, self.bonus)

    @property
    def acceptance_length(self) -> int:
        """``a + 1``: the quantity tau averages (docs/conventions.md, tau)."""
        return self.a + 1

    @property
    def n_keep_rows(self) -> int:
        """Verify rows to keep in the target KV cache and the drafter context: rows 0..a."""
        return self.a + 1


# ---------------------------------------------------------------------------------------------
# Small pure pieces (host NumPy, any leading batch dimensions).
# ---------------------------------------------------------------------------------------------


def accept_length(drafts, posterior) -> np.ndarray:
    """Longest prefix where the drafts equal the target's tokens (``dflash_generate``).

    ``a = sum_j prod_{i <= j} [drafts[i] == posterior[i]]`` (the HF ref's cumprod of equality,
    summed).

    Args:
        drafts: [..., k] int, ``block[..., 1:]``.
        posterior: [..., >= k] int; only the first k entries are compared (row k, the bonus row
            of a full accept, is never compared).
    Returns:
        [...] int64 in [0, k].
    """
    drafts = np.asarray(drafts)
    k = drafts.shape[-1]
    eq = drafts == np.asarray(posterior)[..., :k]  # [..., k]
    return np.sum(np.cumprod(eq, axis=-1), axis=-1).astype(np.int64)


def _check_block(block) -> np.ndarray:
    """``block`` as a host int64 vector [B] with B >= 1."""
    b = _host(block)
    if b.ndim != 1 or b.shape[0] < 1 or not np.issubdtype(b.dtype, np.integer):
        raise ValueError(
            f"block must be a 1-D integer array [B] = [anchor, d_1, ..., d_(B-1)] with B >= 1; "
            f"got shape {b.shape}, dtype {b.dtype}"
        )
    return b.astype(np.int64)


def _host(x) -> np.ndarray:
    """Any array (NumPy, CuPy, list) as a host NumPy array."""
    if type(x).__module__.startswith("cupy"):
        return x.get()
    return np.asarray(x)


def greedy_posterior(be: Backend | str, target, n_rows: int | None = None,
                     role: str = "verify") -> np.ndarray:
    """The target's greedy token per row, on the host.

    Args:
        be: the backend holding ``target``.
        target: either logits [R, V] (a backend array; reduced with ``be.ops.argmax_rows``,
            lowest index on ties, and refused when non-finite) or already-reduced ids [R] (any
            integer array, taken as they are).
        n_rows: when given, R must equal it.
        role: named in the error when the logits are non-finite.
    Returns:
        [R] int64 host array.
    Raises:
        NonFiniteLogitsError: a logits row holds NaN or +-inf.
    """
    be = as_backend(be)
    if not hasattr(target, "shape"):
        target = np.asarray(target)
    ndim = len(target.shape)
    if ndim == 2:
        ids = argmax_rows_checked(be, target, role)  # one copy: ids and finiteness together
    elif ndim == 1 and np.issubdtype(np.dtype(target.dtype), np.integer):
        ids = _host(target)
    else:
        raise ValueError(
            f"target must be logits [R, V] or integer argmax ids [R]; got shape "
            f"{tuple(target.shape)}, dtype {target.dtype}"
        )
    if n_rows is not None and ids.shape[0] != n_rows:
        raise ValueError(
            f"the target gave {ids.shape[0]} rows but the block/tree has {n_rows}: verify runs the "
            f"target on every block token (anchor included), one row each"
        )
    return ids.astype(np.int64)


# ---------------------------------------------------------------------------------------------
# Greedy chain verify.
# ---------------------------------------------------------------------------------------------


def verify_chain_greedy(be: Backend | str, block, target) -> ChainVerifyResult:
    """Greedy chain verify (``dflash_generate``).

    Example: block [5, 7, 9, 2], target argmax rows [7, 9, 4, x]: 7 == 7, 9 == 9, 2 != 4, so
    a = 2, accepted (7, 9), bonus 4, committed (7, 9, 4).

    Args:
        be: backend of ``target``.
        block: [B] int, ``[anchor, d_1, ..., d_(B-1)]`` (host or device).
        target: the target's logits [B, V] for the B block rows, or their argmax ids [B].
    Returns:
        :class:`ChainVerifyResult` with host values.
    """
    b = _check_block(block)
    posterior = greedy_posterior(be, target, n_rows=b.shape[0])  # [B]
    return _chain_result(b, posterior)


def _chain_result(block: np.ndarray, posterior: np.ndarray) -> ChainVerifyResult:
    a = int(accept_length(block[1:], posterior))
    return ChainVerifyResult(
        a=a,
        accepted=tuple(int(t) for t in block[1 : 1 + a]),
        bonus=int(posterior[a]),
        posterior=posterior,
    )


# ---------------------------------------------------------------------------------------------
# Sampled chain verify (temperature > 0).
# ---------------------------------------------------------------------------------------------


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


def target_probs(be: Backend | str, logits, temperature: float,
                 role: str = "verify") -> np.ndarray:
    """softmax(logits / T) per row, on the host in float64.

    Probabilities are formed on the host in float64 so that a sampled token is a function of
    (logits, uniform draw) only, identical on every backend (a float32 device softmax would move
    the inverse-CDF boundaries by rounding).

    Args:
        logits: [..., V] (backend array).
        temperature: T > 0.
        role: named in the error when the logits are non-finite.
    Returns:
        [..., V] float64, rows sum to 1.
    Raises:
        NonFiniteLogitsError: a row holds NaN or +-inf (checked on the host copy made anyway).
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 for sampling, got {temperature}")
    host = as_backend(be).to_numpy(logits)
    check_finite_logits(host, role)
    x = host.astype(np.float64) / float(temperature)
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))  # [..., V]
    return e / np.sum(e, axis=-1, keepdims=True)


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


def chain_sampled_core(block, probs, u) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The HF ref's sampled verify, batched: sample a target token per row, then match.

    ``posterior[j] ~ probs[j]`` independently for every row (drawn with ``u[j]`` by
    :func:`sample_from_probs`); ``a`` = :func:`accept_length`; ``bonus = posterior[a]``.

    Args:
        block: [..., B] int.
        probs: [..., B, V] target probabilities per block row (rows sum to 1).
        u: [..., B] uniform draws in [0, 1).
    Returns:
        (a [...], bonus [...], posterior [..., B]), all int64.
    """
    block = np.asarray(block)
    posterior = sample_from_probs(probs, u)  # [..., B]
    a = accept_length(block[..., 1:], posterior)  # [...]
    bonus = np.take_along_axis(posterior, a[..., None], axis=-1)[..., 0]  # [...]
    return a, bonus, posterior


def chain_rejection_core(block, probs, u_accept, u_bonus) -> tuple[np.ndarray, np.ndarray]:
    """Speculative (rejection) sampling with a one-hot draft distribution, batched.

    For drafts j = 0..B-2 in order, with target distribution p = probs[j], draft token
    d = block[1+j] and draft distribution q = e_d (one-hot: the drafter is greedy):

    - accept d with probability min(1, p(d) / q(d)) = p(d): accept iff ``u_accept[j] < p(d)``;
    - at the first rejection stop; the bonus is drawn from the residual
      ``max(0, p - q) / sum(max(0, p - q))``. With q = e_d the residual is p with entry d set to
      0 (p(d) - 1 <= 0), i.e. p restricted to tokens != d, renormalised;
    - if all B-1 drafts are accepted the bonus is drawn from probs[B-1].

    Same distribution as :func:`chain_sampled_core`: there, the rows are sampled independently,
    so row j matches d with probability p_j(d) (the acceptance probability above), and given
    that it does not match, the sampled token is distributed as p_j restricted to tokens != d,
    renormalised (the residual above). Both forms therefore give
    P(a = k, bonus = x) = prod_{j<k} p_j(d_j) * p_k(x) [x != d_k]   for k < B-1,
    P(a = B-1, bonus = x) = prod_{j<B-1} p_j(d_j) * p_(B-1)(x).
    They consume random numbers differently, so the same seed gives different tokens.

    Args:
        block: [..., B] int.
        probs: [..., B, V] target probabilities per block row (rows sum to 1).
        u_accept: [..., B-1] uniform draws for the accept tests.
        u_bonus: [...] uniform draw for the bonus.
    Returns:
        (a [...], bonus [...]) int64.
    """
    block = np.asarray(block)
    p = np.asarray(probs, dtype=np.float64)
    drafts = block[..., 1:]  # [..., B-1]
    p_draft = np.take_along_axis(p[..., :-1, :], drafts[..., None], axis=-1)[..., 0]  # [..., B-1]
    accepted = np.asarray(u_accept) < p_draft  # [..., B-1]
    a = np.sum(np.cumprod(accepted, axis=-1), axis=-1).astype(np.int64)  # [...]
    k = drafts.shape[-1]
    p_a = np.take_along_axis(p, a[..., None, None], axis=-2)[..., 0, :]  # [..., V]: row a
    q = np.zeros_like(p_a)  # draft distribution at row a: one-hot at d_a; 0 after a full accept
    if k > 0:
        rejected = a < k  # [...]
        d_a = np.take_along_axis(drafts, np.minimum(a, k - 1)[..., None], axis=-1)  # [..., 1]
        np.put_along_axis(q, d_a, 1.0, axis=-1)
        q *= rejected[..., None]
    residual = np.maximum(p_a - q, 0.0)  # [..., V]
    bonus = sample_from_probs(residual, u_bonus)
    return a, bonus


def sample_tokens(be: Backend | str, logits, temperature: float, rng,
                  role: str = "target") -> np.ndarray:
    """HF ref ``sample(logits, T)``: argmax if T < 1e-5, else one multinomial draw per row.

    Used for the prefill's first token (``dflash_generate``) and by the sampled verifier.

    Args:
        logits: [R, V] (backend array).
        rng: ``np.random.Generator`` or int seed (unused when greedy).
        role: named in the error when the logits are non-finite.
    Returns:
        [R] int64 host array.
    Raises:
        NonFiniteLogitsError: a row holds NaN or +-inf.
    """
    be = as_backend(be)
    if temperature < GREEDY_BELOW_TEMPERATURE:
        return greedy_posterior(be, logits, role=role)
    probs = target_probs(be, logits, temperature, role)  # [R, V]
    return sample_from_probs(probs, as_generator(rng).random(probs.shape[:-1]))


def verify_chain_sampled(be: Backend | str, block, target_logits, temperature: float,
                         rng) -> ChainVerifyResult:
    """Sampled chain verify as the HF ref does it (``dflash_generate`` at temperature > 0).

    posterior = :func:`sample_tokens` of the B rows; a draft is accepted iff it equals the
    sampled target token; bonus = posterior[a]. Lossless in distribution (the committed tokens
    are distributed as sampling from the target one token at a time): see
    :func:`chain_rejection_core`. A temperature below 1e-5 is greedy, as in the HF ref.

    Args:
        block: [B] int.
        target_logits: [B, V] (backend array).
        temperature: T.
        rng: ``np.random.Generator`` or int seed; draws B uniforms.
    """
    b = _check_block(block)
    posterior = sample_tokens(be, target_logits, temperature, rng, role="verify")  # [B]
    if posterior.shape[0] != b.shape[0]:
        raise ValueError(f"target_logits has {posterior.shape[0]} rows, block has {b.shape[0]}")
    return _chain_result(b, posterior)


def verify_chain_rejection(be: Backend | str, block, target_logits, temperature: float,
                           rng) -> ChainVerifyResult:
    """Sampled chain verify in the explicit rejection-sampling form (:func:`chain_rejection_core`).

    Same distribution as :func:`verify_chain_sampled` (SGLang's
    ``compute_dflash_sampling_correct_drafts_and_bonus`` with draft_probs = 0 is this form).
    ``posterior`` in the result holds the accepted drafts followed by the bonus (length a+1): rows
    after the bonus are never sampled in this form. A temperature below 1e-5 is greedy.

    Args:
        block: [B] int.
        target_logits: [B, V] (backend array).
        rng: ``np.random.Generator`` or int seed; draws B-1 accept uniforms, then one for the bonus.
    """
    b = _check_block(block)
    if temperature < GREEDY_BELOW_TEMPERATURE:
        return verify_chain_greedy(be, b, target_logits)
    probs = target_probs(be, target_logits, temperature)  # [B, V]
    if probs.shape[0] != b.shape[0]:
        raise ValueError(f"target_logits has {probs.shape[0]} rows, block has {b.shape[0]}")
    g = as_generator(rng)
    u_accept = g.random(b.shape[0] - 1)
    u_bonus = g.random()
    a, bonus = chain_rejection_core(b, probs, u_accept, u_bonus)
    a = int(a)
    posterior = np.concatenate([b[1 : 1 + a], [int(bonus)]]).astype(np.int64)
    return ChainVerifyResult(a=a, accepted=tuple(int(t) for t in b[1 : 1 + a]),
                             bonus=int(bonus), posterior=posterior)
