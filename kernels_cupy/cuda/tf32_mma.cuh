// tf32_mma.cuh: the 3xTF32 split and one m16n8k8 TF32 MMA for the tensor-core kernels that keep
// float32 accuracy and the non-finite rule (attention_prefill_tc.cu, gdn_chunk_tc.cu). _build.py
// prepends it to those families' sources (FAMILY_HEADERS). The split and its error bound:
// kernels_cupy/tf32.py; the non-finite convention: kernels_cupy/attention_prefill_tc.py.

// cvt.rna.tf32.f32: the nearest TF32 (ties away from zero), as the bits of a float32 (PTX ISA,
// "cvt", the .rna modifier). inf stays inf, NaN stays NaN.
__device__ __forceinline__ unsigned tc_tf32(const float v) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(v));
    return r;
}

// An operand x = hi + lo for the three MMAs a_hi b_hi + a_lo b_hc + a_hc b_lo. Finite x:
// hi = tf32(x), lo = tf32(x - hi) (the subtraction is exact), hc = hi. Non-finite x (or a hi
// that rounded to inf): lo = hc = 0, so x reaches the result only through hi x hi, which has
// the class of the float32 product (tf32(inf - inf) would be NaN, and 0 * inf in a cross
// product NaN, turning a -inf score into NaN).
struct TcSplit {
    unsigned hi, lo, hc;
};
__device__ __forceinline__ TcSplit tc_split(const float x) {
    TcSplit s;
    s.hi = tc_tf32(x);
    const float h = __uint_as_float(s.hi);
    const bool finite = fabsf(h) < INFINITY;  // false for inf and NaN
    s.lo = finite ? tc_tf32(x - h) : 0u;
    s.hc = finite ? s.hi : 0u;
    return s;
}

// d = A B + d: one mma.sync.m16n8k8, TF32 operands (row-major A, column-major B), float32
// accumulator (PTX ISA, "Warp-level matrix multiply-accumulate instructions", mma.m16n8k8 with
// .tf32). Fragments (g = lane >> 2, t = lane & 3): A a0 (g, t), a1 (g + 8, t), a2 (g, t + 4),
// a3 (g + 8, t + 4); B b0 (k = t, n = g), b1 (k = t + 4, n = g); C / D c0 (g, 2 t),
// c1 (g, 2 t + 1), c2 (g + 8, 2 t), c3 (g + 8, 2 t + 1).
__device__ __forceinline__ void tc_mma(float (&d)[4], const unsigned a0, const unsigned a1,
                                       const unsigned a2, const unsigned a3, const unsigned b0,
                                       const unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 3xTF32: lo += a_lo b_hc, lo += a_hc b_lo, hi += a_hi b_hi (the caller adds hi + lo once).
__device__ __forceinline__ void tc_mma3(float (&hi)[4], float (&lo)[4], const TcSplit (&a)[4],
                                        const TcSplit (&b)[2]) {
    tc_mma(lo, a[0].lo, a[1].lo, a[2].lo, a[3].lo, b[0].hc, b[1].hc);
    tc_mma(lo, a[0].hc, a[1].hc, a[2].hc, a[3].hc, b[0].lo, b[1].lo);
    tc_mma(hi, a[0].hi, a[1].hi, a[2].hi, a[3].hi, b[0].hi, b[1].hi);
}
