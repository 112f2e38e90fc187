// attention_mask.cuh: the MaskSpec visibility predicate, shared by the attention families that
// evaluate masks inline (attention.cu, attention_decode.cu, attention_prefill.cu). _build.py
// prepends it to those families' sources (FAMILY_HEADERS). Reference: dflash_ref/ops/masks.py (key_visible).

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
