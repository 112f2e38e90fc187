"""The decoder stack with each residual add fused into the RMSNorm that reads the sum, and an
attention layer's q/k norms fused with its RoPE (:class:`FusedNormRope`, at the end).

The reference (:func:`dflash_ref.models.layers.run_layers`) runs each layer as two residual
lines and then the next layer's input norm. Here every add that a norm of the sum follows is one
``add_rms_norm`` (:func:`add_normed`; docs/backend.md, "Fused ops"): the mixer's add with the
layer's pre-MLP norm, the MLP's add with the next layer's input norm, the last layer's with the
final norm. A layer therefore starts from the normed input the previous one handed over::

    u = input_norm_0(x)
    for layer i:                                     # next_norm: input_norm_(i+1), or final
        m, x, u = add_normed(pre_mlp_norm, x, mixer, u)         # x += m; u = pre_mlp_norm(x)
        m, x, u = add_normed(next_norm, x, feed_forward, x, u)  # x += m; u = next_norm(x)
    return u                                         # final_norm(x_L)

Where a layer maps the stream after its last add (``layer.output``, Gemma 4's per-layer input
and layer scalar), that add stays plain and the next norm runs alone. Where a sub-block ends
with its own norm (Gemma's sandwich norms), that norm, the add and the next norm are one
``norm_add_rms_norm`` (:func:`add_normed`). The same parts are called
in the same order on the same values, with the same taps, as in the reference (written out here,
as a fused kernel would be, rather than through the reference layer's sub-blocks), so the
results are the reference's bit for bit on NumPy (``add_rms_norm`` is the add then
``rms_norm``): checked on every family, logits, features and every tap, by
tests/models/test_fused_norms.py, as are the fused and plain calls per forward. The
:class:`~dflash_ref.models.target.TargetModel` runs this form by default.
"""

from __future__ import annotations

from dflash_ref.models.gemma import PostNormed
from dflash_ref.models.layers import Identity, NormRope, RMSNorm, Rope
from dflash_ref.models.state import no_tap


def run_fused(layers, x, batch, final_norm, capture=()):
    """:func:`~dflash_ref.models.layers.run_layers`, with fused adds (module docstring).

    x [T, H] (the embeddings) -> (final_norm(x_L) [T, H], {i: x_i [T, H]} for i in ``capture``).
    """
    norms = [layer.input_norm for layer in layers] + [final_norm]
    u = norms[0](x)
    captured = {}
    for layer, next_norm in zip(layers, norms[1:]):
        x, u = fused_layer(layer, x, u, batch, next_norm)
        if layer.idx in capture:
            captured[layer.idx] = x
    return u, captured


def fused_layer(layer, x, u, batch, next_norm):
    """One decoder layer from its normed input u = input_norm(x) [T, H]: the reference layer's
    parts, called in its order with its taps, each add fused into the norm after it.

    Returns (x [T, H], next_norm(x) [T, H]): the layer's output and the next one's input.
    """
    i, tap = layer.idx, batch.tap
    tap(i, "attn_norm", u)
    m, x, u = add_normed(layer.pre_mlp_norm, x, layer.mixer, u, batch)  # x += m; u = norm(x)
    tap(i, "attn_out", m)
    tap(i, "mlp_norm", u)
    if layer.output is None:  # the layer ends with its add: fuse it with the next norm
        m, x, u = add_normed(next_norm, x, layer.feed_forward, x, u, batch)
        tap(i, "mlp_out", m)
    else:  # something maps the stream between the add and the next norm
        m = layer.feed_forward(x, u, batch)
        tap(i, "mlp_out", m)
        x = layer.output(x + m, batch)
        u = next_norm(x)
    tap(i, "h", x)
    return x, u


def add_normed(norm, x, sub, *args):
    """What a sub-block adds, the stream after the add, and its norm: ``m = sub(*args)``, then
    ``(m, x + m, norm(x + m))`` from one ``add_rms_norm`` (an add and a norm that would read h
    back; bit-identical to the pair on NumPy). A Gemma sub-block with its own post norm
    (:class:`~dflash_ref.models.gemma.PostNormed`, the same eps and offset) runs its block and
    then one ``norm_add_rms_norm``, which norms the block's output too: one launch where the
    post norm and the add + norm took two. ``norm`` an :class:`RMSNorm`; x [T, H] -> three
    [T, H]."""
    ops, post = norm.be.ops, getattr(sub, "post_norm", None)
    if isinstance(sub, PostNormed) and type(post) is RMSNorm and (post.eps, post.offset) == (
            norm.eps, norm.offset):
        return ops.norm_add_rms_norm(sub.block(*args), x, post.weight, norm.weight, norm.eps,
                                     norm.offset)
    m = sub(*args)
    return (m, *ops.add_rms_norm(m, x, norm.weight, norm.eps, norm.offset))


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
        norms = [n for n in (self.q_norm, self.k_norm) if isinstance(n, RMSNorm)]
        self.eps, self.offset = (norms[0].eps, norms[0].offset) if norms else (0.0, 0.0)
        self.weights = [n.weight if isinstance(n, RMSNorm) else None
                        for n in (self.q_norm, self.k_norm)]  # [d] each, or None

    @staticmethod
    def fits(reference: NormRope) -> bool:
        """Whether one op computes ``reference``: RoPE by the ``rope`` op (:class:`Rope`; Gemma
        4's proportional RoPE keeps the reference), each norm an :class:`RMSNorm` or
        :class:`Identity`, the norms with one eps and offset."""
        norms = (reference.q_norm, reference.k_norm)
        if type(reference.rope) is not Rope or not all(
                type(n) in (RMSNorm, Identity) for n in norms):
            return False
        return len({(n.eps, n.offset) for n in norms if isinstance(n, RMSNorm)}) <= 1

    def __call__(self, q, k, batch):
        """q [T, nh, d], k [T, nkv, d] -> (q, k) normed and rotated: contiguous, same shapes."""
        tap, r = batch.tap, self.rope.spec
        if tap is not no_tap:  # an observer also sees the normed q and k (module docstring)
            tap(self.idx, "q", self.q_norm(q))
            tap(self.idx, "k", self.k_norm(k))
        q, k = self.rope.be.ops.qk_norm_rope(q, k, batch.arrays.positions, *self.weights,
                                             self.eps, self.offset, r.theta, r.rotary_dim,
                                             r.factor)
        tap(self.idx, "q_rope", q)
        tap(self.idx, "k_rope", k)
        return q, k
