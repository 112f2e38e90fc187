"""NumPy reference ops: the specification every CuPy twin must match.

``OP_FAMILIES`` is the op table's single source of truth: family -> op names. The NumPy reference
of op ``name`` in family ``fam`` is ``dflash_ref.ops.<fam>.<name>``; its CuPy twin is
``kernels_cupy.<fam>.<name>`` with the same signature (tests/test_backend.py checks this).
To add an op: write the reference here, the twin in ``kernels_cupy``, list it below, and add the
three kinds of tests (docs/backend.md walks through it).
"""

OP_FAMILIES: dict[str, tuple[str, ...]] = {
    "norm": ("rms_norm", "add_rms_norm", "norm_add_rms_norm", "l2_norm", "gated_rms_norm"),
    "rope": ("rope", "qk_norm_rope"),
    "activations": ("swiglu", "geglu", "sigmoid_gate", "gdn_gates", "softmax", "log_softmax"),
    "reductions": ("argmax_rows", "top1_prob_rows", "entropy_rows", "count_nonfinite_rows"),
    "masks": ("materialize",),
    "attention": ("attention",),
    "dequant": ("dequantize_q8_0", "dequantize_q4_k", "dequantize_q6_k"),
    "gdn": ("gdn_recurrent", "gdn_chunked", "causal_conv1d"),
    "gdn_tree": ("causal_conv1d_tree", "gdn_tree_recurrent"),
    "pager": ("gather_rows", "scatter_rows", "fill_slot_pos", "write_kv"),
    "linear": ("linear",),
}
