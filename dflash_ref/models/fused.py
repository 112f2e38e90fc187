"""The decoder stack with each residual add fused into the RMSNorm that reads the sum.

The reference (:func:`dflash_ref.models.layers.run_layers`) runs each layer as two residual
lines and then the next layer's input norm. Here every add that a norm of the sum follows is one
``add_rms_norm`` (``RMSNorm.add``; docs/backend.md, "Fused ops"): the mixer's add with the
layer's pre-MLP norm, the MLP's add with the next layer's input norm, the last layer's with the
final norm. A layer therefore starts from the normed input the previous one handed over::

    u = input_norm_0(x)
    for layer i:                                     # next_norm: input_norm_(i+1), or final
        x, u = pre_mlp_norm.add(x, mixer(u))         # x = x + m; u = pre_mlp_norm(x)
        x, u = next_norm.add(x, feed_forward(x, u))  # x = x + m; u = next_norm(x)
    return u                                         # final_norm(x_L)

Where a layer maps the stream after its last add (``layer.output``, Gemma 4's per-layer input
and layer scalar), that add stays plain and the next norm runs alone. The same parts are called
in the same order on the same values, with the same taps, as in the reference (written out here,
as a fused kernel would be, rather than through the reference layer's sub-blocks), so the
results are the reference's bit for bit on NumPy (``add_rms_norm`` is the add then
``rms_norm``): checked on every family, logits, features and every tap, by
tests/models/test_fused_norms.py, as are the fused and plain calls per forward. The
:class:`~dflash_ref.models.target.TargetModel` runs this form by default.
"""

from __future__ import annotations


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
    m = layer.mixer(u, batch)
    tap(i, "attn_out", m)
    x, u = layer.pre_mlp_norm.add(x, m)  # x = x + m; u = pre_mlp_norm(x)
    tap(i, "mlp_norm", u)
    m = layer.feed_forward(x, u, batch)
    tap(i, "mlp_out", m)
    if layer.output is None:  # the layer ends with its add: fuse it with the next norm
        x, u = next_norm.add(x, m)  # x = x + m; u = next_norm(x)
    else:  # something maps the stream between the add and the next norm
        x = layer.output(x + m, batch)
        u = next_norm(x)
    tap(i, "h", x)
    return x, u
