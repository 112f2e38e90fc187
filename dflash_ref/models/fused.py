"""The fused forms of a decoder layer's components, one op where the reference makes several
(docs/backend.md, "Fused ops"); each computes what its reference computes, in the same order, so
the results are the reference's bit for bit on NumPy (tests/models/test_fused_norms.py, _qk.py).
"""

from __future__ import annotations

from dflash_ref.models.gemma import PostNormAddNorm
from dflash_ref.models.layers import AddNorm, NormRope, Rope
from dflash_ref.models.state import no_tap


class FusedAddNorm(AddNorm):
    """:class:`~dflash_ref.models.layers.AddNorm` as one ``add_rms_norm``."""

    def __call__(self, x, m, batch):
        """x, m [T, H] -> three [T, H]."""
        n = self.norm
        return (m, *n.be.ops.add_rms_norm(m, x, n.weight, n.eps, n.offset))


class FusedPostNormAddNorm(PostNormAddNorm):
    """:class:`~dflash_ref.models.gemma.PostNormAddNorm` as one ``norm_add_rms_norm`` (both
    norms of one eps and offset, as a config gives them)."""

    def __call__(self, x, b, batch):
        """x, b [T, H] -> (post_norm(b), x + post_norm(b), norm(x + post_norm(b)))."""
        p, n = self.post_norm, self.norm
        return n.be.ops.norm_add_rms_norm(b, x, p.weight, n.weight, n.eps, n.offset)


class FusedNormRope(NormRope):
    """:class:`~dflash_ref.models.layers.NormRope` as one ``qk_norm_rope`` op (four launches
    in one), where :meth:`fits`. The taps are the reference's: "q" and "k" (normed, before
    RoPE) are computed for an observer alone, so observing changes nothing computed.
    """

    def __init__(self, reference: NormRope):
        super().__init__(reference.idx, reference.q_norm, reference.k_norm, reference.rope)
        norms = [n for n in (self.q_norm, self.k_norm) if n.weight is not None]
        self.eps, self.offset = (norms[0].eps, norms[0].offset) if norms else (0.0, 0.0)
        self.weights = [self.q_norm.weight, self.k_norm.weight]  # [d] each, or None (Identity)

    @staticmethod
    def fits(reference: NormRope) -> bool:
        """Whether one op computes ``reference``: RoPE by the ``rope`` op (a :class:`Rope`), the
        norms (RMSNorm, or Identity: no weight) of one eps and offset."""
        norms = [n for n in (reference.q_norm, reference.k_norm) if n.weight is not None]
        return isinstance(reference.rope, Rope) and len({(n.eps, n.offset) for n in norms}) <= 1

    def __call__(self, q, k, batch):
        """q [T, nh, d], k [T, nkv, d] -> (q, k) normed and rotated: contiguous, same shapes."""
        tap, r = batch.tap, self.rope.spec
        if tap is not no_tap:  # an observer also sees the normed q and k (class docstring)
            tap(self.idx, "q", self.q_norm(q))
            tap(self.idx, "k", self.k_norm(k))
        q, k = self.rope.be.ops.qk_norm_rope(q, k, batch.arrays.positions, *self.weights,
                                             self.eps, self.offset, r.theta, r.rotary_dim,
                                             r.factor)
        tap(self.idx, "q_rope", q)
        tap(self.idx, "k_rope", k)
        return q, k
