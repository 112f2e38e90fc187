"""Apply each plausible one-line bug to a scratch copy and run the tests that should kill it.

Issue 13 listed bugs that once left the whole CPU suite green; issue 26 added the classes the
oracle had not pinned (DFlash 2's convolutions and selector, the draft law, Gemma 4's scaled
proportional RoPE, MoE placement and norm_topk_prob, snapshots of reused states, golden compare
tolerances, the tree step's gate wiring, generate --chat, the SPM tie order); then the newest
code's (fixed-capacity stores' snapshots and exact capacities, replay keys, the trees' draft rows,
the last step's drafted count, the sampling law's exact edges). Each now has a test that turns
red without torch. This script keeps that claim checkable: it edits one line in a
scratch copy, runs the named test file, restores the line, and prints KILLED (with the failing
tests) or SURVIVED; it exits 1 if any mutant survives or its pattern is not found.

    python scripts/check_mutants.py                 # on a fresh copy of this checkout (CI)
    python scripts/check_mutants.py --only 13 14    # the mutants whose names start so
    python scripts/check_mutants.py /tmp/mutants    # on a checkout of your own

Never point it at a checkout with uncommitted work: it rewrites files in place (and restores
them). A "PATTERN NOT FOUND" line means the code moved: update the pattern, not the test.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MUTANTS = [  # (bug, file, the line as it is, the line with the bug, the test file)
    (
        '1a SWA causal_block/noncausal window W-1 (config visibility)',
        'dflash_ref/config/drafter.py',
        'back = w if self.swa_convention == "bidirectional" else w - 1',
        'back = w if self.swa_convention == "bidirectional" else w - 2',
        'tests/models/test_drafter_swa.py',
    ),
    (
        '1b SWA bidirectional window W-1 (config visibility)',
        'dflash_ref/config/drafter.py',
        'back = w if self.swa_convention == "bidirectional" else w - 1',
        'back = w - 1 if self.swa_convention == "bidirectional" else w - 1',
        'tests/models/test_drafter_swa.py',
    ),
    (
        '1c SWA left window W-1 (drafter layer_mask)',
        'dflash_ref/models/drafter.py',
        'window=vis.max_back + 1, causal=causal)',
        'window=vis.max_back, causal=causal)',
        'tests/models/test_drafter_swa.py',
    ),
    (
        '1d SWA bidirectional window W-1 (drafter layer_mask)',
        'dflash_ref/models/drafter.py',
        'window=vis.max_back, causal=causal,',
        'window=vis.max_back - 1, causal=causal,',
        'tests/models/test_drafter_swa.py',
    ),
    (
        '2 Gemma attention scale from head_dim',
        'dflash_ref/config/gemma.py',
        'attention_scale=qpas ** -0.5,',
        'attention_scale=head_dim ** -0.5,',
        'tests/models/test_gemma3_conventions.py',
    ),
    (
        '3 drafter RoPE base hard-wired 1e6',
        'dflash_ref/models/drafter.py',
        '0.0, r.theta,',
        '0.0, 1e6,',
        'tests/models/test_drafter_rope.py',
    ),
    (
        '4 pager not reset on reuse',
        'dflash_ref/models/pool_store.py',
        '        pager.reset()  # a reused pager',
        '        pass  # a reused pager',
        'tests/kvflash/test_pager_reuse.py',
    ),
    (
        '5 GDN state not carried after a long prefill',
        'dflash_ref/models/gdn_store.py',
        '        self.store.state = after\n',
        '        self.store.state = after if self.keep_trace else before\n',
        'tests/models/test_hybrid_long_prefill.py',
    ),
    (
        '6 entropy gate fed the last verify row',
        'dflash_ref/spec_decode/decoding.py',
        'row = out.logits[k: k + 1]',
        'row = out.logits[-1:]',
        'tests/spec_decode/test_gate_wiring.py',
    ),
    (
        '7 commit-EMA commit count without the bonus',
        'dflash_ref/spec_decode/decoding.py',
        'StepObservation(commit_n=produced, step_wall=modelled',
        'StepObservation(commit_n=produced - 1, step_wall=modelled',
        'tests/spec_decode/test_gate_wiring.py',
    ),
    (
        '8a RoPE linear scaling ignored (config)',
        'dflash_ref/config/rope.py',
        '    if rope_type == "default":\n        factor = 1.0',
        '    if rope_type in ("default", "linear"):\n        factor = 1.0',
        'tests/models/test_gemma3_conventions.py',
    ),
    (
        '8b RoPE linear scaling ignored (layer)',
        'dflash_ref/models/layers.py',
        'r.rotary_dim, r.factor)',
        'r.rotary_dim, 1.0)',
        'tests/models/test_gemma3_conventions.py',
    ),
    (
        '8c RoPE linear scaling ignored (the fused q/k norm + RoPE)',
        'dflash_ref/models/fused.py',
        '                                             r.factor)',
        '                                             1.0)',
        'tests/models/test_gemma3_conventions.py',
    ),
    (
        '9a hard floor at 0.4 margin',
        'dflash_ref/spec_decode/gate.py',
        'self.ema < 0.5 * self.margin',
        'self.ema < 0.4 * self.margin',
        'tests/spec_decode/test_gate_wiring.py',
    ),
    (
        '9b hard floor at 0.6 margin',
        'dflash_ref/spec_decode/gate.py',
        'self.ema < 0.5 * self.margin',
        'self.ema < 0.6 * self.margin',
        'tests/spec_decode/test_gate_wiring.py',
    ),
    (
        'F zeroed features into the drafter',
        'dflash_ref/spec_decode/drafting.py',
        'features = self.state.features.rows(start, position)',
        'features = self.state.features.rows(start, position) * 0',
        'tests/spec_decode/test_feature_drafter.py',
    ),
    (
        '10 tree GDN: a node steps from the previous node, not its parent',
        'dflash_ref/ops/gdn_tree.py',
        'S = (root if parents[i] < 0 else node_states[parents[i]]).copy()  # [HV, K, V]',
        'S = (root if parents[i] < 0 else node_states[i - 1]).copy()  # [HV, K, V]',
        'tests/ops/test_gdn_tree.py',
    ),
    (
        '11 drafter staging: the block\'s K/V written one row into the committed ones',
        'dflash_ref/models/cache.py',
        'self.be.ops.write_kv(self._kv, k, v, start=self.length)  # rows len..end-1, K and V',
        'self.be.ops.write_kv(self._kv, k, v, start=self.length - 1)  # rows len..end-1, K and V',
        'tests/models/test_drafter.py',
    ),
    # ---- the newest code's blind spots, part 2: GGUF key spellings, output modes, the argument
    # checks' edges, a rollback after a restore, a sampled run's greedy gate, the linear plan's
    # load count, SPM ties between pieces of different lengths
    (
        '40a GGUF keys: the separator written under the corrected spelling',
        'dflash_ref/io/vocab_gguf.py',
        '("sep_token", "seperator_token_id")',
        '("sep_token", "separator_token_id")',
        'tests/io/test_vocab_gguf.py',
    ),
    (
        '40b GGUF keys: the CLS token written under a guessed key',
        'dflash_ref/io/vocab_gguf.py',
        '("cls_token", "cls_token_id")',
        '("cls_token", "classifier_token_id")',
        'tests/io/test_vocab_gguf.py',
    ),
    (
        '40c GGUF keys: the padding token read as pad_token_id',
        'dflash_ref/io/tokenizer.py',
        '("pad_token", "padding_token_id")):',
        '("pad_token", "pad_token_id")):',
        'tests/io/test_tokenizer.py',
    ),
    (
        '40d GGUF keys: the unknown token read as unk_token_id',
        'dflash_ref/io/tokenizer.py',
        '("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):',
        '("unk_token", "unk_token_id"), ("pad_token", "padding_token_id")):',
        'tests/io/test_tokenizer.py',
    ),
    (
        '40e GGUF keys: the drafter\'s mask token written under a guessed key',
        'dflash_ref/io/convert_drafter.py',
        'md["tokenizer.ggml.mask_token_id"] = cfg.mask_token_id',
        'md["tokenizer.ggml.mask_id"] = cfg.mask_token_id',
        'tests/io/test_convert_drafter.py',
    ),
    (
        '41a output modes: a written file left private (mkstemp\'s 0600)',
        'dflash_ref/io/writing.py',
        '    os.chmod(tmp, 0o666 & ~current_umask())',
        '    pass',
        'tests/test_output_file_modes.py',
    ),
    (
        '41b output modes: an exported case folder made private (0700)',
        'dflash_ref/io/writing.py',
        '            self.path.mkdir()  # made with 0o777 minus the umask',
        '            self.path.mkdir(mode=0o700)',
        'tests/test_output_file_modes.py',
    ),
    (
        '42a edges: generate accepts id == vocab_size',
        'dflash_ref/spec_decode/arguments.py',
        'prompt.max() >= vocab:',
        'prompt.max() > vocab:',
        'tests/test_argument_boundaries.py',
    ),
    (
        '42b edges: the CLI accepts id == vocab_size',
        'dflash_ref/cli_args.py',
        'bad = [i for i in ids if i >= vocab_size]',
        'bad = [i for i in ids if i > vocab_size]',
        'tests/test_argument_boundaries.py',
    ),
    (
        '42c edges: generate warns at exactly max_position_embeddings',
        'dflash_ref/spec_decode/arguments.py',
        'prompt.size + max_new_tokens > limit:',
        'prompt.size + max_new_tokens >= limit:',
        'tests/test_argument_boundaries.py',
    ),
    (
        '42d edges: generate lets max_position_embeddings + 1 through',
        'dflash_ref/spec_decode/arguments.py',
        'prompt.size + max_new_tokens > limit:',
        'prompt.size + max_new_tokens - 1 > limit:',
        'tests/test_argument_boundaries.py',
    ),
    (
        '42e edges: the CLI refuses exactly max_position_embeddings',
        'dflash_ref/cli_args.py',
        'n_prompt + max_new_tokens > max_positions:',
        'n_prompt + max_new_tokens >= max_positions:',
        'tests/test_argument_boundaries.py',
    ),
    (
        '42f edges: the CLI lets max_position_embeddings + 1 through',
        'dflash_ref/cli_args.py',
        'n_prompt + max_new_tokens > max_positions:',
        'n_prompt + max_new_tokens - 1 > max_positions:',
        'tests/test_argument_boundaries.py',
    ),
    (
        '43 restore: a reused GDN state keeps its previous batch\'s trace (a rollback rewinds it)',
        'dflash_ref/models/gdn_store.py',
        '        self.length = length\n        self.tree, self.last = None, None',
        '        self.length = length\n        self.tree = None',
        'tests/models/test_snapshot_reuse.py',
    ),
    (
        '44a greedy gate, sampled run: the warm-up decided by the gate\'s flag, not the run',
        'dflash_ref/spec_decode/gate.py',
        '        if sampled:\n            return 0',
        '        if self.sampled:\n            return 0',
        'tests/spec_decode/test_gate_sampled.py',
    ),
    (
        '44b greedy gate, sampled run: the loop tells the gate the run is greedy',
        'dflash_ref/spec_decode/decoding.py',
        'self.gate.start_turn(self.cursor.max_new_tokens, not self.sampler.law.greedy)',
        'self.gate.start_turn(self.cursor.max_new_tokens, False)',
        'tests/spec_decode/test_gate_sampled.py',
    ),
    (
        '45a linear plan: per-thread loads floored (the K % THREADS leftover groups lost)',
        'kernels_cupy/linear_plan.py',
        '    per_thread = math.ceil(K // group / THREADS)',
        '    per_thread = K // group // THREADS',
        'tests/kernels/test_linear_plan.py',
    ),
    (
        '45b linear plan: per-thread loads counted in elements, not float4 groups',
        'kernels_cupy/linear_plan.py',
        '    per_thread = math.ceil(K // group / THREADS)',
        '    per_thread = math.ceil(K / THREADS)',
        'tests/kernels/test_linear_plan.py',
    ),
    (
        '46 SPM: an equal-score tie goes to the longer left piece, not the leftmost pair',
        'dflash_ref/io/spm.py',
        'heapq.heappush(queue, (-score[merged], left, right, len(merged)))',
        'heapq.heappush(queue, ((-score[merged], -len(piece[left])), left, right, len(merged)))',
        'tests/io/test_spm_tie_order.py',
    ),
    (
        'TC1 tf32 rounding: half a TF32 ulp rounds down (not cvt.rna\'s ties away)',
        'kernels_cupy/tf32.py',
        'rounded = ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)',
        'rounded = ((bits + np.uint32(0x0FFF)) & np.uint32(0xFFFFE000)).view(np.float32)',
        'tests/kernels/test_tf32_bound.py::test_round_tf32_hand_cases',
    ),
    (
        'TC2 bf16 storage: ties rounded up, not to even',
        'kernels_cupy/tf32.py',
        '    odd = (bits >> np.uint32(16)) & np.uint32(1)',
        '    odd = np.uint32(1)',
        'tests/kernels/test_tf32_bound.py::test_round_bf16_equals_ggml',
    ),
    (
        'TC3 3xTF32 bound: the lo accumulator counted with one MMA per k-step',
        'kernels_cupy/linear_mma_plan.py',
        '    lo_mmas = 1 if weights == "bf16" else 2',
        '    lo_mmas = 1',
        'tests/kernels/test_linear_mma.py::test_grid_and_depths_by_hand',
    ),
    (
        'TC4 tensor-core prefill bound: the score\'s lo accumulator counted with one MMA a step',
        'kernels_cupy/attention_prefill_tc.py',
        '    return 8 * ks + 1, 16 * ks + 1',
        '    return 8 * ks + 1, 8 * ks + 1',
        'tests/kernels/test_attention_prefill_tc.py::test_the_bound_by_hand_at_d128_and_4096_keys',
    ),
    (
        'TC5 tensor-core prefill chosen on a device older than sm_80',
        'kernels_cupy/attention_prefill_tc.py',
        '    if tensor_cores and PREFILL_TC and tc_fits(d, vec4):',
        '    if PREFILL_TC and tc_fits(d, vec4):',
        'tests/kernels/test_attention_prefill_tc.py',
    ),
    (
        'TC6 tensor-core prefill: the warps\' p tiles left out of the shared memory',
        'kernels_cupy/attention_prefill_tc.py',
        '    return 4 * (BQ * ldk + stages * BK * (ldk + ldv) + WARPS * 16 * LDP)',
        '    return 4 * (BQ * ldk + stages * BK * (ldk + ldv))',
        'tests/kernels/test_attention_prefill_tc.py',
    ),
    (
        'TC7 tensor-core GDN state pass chosen on a device older than sm_80',
        'kernels_cupy/gdn.py',
        '    if tensor_cores and gdn_state_tc.STATE_TC:',
        '    if gdn_state_tc.STATE_TC:',
        'tests/kernels/test_gdn_state_tc.py',
    ),
    (
        'TC8 tensor-core GDN state bound: the fold left out of the next state\'s products',
        'kernels_cupy/gdn_state_tc.py',
        'FD = (np.asarray(fold, np.float32)[:, None] * Delta.astype(np.float32))',
        'FD = (np.ones_like(fold, np.float32)[:, None] * Delta.astype(np.float32))',
        'tests/kernels/test_gdn_state_tc.py',
    ),
    (
        'TC9 tensor-core GDN state pass: W rows without their bank padding',
        'kernels_cupy/gdn_state_tc.py',
        '    ldw, ldk = _round(Kp8, 32) + 4, _round(C8, 32) + 4',
        '    ldw, ldk = _round(Kp8, 32), _round(C8, 32) + 4',
        'tests/kernels/test_gdn_state_tc.py',
    ),
    # ---- issue 26: the oracle's blind spots (each killed without torch)
    (
        '12 SPM: equal scores merge the rightmost pair, not the leftmost',
        'dflash_ref/io/spm.py',
        'heapq.heappush(queue, (-score[merged], left, right, len(merged)))',
        'heapq.heappush(queue, (-score[merged], -left, right, len(merged)))',
        'tests/io/test_spm_tie_order.py',
    ),
    (
        '13a DFlash 2 conv: the per-token kernel from the input row, not the output row',
        'dflash_ref/models/dflash2_conv.py',
        'kernel = base[j].reshape(1, G, group_size) + dynamic[j:, j, :, None]',
        'kernel = base[j].reshape(1, G, group_size) + dynamic[: T - j, j, :, None]',
        'tests/models/test_release_fixture.py',
    ),
    (
        '13b DFlash 2 conv: the kernel projection\'s halves swapped',
        'dflash_ref/models/dflash2_conv.py',
        'return grouped_dynamic_causal_conv(xp, u, dyn[:, 0], base[0], group_size), dyn[:, 1]',
        'return grouped_dynamic_causal_conv(xp, u, dyn[:, 1], base[0], group_size), dyn[:, 0]',
        'tests/models/test_release_fixture.py',
    ),
    (
        '13c DFlash 2 conv: the second convolution uses the first base kernel',
        'dflash_ref/models/dflash2_conv.py',
        'w[name + ".base_kernel"][1], group_size)',
        'w[name + ".base_kernel"][0], group_size)',
        'tests/models/test_release_fixture.py',
    ),
    (
        '13d DFlash 2 selector: predecessor and successor codebooks swapped',
        'dflash_ref/models/dflash2.py',
        'row = unary[i] + self.succ[cand[i]] @ (self.pred[prev] * g[i])',
        'row = unary[i] + self.pred[cand[i]] @ (self.succ[prev] * g[i])',
        'tests/models/test_release_fixture.py',
    ),
    (
        '13e DFlash 2 selector: the path does not advance (every row given the anchor)',
        'dflash_ref/models/dflash2.py',
        'prev = tokens[i] = int(cand_h[i, index[i]])',
        'tokens[i] = int(cand_h[i, index[i]])',
        'tests/models/test_release_fixture.py',
    ),
    (
        '14a draft law: the selector\'s q forgets the temperature',
        'dflash_ref/models/dflash2.py',
        'q_i = target_probs("numpy", scores, law.temperature)',
        'q_i = target_probs("numpy", scores, 1.0)',
        'tests/models/test_release_fixture.py',
    ),
    (
        '14b draft law: drafter rows skip top-p / top-k',
        'dflash_ref/ops/sampling.py',
        'q = sampling_probs(be, logits, law.temperature, law.top_p, law.top_k)  # [n-1, V]',
        'q = sampling_probs(be, logits, law.temperature)  # [n-1, V]',
        'tests/models/test_release_fixture.py',
    ),
    (
        '15 Gemma 4 proportional RoPE: the scaling factor dropped',
        'dflash_ref/models/gemma4.py',
        'return (inv / np.float32(spec.factor)).astype(np.float32)',
        'return inv.astype(np.float32)',
        'tests/models/test_gemma4_rope_factor.py',
    ),
    (
        '16a MoE placement: layer % step instead of (layer + 1) % step',
        'dflash_ref/config/qwen.py',
        'and (layer + 1) % self.decoder_sparse_step == 0)',
        'and layer % self.decoder_sparse_step == 0)',
        'tests/models/test_moe_placement.py',
    ),
    (
        '16b MoE: norm_topk_prob parsed but never read',
        'dflash_ref/models/moe.py',
        'self.renormalise = cfg.moe.norm_topk_prob',
        'self.renormalise = True',
        'tests/models/test_moe_placement.py',
    ),
    (
        '17a snapshot: K/V rows shared with the state, not copied',
        'dflash_ref/models/stores.py',
        'return {self.layers[0]: (self.cache.k[:n].copy(), self.cache.v[:n].copy())}',
        'return {self.layers[0]: (self.cache.k[:n], self.cache.v[:n])}',
        'tests/models/test_snapshot_reuse.py',
    ),
    (
        '17b snapshot: feature rows shared with the buffer, not copied',
        'dflash_ref/models/cache.py',
        'return self.rows(start, n).copy(), start',
        'return self.rows(start, n), start',
        'tests/models/test_snapshot_reuse.py',
    ),
    (
        '18a golden compare: atol and rtol swapped in the test',
        'dflash_ref/oracle/compare.py',
        'bad = err > tol.atol + tol.rtol * np.abs(np.nan_to_num(r))',
        'bad = err > tol.rtol + tol.atol * np.abs(np.nan_to_num(r))',
        'tests/oracle/test_compare_tolerance_sides.py',
    ),
    (
        '18b golden compare: a manifest\'s atol read as its rtol',
        'dflash_ref/oracle/compare.py',
        'Tolerance(atol=float(t["atol"]), rtol=float(t["rtol"]),',
        'Tolerance(atol=float(t["rtol"]), rtol=float(t["atol"]),',
        'tests/oracle/test_compare_tolerance_sides.py',
    ),
    (
        '19a tree step: the gate reads the last tree node, not the bonus node',
        'dflash_ref/spec_decode/ddtree.py',
        '        return self.path[-1]',
        '        return len(self.posterior) - 1',
        'tests/spec_decode/test_gate_wiring_tree.py',
    ),
    (
        '19b tree step: the commit-EMA gate told the verify width is B',
        'dflash_ref/spec_decode/decoding.py',
        'self.step_observation(len(tokens), len(block.tokens), step_t0)',
        'self.step_observation(len(tokens), ctx.block_size, step_t0)',
        'tests/spec_decode/test_gate_wiring_tree.py',
    ),
    (
        '20 generate --chat: a second BOS before the template\'s',
        'dflash_ref/cli_generate.py',
        'return tok.encode(text, add_bos=False)  # the template writes its own BOS',
        'return tok.encode(text)  # the template writes its own BOS',
        'tests/test_cli_generate_chat.py',
    ),
    (
        '21a sampled tree: the residual between children not renormalised',
        'dflash_ref/spec_decode/tree_sampling.py',
        '    return res / total if total > 0 else r',
        '    return res if total > 0 else r',
        'tests/spec_decode/test_tree_sampling.py',
    ),
    (
        '21b sampled tree: q not renormalised after a rejected child is removed',
        'dflash_ref/spec_decode/tree_sampling.py',
        '                law = law / law.sum() if law.sum() > 0 else law',
        '                law = law',
        'tests/spec_decode/test_tree_sampling.py',
    ),
    (
        '21c rejection sampling: the bonus after a rejection drawn from p, not the residual',
        'dflash_ref/spec_decode/verify.py',
        '    residual = np.maximum(p_row - q_row, 0.0)',
        '    residual = p_row.copy()',
        'tests/testing/test_lossless.py',
    ),
    (
        '22a CUDA graphs: a forward asking for chosen logits rows captured (rows ignored)',
        'dflash_ref/models/graphs.py',
        '    if batch.parents is not None or rows is not None or T > GRAPH_MAX_ROWS:',
        '    if batch.parents is not None or T > GRAPH_MAX_ROWS:',
        'tests/models/test_graphs.py',
    ),
    (
        '22b CUDA graphs: a fixed draft cache ignores the context window',
        'dflash_ref/models/fixed_stores.py',
        '        k_pos[lo:self.length] = np.arange(lo, self.length)',
        '        k_pos[:self.length] = np.arange(self.length)',
        'tests/models/test_graphs.py',
    ),
    # ---- fixed stores and replay keys, the trees' draft rows, the last step's counts, the
    # sampling law's exact edges
    (
        '23a fixed store: a snapshot shares the rows rewritten after a rollback',
        'dflash_ref/models/fixed_stores.py',
        'return {self.layers[0]: (self.kv[0, :n].copy(), self.kv[1, :n].copy())}',
        'return {self.layers[0]: (self.kv[0, :n], self.kv[1, :n])}',
        'tests/models/test_fixed_store_bounds.py',
    ),
    (
        '23b CUDA graphs: a replay hands out the recording\'s output buffers',
        'dflash_ref/models/graphs.py',
        '        return _copied(self.run(key, step))',
        '        return self.run(key, step)',
        'tests/models/test_fixed_store_bounds.py',
    ),
    (
        '24a fixed store: a batch ending exactly at kv_capacity refused',
        'dflash_ref/models/fixed_stores.py',
        '        if start + n > self.capacity:',
        '        if start + n >= self.capacity:',
        'tests/models/test_fixed_store_bounds.py',
    ),
    (
        '24b fixed store: a snapshot of exactly kv_capacity positions refused',
        'dflash_ref/models/fixed_stores.py',
        '        if length > self.capacity:',
        '        if length >= self.capacity:',
        'tests/models/test_fixed_store_bounds.py',
    ),
    (
        '24c fixed draft cache: a context ending exactly at its capacity refused',
        'dflash_ref/models/fixed_stores.py',
        'or b > self.capacity:',
        'or b >= self.capacity:',
        'tests/models/test_fixed_store_bounds.py',
    ),
    (
        '24d feature buffer: a capacity equal to the window refused',
        'dflash_ref/models/cache.py',
        'capacity is not None and capacity < window:',
        'capacity is not None and capacity <= window:',
        'tests/models/test_fixed_store_bounds.py',
    ),
    (
        '25a CUDA graphs: the replay key ignores the tap',
        'dflash_ref/models/graphs.py',
        '    if batch.tap is not no_tap:',
        '    if batch.tap is None:',
        'tests/models/test_fixed_store_bounds.py',
    ),
    (
        '25b CUDA graphs: the draft replay key without with_hidden',
        'dflash_ref/models/fixed_stores.py',
        'return self.run_step((n, with_hidden), step)',
        'return self.run_step(n, step)',
        'tests/models/test_fixed_store_bounds.py',
    ),
    (
        '25c recording backend: the tape leaves out a mask\'s base_pos',
        'tests/device_counter.py',
        '                obj.window, obj.window_mode, obj.base_pos)',
        '                obj.window, obj.window_mode)',
        'tests/models/test_fixed_store_bounds.py',
    ),
    (
        '26a sampled tree: depth d drawn from draft row d-1',
        'dflash_ref/spec_decode/extra_verifiers.py',
        'q = sampling_probs(ctx.be, ctx.draft_logits()[1:ctx.block_size], law.temperature,',
        'q = sampling_probs(ctx.be, ctx.draft_logits()[:ctx.block_size - 1], law.temperature,',
        'tests/spec_decode/test_tree_draft_rows.py',
    ),
    (
        '26b DDTree: depth d scored from draft row d-1',
        'dflash_ref/spec_decode/extra_verifiers.py',
        'rows = ctx.draft_logits()[1:ctx.block_size]  # [B-1, V]',
        'rows = ctx.draft_logits()[:ctx.block_size - 1]  # [B-1, V]',
        'tests/spec_decode/test_tree_draft_rows.py',
    ),
    (
        '26c sampled tree: width children drawn whatever top-k / top-p left',
        'dflash_ref/spec_decode/tree_sampling.py',
        'for rank in range(min(w, int(np.count_nonzero(law)))):',
        'for rank in range(w):',
        'tests/spec_decode/test_tree_draft_rows.py',
    ),
    (
        '27a last step: the verify block min(B, remaining) rows',
        'dflash_ref/spec_decode/verifiers.py',
        'limit = ctx.remaining + 1 if self.draft_rows == "verify"',
        'limit = ctx.remaining if self.draft_rows == "verify"',
        'tests/spec_decode/test_last_step_counts.py',
    ),
    (
        '27b last step: the verify block min(B, remaining + 2) rows',
        'dflash_ref/spec_decode/verifiers.py',
        'limit = ctx.remaining + 1 if self.draft_rows == "verify"',
        'limit = ctx.remaining + 2 if self.draft_rows == "verify"',
        'tests/spec_decode/test_last_step_counts.py',
    ),
    (
        '27c last step: drafted counted as B - 1 whatever the block',
        'dflash_ref/spec_decode/decoding.py',
        '        self.result.drafted.append(width - 1)',
        '        self.result.drafted.append(self.proposer.block_size - 1)',
        'tests/spec_decode/test_last_step_counts.py',
    ),
    (
        '28a sampling: the inverse CDF counts c < u * total (a zero-probability token at u = 0)',
        'dflash_ref/ops/sampling.py',
        '    ids = np.sum(c <= x[..., None], axis=-1)  # [...]',
        '    ids = np.sum(c < x[..., None], axis=-1)  # [...]',
        'tests/ops/test_sampling_bounds.py',
    ),
    (
        '28b sampling: the last positive token found with >= 0',
        'dflash_ref/ops/sampling.py',
        'np.argmax(p[..., ::-1] > 0, axis=-1)',
        'np.argmax(p[..., ::-1] >= 0, axis=-1)',
        'tests/ops/test_sampling_bounds.py',
    ),
    (
        '28c sampling: no fall-back when u * total rounds up to the total',
        'dflash_ref/ops/sampling.py',
        '    return np.minimum(ids, last_positive).astype(np.int64)',
        '    return ids.astype(np.int64)',
        'tests/ops/test_sampling_bounds.py',
    ),
    (
        '28d sampling: T = 1e-5 itself counted greedy',
        'dflash_ref/ops/sampling.py',
        '        return self.temperature < GREEDY_BELOW_TEMPERATURE',
        '        return self.temperature <= GREEDY_BELOW_TEMPERATURE',
        'tests/ops/test_sampling_bounds.py',
    ),
    (
        '28e oracle export: a case below the greedy threshold gated and recorded as sampled',
        'dflash_ref/oracle/export.py',
        '    sampled = not SamplingParams(temperature).greedy',
        '    sampled = temperature > 0',
        'tests/oracle/test_export_greedy_threshold.py',
    ),
    (
        'explain-a rules: features judged used on the wrong side of the interval',
        'dflash_ref/diagnose/rules.py',
        '    if hi < 0:\n        return Finding(name, "ok"',
        '    if lo > 0:\n        return Finding(name, "ok"',
        'tests/diagnose/test_rules.py',
    ),
    (
        "explain-b rules: features unused on the point estimate, not the interval's bound",
        'dflash_ref/diagnose/rules.py',
        '    if -lo < UNUSED_SHARE * rate(base):',
        '    if -d < UNUSED_SHARE * rate(base):',
        'tests/diagnose/test_rules.py',
    ),
    (
        'explain-c rules: features unused on a fixed tau gap',
        'dflash_ref/diagnose/rules.py',
        '    if -lo < UNUSED_SHARE * rate(base):',
        '    if base.tau - zeroed.tau < 0.2:',
        'tests/diagnose/test_rules.py',
    ),
    (
        'explain-d rules: a rise named a fault on the point estimate',
        'dflash_ref/diagnose/rules.py',
        '    if lo > 0:\n        return Finding(name, "fault"',
        '    if d > 0:\n        return Finding(name, "fault"',
        'tests/diagnose/test_rules.py',
    ),
    (
        "explain-e rules: the comparison's runs swapped",
        'dflash_ref/diagnose/rules.py',
        '    return difference(*judged(other), *judged(base))',
        '    return difference(*judged(base), *judged(other))',
        'tests/diagnose/test_rules.py',
    ),
    (
        'explain-f rules: a 90% interval',
        'dflash_ref/diagnose/rules.py',
        'Z = 1.959963984540054',
        'Z = 1.6448536269514722',
        'tests/diagnose/test_rules.py',
    ),
    (
        "explain-g rules: the lower bound from the wrong run's half-width",
        'dflash_ref/diagnose/rules.py',
        '    return d, d - sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2)',
        '    return d, d - sqrt((p1 - l1) ** 2 + (p2 - l2) ** 2)',
        'tests/diagnose/test_rules.py',
    ),
    (
        'explain-h steps: a full accept counted as a rejection',
        'dflash_ref/diagnose/steps.py',
        'rejected=int(np.sum(a < drafted))',
        'rejected=len(steps)',
        'tests/diagnose/test_rules.py',
    ),
    (
        'explain-i rules: half of the misses taken for a majority',
        'dflash_ref/diagnose/rules.py',
        '    return top if total and 2 * s.misses[top] > total else None',
        '    return top if total and 2 * s.misses[top] >= total else None',
        'tests/diagnose/test_rules.py',
    ),
    (
        'explain-j report: every finding not ok taken for a signature',
        'dflash_ref/diagnose/__init__.py',
        '        return [f.name for f in self.findings() if f.status == "fault"]',
        '        return [f.name for f in self.findings() if f.status != "ok"]',
        'tests/diagnose/test_rules.py',
    ),
    (
        'explain-k steps: a step cut at max_new_tokens counted as a rank-0 rejection',
        'dflash_ref/diagnose/steps.py',
        '        if rank == 0:  # the target agreed with the draft',
        '        if rank == -1:  # the target agreed with the draft',
        'tests/diagnose/test_explain.py::test_step_log_ranks_the_targets_token_in_the_parting_row',
    ),
    (
        'L1 lossless harness: the exact tail test of each event dropped (rare sequences pooled)',
        'dflash_ref/testing/lossless.py',
        '    return min(1.0, len(evs) * best[0]), (best[1], best[2], best[3])',
        '    return 1.0, (best[1], best[2], best[3])',
        'tests/testing/test_harness_power.py::test_a_rare_sequence_over_produced_fails_though_the_chi_square_pools_it_away',
    ),
    (
        'L2 lossless harness: emitted outputs of probability 0 not checked',
        'dflash_ref/testing/lossless.py',
        '        if exact.get(out, 0.0) == 0.0:',
        '        if False:',
        'tests/testing/test_harness_power.py::test_a_token_top_k_removes_fails_at_once',
    ),
    (
        'L3 lossless harness: per-position marginals not tested',
        'dflash_ref/testing/lossless.py',
        '        marginal_p.append(_pooled_chi_square(m_counts, m_exact))',
        '        marginal_p.append(1.0)',
        'tests/testing/test_harness_power.py::test_a_first_token_drawn_at_a_nearby_temperature_fails',
    ),
    (
        'L4 lossless harness: max deviation scaled by the smallest standard error',
        'dflash_ref/testing/lossless.py',
        '    s = max(math.sqrt(p * (1.0 - p) / n) for _, _, p in evs)',
        '    s = min(math.sqrt(p * (1.0 - p) / n) for _, _, p in evs)',
        'tests/testing/test_harness_power.py::test_the_false_alarm_rate_of_a_correct_sampler_is_within_its_bound',
    ),
    (
        "L5 lossless harness: 4000 steps by default (a first token at T' = 0.88 passes)",
        'dflash_ref/testing/lossless.py',
        'N_TRIALS = 50_000',
        'N_TRIALS = 4_000',
        'tests/testing/test_harness_power.py::test_a_first_token_drawn_at_a_nearby_temperature_fails',
    ),
    (
        'L6 lossless harness: one-sided tails (under-production unseen)',
        'dflash_ref/testing/lossless.py',
        '    return min(1.0, 2.0 * min(binom_sf(o, n, p), binom_cdf(o, n, p)))',
        '    return min(1.0, 2.0 * binom_sf(o, n, p))',
        'tests/testing/test_harness_power.py::test_a_common_sequence_under_produced_fails_the_two_sided_tail',
    ),
    (
        'L7 lossless harness: no Bonferroni factor over the events',
        'dflash_ref/testing/lossless.py',
        '    return min(1.0, len(evs) * best[0]), (best[1], best[2], best[3])',
        '    return min(1.0, best[0]), (best[1], best[2], best[3])',
        'tests/testing/test_harness_power.py::test_the_false_alarm_rate_of_a_correct_sampler_is_within_its_bound',
    ),
    (
        'L8 binomial tail P(X >= k) shifted by one',
        'dflash_ref/testing/chisquare.py',
        '    return beta_inc(k, n - k + 1, p)',
        '    return beta_inc(k + 1, n - k, p)',
        'tests/testing/test_harness_power.py::test_binomial_tails_equal_the_sums_of_their_terms',
    ),
    (
        'R1 reduced draft vocabulary: the directory\'s d2t offsets read as absolute ids',
        'dflash_ref/io/draft_vocab.py',
        '    return d + np.arange(d.size, dtype=np.int64)',
        '    return d',
        'tests/models/test_draft_head.py',
    ),
    (
        'R2 reduced draft vocabulary: greedy drafts left as draft ids',
        'dflash_ref/models/draft_head.py',
        '        return self.to_target(super().argmax(self.gather(logits), first_row))',
        '        return super().argmax(self.gather(logits), first_row)',
        'tests/models/test_reduced_drafter.py',
    ),
    (
        'R3 reduced draft vocabulary: the sampled law q on draft ids, not on d2t',
        'dflash_ref/models/draft_head.py',
        '                             np.broadcast_to(self.ids, drawn.q.shape))',
        '                             np.broadcast_to(np.arange(self.ids.size), drawn.q.shape))',
        'tests/models/test_draft_head.py',
    ),
    # ---- lazy chain verify: the head on rows 0..a only
    (
        'V1 lazy verify: the step stops one group early (the bonus row never computed)',
        'dflash_ref/spec_decode/lazy_verify.py',
        '        if a < hi:  # row a, the bonus\'s, is read: the rows past it are never needed',
        '        if a <= hi:  # row a, the bonus\'s, is read: the rows past it are never needed',
        'tests/spec_decode/test_lazy_verify.py',
    ),
    (
        'V2 lazy verify: the drafts compared one row short',
        'dflash_ref/spec_decode/lazy_verify.py',
        '        a = int(accept_length(b[1: 1 + min(hi, n - 1)], posterior))',
        '        a = int(accept_length(b[1: min(hi, n - 1)], posterior))',
        'tests/spec_decode/test_lazy_verify.py',
    ),
    (
        'V3 lazy sampled verify: the bonus uniform drawn before the accept uniforms',
        'dflash_ref/spec_decode/lazy_verify.py',
        'u_accept, u_bonus = g.random(n - 1), g.random()',
        'u_bonus, u_accept = g.random(), g.random(n - 1)',
        'tests/spec_decode/test_lazy_verify.py',
    ),
    (
        'V5 head rows: a state that replays recorded steps verified lazily (never replayed)',
        'dflash_ref/models/head_rows.py',
        'if not state.runner.lazy_rows or (pager',
        'if (pager',
        'tests/models/test_graphs.py::test_a_graphed_state_runs_the_lazy_verify_whole',
    ),
    (
        'V4 head rows: a later run of rows read from the start of its product',
        'dflash_ref/models/head_rows.py',
        '            self.done.setdefault(r, block[r - lo])',
        '            self.done.setdefault(r, block[r])',
        'tests/spec_decode/test_lazy_verify.py',
    ),
    (
        'v3a launch books: a v3 attention counted with a combine launch',
        'tests/device_counter.py',
        '        return 2\n    return 1',
        '        return 2\n    return 2',
        'tests/models/test_launch_counts.py',
    ),
    (
        'v3b --weights bf16: "auto" without a GPU let through to the NumPy reference',
        'dflash_ref/cli_args.py',
        'if name == "numpy" or (name == "auto" and cupy_unavailable_reason() is not None):',
        'if name == "numpy":',
        'tests/test_cli.py',
    ),
    (
        'v3c decode v3 plan: a block row group one warp short (key warps halved too late)',
        'kernels_cupy/attention_decode_v3.py',
        '    while key_warps > 1 and (WARPS // key_warps) < groups:',
        '    while key_warps > 1 and (WARPS // key_warps) < groups - 1:',
        'tests/kernels/test_attention_decode_v3.py',
    ),
    (
        '39a few rows: the last block of weight rows skipped',
        'dflash_ref/ops/linear.py',
        '    for lo in range(0, N, block_rows):',
        '    for lo in range(0, N - 1, block_rows):',
        'tests/ops/test_linear.py',
    ),
    (
        '39b few rows: every row of x multiplied as the first',
        'dflash_ref/ops/linear.py',
        '            np.matmul(block, x[t], out=y[t, lo: lo + block_rows])',
        '            np.matmul(block, x[0], out=y[t, lo: lo + block_rows])',
        'tests/ops/test_linear.py',
    ),
    (
        '39c few rows: 8 rows taken row by row too',
        'dflash_ref/ops/linear.py',
        'FEW_ROWS = range(2, 8)',
        'FEW_ROWS = range(2, 9)',
        'tests/ops/test_linear.py',
    ),
    (
        '39d BLAS threads: a head of exactly LARGE_HEAD weights limited to one thread',
        'dflash_ref/backend.py',
        '            hidden_size * vocab_size >= LARGE_HEAD:',
        '            hidden_size * vocab_size > LARGE_HEAD:',
        'tests/test_backend.py',
    ),
    (
        '39e break-even: a lazy span paid only past its first row',
        'dflash_ref/spec_decode/break_even.py',
        '    spans = [(lo, hi) for lo, hi in row_spans(B, form.groups) if a >= lo]',
        '    spans = [(lo, hi) for lo, hi in row_spans(B, form.groups) if a > lo]',
        'tests/spec_decode/test_break_even.py',
    ),
    (
        '39f break-even: the oracle verifies a rows, not a + 1',
        'dflash_ref/spec_decode/break_even.py',
        '        return fixed + c.rows(a + 1)',
        '        return fixed + c.rows(max(a, 1))',
        'tests/spec_decode/test_break_even.py',
    ),
    (
        '39g break-even: the geometric law loses its tail',
        'dflash_ref/spec_decode/break_even.py',
        '    return p - np.append(p[1:], 0.0)',
        '    return p - np.append(p[1:], p[-1] * alpha)',
        'tests/spec_decode/test_break_even.py',
    ),
    (
        '39h stop tokens: generation_config.json read but not handed to the tokenizer',
        'dflash_ref/io/tokenizer.py',
        '                     source=str(path), stop_ids=generation_config_eos(path))',
        '                     source=str(path))',
        'tests/io/test_stop_tokens.py tests/test_cli_generate_chat.py',
    ),
    (
        '39i stop tokens: <|end|> dropped beside one marker of its pair',
        'dflash_ref/io/stop_tokens.py',
        '    if "<|end|>" in texts and call and ("<|return|>" in texts or "<|flush|>" in texts):',
        '    if "<|end|>" in texts and (call or "<|return|>" in texts or "<|flush|>" in texts):',
        'tests/io/test_stop_tokens.py',
    ),
    (
        '39j stop tokens: the eot key ignored',
        'dflash_ref/io/stop_tokens.py',
        'EOG_KEYS = ("eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep")',
        'EOG_KEYS = ("eos", "eom", "fim_pad", "fim_rep", "fim_sep")',
        'tests/io/test_stop_tokens.py',
    ),
    (
        '39k stop tokens: the CLI stops at EOS only',
        'dflash_ref/cli_generate.py',
        '                   stop_token_ids=list(tok.stop_token_ids),',
        '                   stop_token_ids=[tok.eos_token_id],',
        'tests/test_cli_generate_chat.py',
    ),
]


def scratch_copy() -> str:
    """A copy of this checkout's files (no .git, no caches, no virtual environments)."""
    here = Path(__file__).resolve().parents[1]
    dst = Path(tempfile.mkdtemp(prefix="dflash_mutants_")) / "tree"
    shutil.copytree(here, dst, ignore=shutil.ignore_patterns(
        ".git", ".venv*", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis",
        ".benchmarks", "*.egg-info", "build", "dist"))
    return str(dst)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", help="a scratch checkout (default: a fresh copy)")
    ap.add_argument("--only", nargs="*", default=[], help="run the mutants whose names start so")
    args = ap.parse_args()
    root = args.root or scratch_copy()
    env = dict(os.environ, PYTHONPATH=root)
    bad = 0
    for name, f, old, new, tests in MUTANTS:
        if args.only and not any(name.startswith(o) for o in args.only):
            continue
        p = os.path.join(root, f)
        src = open(p).read()
        n = src.count(old)
        if n == 0:
            print(f"{name}: PATTERN NOT FOUND")
            bad += 1
            continue
        open(p, "w").write(src.replace(old, new))
        r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            *tests.split()], cwd=root, env=env, capture_output=True, text=True)
        open(p, "w").write(src)
        failed = [ln.split(" ")[1] for ln in r.stdout.splitlines() if ln.startswith("FAILED")]
        if not failed and r.returncode not in (0, 5):  # an error (collection, import): killed
            failed = [f"(exit {r.returncode}: {r.stdout.strip().splitlines()[-1:]})"]
        bad += not failed
        print(f"{name} [{f}, {n}x]: {'KILLED by ' + ', '.join(failed) if failed else 'SURVIVED'}",
              flush=True)
    if not args.root:
        shutil.rmtree(Path(root).parent, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
