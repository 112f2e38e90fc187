"""The conventions in force for one case, keyed by the headings of docs/conventions.md.

Each entry states the rule as it applies to this target / drafter pair (the numbers a dumper must
reproduce), so a case explains itself without the docs at hand. A test checks that every
heading of docs/conventions.md (except its closing "Lessons from the seeds") has an entry.
"""

from __future__ import annotations

import dataclasses


def _rope(spec) -> dict:
    return {k: v for k, v in dataclasses.asdict(spec).items()
            if isinstance(v, int | float | str | type(None))}


def conventions_in_force(target, drafter, block_size: int) -> dict[str, dict]:
    """{heading of docs/conventions.md: {"rule": text, ...the values in force}}."""
    tc = target.config
    dc = drafter.config if drafter is not None else None
    out = {
        "The sliding-window inequality": {
            "rule": "a causal query at q sees a key at k iff 0 <= q - k < W (W keys, itself "
                    "included)",
            "target_sliding_window": tc.sliding_window,
            "sliding_layers": [i for i, t in enumerate(tc.layer_types)
                               if t == "sliding_attention"]},
        "Layer ids: which hidden state is captured": {
            "rule": "capture id i = the residual stream after decoder layer i, un-normed (HF "
                    "hidden_states[i + 1]); features concatenated in target_layer_ids order; "
                    "stored here per layer as step<N>.target.layer<i>.features",
            "target_layer_ids": list(target.target_layer_ids)},
        "Layer ids in GGUF files: the \"+1\"": {
            "rule": "drafter.gguf is written in llama.cpp's naming (arch 'dflash'), whose "
                    "dflash.target_layers stores HF id + 1",
            "gguf_target_layers": [i + 1 for i in target.target_layer_ids]},
        "The Gemma embedding scale and its rounding": {
            "rule": "embedding rows times sqrt(hidden) rounded to the embedding dtype (HF); "
                    "null: no scale",
            "embedding_scale": tc.embedding_scale,
            "embedding_scale_exact": tc.embedding_scale_exact},
        "The attention scale": {"rule": "softmax scale of the target's attention",
                                "attention_scale": tc.attention_scale,
                                "drafter_attention_scale": (dc.head_dim ** -0.5 if dc else None)},
        "The final logit softcap": {
            "rule": "cap * tanh(logits / cap), once, in the target's lm_head; the drafter's head "
                    "calls it too", "final_logit_softcapping": tc.final_logit_softcapping,
            "attn_logit_softcapping": tc.attn_logit_softcapping},
        "Sampled verify: which form each implementation uses": {
            "rule": "temperature > 0: 'rejection' (the release: sampled drafts, rejection "
                    "sampling with the residual, DFlash 2 on its candidates) unless the run asks "
                    "for 'greedy_draft' (greedy drafts, one sample per target row)"},
        "GGUF metadata a file leaves out: llama.cpp's values": {
            "rule": "target.gguf states every key it needs; a GGUF that leaves one out is read "
                    "with llama.cpp's value (listed in the config's defaults_used)",
            "defaults_used": list(getattr(tc, "defaults_used", ()) or ())},
        "Non-finite logits": {
            "rule": "argmax: NaN ranks above every number, the first NaN wins (NumPy's rule, on "
                    "every backend); verify and draft refuse NaN/inf logits with "
                    "NonFiniteLogitsError instead of emitting a token"},
        "Norm weights: `w` or `1 + w`": {
            "rule": "rms_norm multiplies by offset + w", "target_norm_offset": tc.norm_offset,
            "drafter_norm_offset": 0.0, "gdn_gated_norm_offset": 0.0},
        "Grouped-query head mapping": {
            "rule": "query head h reads kv head h // (nh / nkv) (HF repeat_kv); GDN value heads "
                    "grouped the same way in HF tensors",
            "num_attention_heads": tc.num_attention_heads,
            "num_key_value_heads": tc.num_key_value_heads},
        "The RoPE base lookup order": {
            "rule": "per layer type: rope_parameters[type].rope_theta, then "
                    "rope_parameters.rope_theta, then rope_theta; never defaulted",
            "target": {t: _rope(r) for t, r in tc.rope_by_type.items()},
            "drafter": ({t: _rope(r) for t, r in dc.rope_by_type.items()} if dc else None)},
        "Gate inputs": {
            "rule": "the entropy gate's p1 comes from the bonus row; the commit-EMA gate's "
                    "commit_n is a + 1; the hard floor fires below 0.5 * margin"},
        "What tau and the acceptance rate count": {
            "rule": "tau = mean of a + 1 over verify steps; acceptance rate = accepted / drafted, "
                    "bonus excluded; step<N>.verify.accepted is a"},
    }
    if dc is not None:
        out["Sliding layers in the drafter: `swa_convention`"] = {
            "rule": "how a drafter sliding layer masks context and noise keys",
            "swa_convention": dc.swa_convention, "sliding_window": dc.sliding_window,
            "layer_types": list(dc.layer_types)}
        out["The drafter's own embedding scale"] = {
            "rule": "noise rows = target embed_tokens rows times the drafter's own scale",
            "noise_embedding_scale": float(drafter.embedding_scale)}
        out["The mask token and the block positions"] = {
            "rule": "block [t_s, m x (B-1)] at positions s..s+B-1 over the committed context "
                    "0..s-1; drafts = argmax of rows 1..B-1 (stored as draft_logits rows 0..B-2)",
            "mask_token_id": dc.mask_token_id, "drafter_block_size": dc.block_size,
            "block_size": block_size}
    return out
