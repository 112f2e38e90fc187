"""Apply each plausible one-line bug to a scratch checkout and run the tests that should kill it.

Issue 13 listed bugs that once left the whole CPU suite green; each now has a test that turns
red. This script keeps that claim checkable: it edits one line in a scratch copy, runs the named
test file, restores the line, and prints KILLED (with the failing tests) or SURVIVED.

    git worktree add /tmp/mutants HEAD --detach
    python scripts/check_mutants.py /tmp/mutants
    git worktree remove --force /tmp/mutants

Never point it at a checkout with uncommitted work: it rewrites files in place (and restores
them). A "PATTERN NOT FOUND" line means the code moved: update the pattern, not the test.
"""

import os
import subprocess
import sys

ROOT = sys.argv[1]
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
        'positions, r.theta,',
        'positions, 1e6,',
        'tests/models/test_drafter_rope.py',
    ),
    (
        '4 pager not reset on reuse',
        'dflash_ref/models/stores.py',
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
        'self.last_logits = out.logits[res.bonus_row: res.bonus_row + 1]',
        'self.last_logits = out.logits[-1:]',
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
        'dflash_ref/spec_decode/decoding.py',
        'features, positions = self.state.features.rows(cache.length, s),',
        'features, positions = self.state.features.rows(cache.length, s) * 0,',
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
        'self._k[self.length : end] = k',
        'self._k[self.length - 1 : end - 1] = k',
        'tests/models/test_drafter.py',
    ),
]
env = dict(os.environ, PYTHONPATH=ROOT)
for name, f, old, new, tests in MUTANTS:
    p = os.path.join(ROOT, f)
    src = open(p).read()
    n = src.count(old)
    if n == 0:
        print(f"{name}: PATTERN NOT FOUND")
        continue
    open(p, "w").write(src.replace(old, new))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", tests],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    open(p, "w").write(src)
    failed = [l.split(" ")[1] for l in r.stdout.splitlines() if l.startswith("FAILED")]
    print(f"{name} [{f}, {n}x]: {'KILLED by ' + ', '.join(failed) if failed else 'SURVIVED'}")
