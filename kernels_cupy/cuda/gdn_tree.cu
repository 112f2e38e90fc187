// gdn_tree.cu: Gated DeltaNet over a draft tree, every node in one launch per op.
// Reference: dflash_ref/ops/gdn_tree.py (equations: docs/gdn.md, "Tree verify: every node in one
// pass"). Same layouts as gdn.cu with T = n tree nodes; parents [n] int32, -1 <= parents[i] < i
// (checked on the host by the wrapper), node_states [n, HV, K, V].
//
// Kernels:
//   gdn_tree_recurrent_f32  the recurrence over the whole tree: node i steps from its parent's
//       state (a root from state_in) and writes its state to node_states[i]. The thread
//       mapping of gdn_recurrent_f32 (gdn.cu): grid (HV, ceil(V / GDN_TREE_COLS)), block
//       (GDN_TREE_COLS = 32, GDN_TREE_WARPS = 8); lane x of warp y owns column tile * 32 + x and
//       rows y, y + 8, ... (K <= 8 * GDN_TREE_MAX_ROWS = 256) of one value head, lanes along the
//       contiguous V axis (one 128-byte transaction per warp for every state access). The block
//       walks the nodes in index order (topological). Its registers hold the state of the node
//       it stepped last; when parents[i] is that node (a chain) nothing is loaded, otherwise each
//       thread reloads its own elements of node_states[parents[i]] (or of state_in): elements
//       the same thread wrote earlier, so no barrier and no other block is involved, and no
//       host synchronisation anywhere. parents[i] is the same for the whole block, so the
//       reload branch never diverges. Dot products as gdn_recurrent_f32: each thread's rows,
//       then the 8 warps' partials through shared memory in a fixed order (two barriers per
//       node).
//   causal_conv1d_tree_f32  y[i, c] = silu(sum_j w[c, j] xx[win[i, j], c]) with
//       xx = concat(state^T, x) and win [n, W] the window table built on the host
//       (tree_conv_window): grid-stride, one thread per (node, channel).
//   conv_tree_states_f32    node_states[i, c, j] = xx[win[i, j + 1], c]: grid-stride, one thread
//       per element.
// Launch assumptions: blockDim == (GDN_TREE_COLS, GDN_TREE_WARPS) for the recurrent kernel; every
// float pointer is contiguous float32, parents and win are contiguous int32; int arguments are
// 32-bit (the wrappers cast with np.int32).

#define GDN_TREE_COLS 32       // value columns per block (= lanes)
#define GDN_TREE_WARPS 8       // row groups (warps) per block
#define GDN_TREE_MAX_ROWS 32   // rows per thread: K <= GDN_TREE_WARPS * GDN_TREE_MAX_ROWS = 256

extern "C" __global__ void gdn_tree_recurrent_f32(
    const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ g, const float* __restrict__ beta,
    const float* __restrict__ state_in, const int* __restrict__ parents,
    float* __restrict__ node_states, float* __restrict__ o, const int n, const int H,
    const int HV, const int K, const int V, const int kda, const float scale) {
    __shared__ float part_rd[GDN_TREE_WARPS][GDN_TREE_COLS];
    __shared__ float part_out[GDN_TREE_WARPS][GDN_TREE_COLS];
    const int hv = blockIdx.x;
    const int lane = threadIdx.x;  // column within the tile: consecutive lanes, consecutive floats
    const int wy = threadIdx.y;    // row group: rows wy, wy + GDN_TREE_WARPS, ...
    const int col = blockIdx.y * GDN_TREE_COLS + lane;
    const bool live = col < V;     // dead lanes still reach every __syncthreads
    const int hk = hv / (HV / H);  // grouped GQA mapping

    float s[GDN_TREE_MAX_ROWS];
    int held = -2;  // the node whose state s[] holds (-1: state_in); -2: nothing yet
    for (int t = 0; t < n; ++t) {
        const int p = parents[t];  // the same for every thread of the block
        if (p != held) {
            // Load the parent's state: elements this thread itself wrote at node p (or the
            // committed state for a root).
            const float* src = p < 0 ? state_in : node_states + (long long)p * HV * K * V;
#pragma unroll
            for (int i = 0; i < GDN_TREE_MAX_ROWS; ++i) {
                const int kk = wy + GDN_TREE_WARPS * i;
                s[i] = (live && kk < K) ? src[((long long)hv * K + kk) * V + col] : 0.0f;
            }
        }
        gdn_token_step<GDN_TREE_WARPS, GDN_TREE_MAX_ROWS>(
            s, part_rd, part_out, q, k, v, g, beta, o, t, H, HV, K, V, hv, hk, wy, lane, col,
            live, kda, scale);  // gdn_step.cuh: steps 1-5 of token t
        const long long th = (long long)t * HV + hv;
        if (live) {  // node t's state: what a child of t reloads
#pragma unroll
            for (int i = 0; i < GDN_TREE_MAX_ROWS; ++i) {
                const int kk = wy + GDN_TREE_WARPS * i;
                if (kk < K) node_states[(th * K + kk) * V + col] = s[i];
            }
        }
        held = t;
    }
}


// x: [n, D]; w: [D, W]; state: [D, W - 1]; win: [n, W]; y: [n, D].
extern "C" __global__ void causal_conv1d_tree_f32(const float* __restrict__ x,
                                                  const float* __restrict__ w,
                                                  const float* __restrict__ state,
                                                  const int* __restrict__ win,
                                                  float* __restrict__ y, const int n, const int D,
                                                  const int W) {
    const long long total = (long long)n * D;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(idx % D);
        const int i = (int)(idx / D);
        float acc = 0.0f;
        for (int j = 0; j < W; ++j)  // tap j, oldest first, as causal_conv1d_f32
            acc += w[(long long)c * W + j] * gdn_conv_input(x, state, win[i * W + j], c, D, W);
        y[idx] = acc / (1.0f + expf(-acc));  // silu
    }
}

// node_states: [n, D, W - 1], the last W - 1 raw inputs of each node's path, oldest first.
extern "C" __global__ void conv_tree_states_f32(const float* __restrict__ x,
                                                const float* __restrict__ state,
                                                const int* __restrict__ win,
                                                float* __restrict__ node_states, const int n,
                                                const int D, const int W) {
    const long long total = (long long)n * D * (W - 1);
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(idx % (W - 1));
        const int c = (int)((idx / (W - 1)) % D);
        const int i = (int)(idx / ((long long)(W - 1) * D));
        node_states[idx] = gdn_conv_input(x, state, win[i * W + j + 1], c, D, W);
    }
}
