"""Independent forms of sampled chain verify, kept as oracles for the tests (not the package).

``generate`` runs one sampled verify, the release's rejection sampling with the residual
(:func:`dflash_ref.spec_decode.verify.verify_chain_sampled`). With a greedy drafter (a one-hot
draft law ``q = e_d``) it has the same law as two older forms written here from their sources:

- :func:`hf_verify_chain_sampled`: the HF reference's ``dflash_generate`` at T > 0 (z-lab/dflash
  ``dflash/model.py`` @44947fb): a token sampled per target row, a draft accepted iff it equals it;
- :func:`chain_rejection_core`: speculative sampling with ``q = e_d``, batched over trials:
  accept d with probability ``min(1, p(d)/q(d)) = p(d)``; at the first rejection the bonus is
  drawn from ``max(0, p - q)``, i.e. p with d removed, renormalised.

Both forms give ``P(a = k, bonus = x) = prod_{j<k} p_j(d_j) * p_k(x) [x != d_k]`` (k < B-1) and
``prod_{j<B-1} p_j(d_j) * p_(B-1)(x)`` (a full accept), the law tests/spec_decode/test_sampling.py
checks. :func:`verify_one_hot` calls the package's form with the one-hot law, in the older forms'
call shape, so the same assertions run on it.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.ops.sampling import (
    DraftProposal,
    SamplingParams,
    as_generator,
    sample_from_probs,
    sample_tokens,
)
from dflash_ref.spec_decode.verify import ChainVerifyResult, accept_length, verify_chain_sampled


def hf_verify_chain_sampled(be, block, target_logits, temperature: float,
                            rng) -> ChainVerifyResult:
    """The HF reference's sampled verify: ``posterior[j] ~ softmax(row j / T)`` for all B rows
    (B uniforms), a = the prefix of drafts equal to it, bonus = ``posterior[a]``. A temperature
    below 1e-5 is greedy, as in the HF ref."""
    b = np.asarray(block, dtype=np.int64)
    posterior = sample_tokens(be, target_logits, SamplingParams(temperature), rng,
                              role="verify")  # [B]
    if posterior.shape[0] != b.shape[0]:
        raise ValueError(f"target_logits has {posterior.shape[0]} rows, block has {b.shape[0]}")
    a = int(accept_length(b[1:], posterior))
    return ChainVerifyResult(a=a, accepted=tuple(int(t) for t in b[1: 1 + a]),
                             bonus=int(posterior[a]), posterior=posterior)


def chain_rejection_core(block, probs, u_accept, u_bonus) -> tuple[np.ndarray, np.ndarray]:
    """Speculative sampling with a one-hot draft law, batched over leading dimensions.

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
    q = np.zeros_like(p_a)  # draft law at row a: one-hot at d_a; 0 after a full accept
    if k > 0:
        rejected = a < k  # [...]
        d_a = np.take_along_axis(drafts, np.minimum(a, k - 1)[..., None], axis=-1)  # [..., 1]
        np.put_along_axis(q, d_a, 1.0, axis=-1)
        q *= rejected[..., None]
    residual = np.maximum(p_a - q, 0.0)  # [..., V]
    return a, sample_from_probs(residual, u_bonus)


def verify_one_hot(be, block, target_logits, temperature: float, rng) -> ChainVerifyResult:
    """The package's :func:`verify_chain_sampled` on greedy drafts: the proposal's law is the
    one-hot ``q = e_d`` (B-1 accept uniforms, then one for the bonus)."""
    b = np.asarray(block, dtype=np.int64)
    q = np.zeros((b.size - 1, int(target_logits.shape[-1])))  # [B-1, V]
    q[np.arange(b.size - 1), b[1:]] = 1.0
    return verify_chain_sampled(be, b, target_logits, DraftProposal(b[1:], q),
                                SamplingParams(temperature), as_generator(rng))
