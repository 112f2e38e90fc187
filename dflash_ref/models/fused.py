"""The fused forms of a decoder layer's components: each residual add with the RMSNorm that
reads the sum (:class:`FusedAddNorm`, :class:`FusedPostNormAddNorm`), and an attention layer's
q/k norms with its RoPE (:class:`FusedNormRope`).

The layer (:class:`~dflash_ref.models.layers.DecoderLayer`) is handed its normed input and hands
the next layer its own, so every add that a norm of the sum follows is one ``add_rms_norm``
(docs/backend.md, "Fused ops"): the mixer's add with the layer's pre-MLP norm, the MLP's add with
the next layer's input norm, the last layer's with the final norm. Where a sub-block ends with
its own norm (Gemma's sandwich norms), that norm, the add and the next norm are one
``norm_add_rms_norm``; where a layer maps the stream after its last add (Gemma 4's
:class:`~dflash_ref.models.gemma4.LayerOutputAdd`), that add stays plain and the next norm runs
alone. :func:`~dflash_ref.models.assemble.decoder_layers` chooses each form once, from the
config: the ops a fused form calls take one eps and offset for both norms, as a config gives
every norm of a target.

Each form computes what its reference component computes, on the same values in the same order,
so the results are the reference's bit for bit on NumPy (``add_rms_norm`` is the add then
``rms_norm``): checked on every family, logits, features and every tap, by
tests/models/test_fused_norms.py and test_fused_qk.py, as are the fused and plain calls per
forward. A :class:`~dflash_ref.models.target.TargetModel` runs these forms by default.
"""

from __future__ import annotations

from dflash_ref.models.gemma import PostNormAddNorm
from dflash_ref.models.layers import AddNorm, NormRope, Rope
from dflash_ref.models.state import no_tap


class FusedAddNorm(AddNorm):
    """:class:`~dflash_ref.models.layers.AddNorm` as one ``add_rms_norm``: ``(m, x + m,
    norm(x + m))``, where the add and a norm would read h back; bit-identical to the pair on
    NumPy. ``norm`` an :class:`~dflash_ref.models.layers.RMSNorm`."""

    def __call__(self, x, m, batch):
        """x, m [T, H] -> three [T, H]."""
        n = self.norm
        return (m, *n.be.ops.add_rms_norm(m, x, n.weight, n.eps, n.offset))


class FusedPostNormAddNorm(PostNormAddNorm):
    """:class:`~dflash_ref.models.gemma.PostNormAddNorm` as one ``norm_add_rms_norm``: the post
    norm of b, the add and the next norm in one launch where two took it. Both norms are
    :class:`~dflash_ref.models.layers.RMSNorm` s of one eps and offset (a Gemma config's)."""

    def __call__(self, x, b, batch):
        """x, b [T, H] -> (post_norm(b), x + post_norm(b), norm(x + post_norm(b)))."""
        p, n = self.post_norm, self.norm
        return n.be.ops.norm_add_rms_norm(b, x, p.weight, n.weight, n.eps, n.offset)


class FusedNormRope(NormRope):
    """:class:`~dflash_ref.models.layers.NormRope` (q and k normed, then rotated) as one
    ``qk_norm_rope`` op: one launch on CuPy where the reference makes four (two norms, two
    RoPEs), reading q and k in place from the stacked q/k/v product; equal to the four calls
    bit for bit on NumPy (the op's reference is their composition; tests/models/test_fused_qk.py
    runs every family both ways). Made by :func:`~dflash_ref.models.assemble.decoder_layers`
    where :meth:`fits`.

    The taps are the reference's: "q_rope", "k_rope" see the op's outputs; "q" and "k" (after
    the norms, before RoPE) are computed for an observer alone (``batch.tap`` not ``no_tap``),
    so observing adds two norms and changes nothing the layer computes.
    """

    def __init__(self, reference: NormRope):
        super().__init__(reference.idx, reference.q_norm, reference.k_norm, reference.rope)
        norms = [n for n in (self.q_norm, self.k_norm) if n.weight is not None]
        self.eps, self.offset = (norms[0].eps, norms[0].offset) if norms else (0.0, 0.0)
        self.weights = [self.q_norm.weight, self.k_norm.weight]  # [d] each, or None (Identity)

    @staticmethod
    def fits(reference: NormRope) -> bool:
        """Whether one op computes ``reference``: RoPE by the ``rope`` op (a :class:`Rope`; Gemma
        4's proportional RoPE keeps the reference), the norms (RMSNorm, or Identity: no weight)
        with one eps and offset. Asked once per layer, when the layers are assembled."""
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
