// attention_mask.cuh: the MaskSpec visibility predicate and the online softmax's shift, shared
// by the attention families that evaluate masks inline (attention.cu, attention_decode.cu,
// attention_prefill.cu). _build.py prepends it to those families' sources (FAMILY_HEADERS).
// Reference: dflash_ref/ops/masks.py (key_visible); the non-finite rule: docs/conventions.md,
// "Non-finite attention".

// The shift of the online softmax, p_j = e^(s_j - shift): the running max m, or 0 while m is
// -inf (every visible score so far -inf, or NaN, which fmaxf drops). A -inf score then gives
// p = e^(-inf) = 0 and a NaN one p = NaN, never e^(-inf + inf) = NaN for a -inf score: a row
// whose visible scores are all -inf keeps l = 0 and outputs 0, as the reference does.
__device__ __forceinline__ float att_softmax_shift(const float m) {
    return (m == __int_as_float(0xff800000)) ? 0.0f : m;
}

// The MaskSpec predicate (dflash_ref/ops/masks.py, key_visible), for query position qp and
// key slot position kp; anc_row points at row i of the ancestor matrix (used iff has_anc).
__device__ __forceinline__ bool att_key_visible(const int qp, const int kp,
                                                const unsigned char* __restrict__ anc_row,
                                                const long long j, const int causal,
                                                const int window, const int window_mode,
                                                const int has_base, const int base_pos,
                                                const int has_anc) {
    if (kp < 0) return false;  // invalid slot (free, paged out, stale)
    bool ok;
    if (has_base && kp < base_pos) ok = true;  // committed prefix
    else if (has_anc) ok = anc_row[j] != 0;    // tree verify: self or ancestor
    else if (causal) ok = kp <= qp;
    else ok = true;                            // fully visible
    if (ok && window > 0) {
        const int dist = qp - kp;
        ok = (window_mode == 0) ? (dist < window) : (abs(dist) <= window);
    }
    return ok;
}
