"""An exported case below the greedy threshold is a greedy case (dflash_ref/oracle/export.py).

``generate`` decodes greedily below T = 1e-5 (dflash_ref/ops/sampling.py); the case it records
must say so: no generator in the manifest, a gate built for greedy decoding, the greedy tokens.
At T = 1e-5 itself the run samples. The oracle is the case exported at T = 0.
"""

from __future__ import annotations

import numpy as np

from dflash_ref.oracle import export
from dflash_ref.oracle.cases import DEMO_PROMPT, case_models


def test_a_case_below_the_greedy_threshold_is_recorded_and_gated_as_greedy(tmp_path,
                                                                           monkeypatch):
    # Catches ``sampled = temperature > 0``: a gate calibrated for sampling and a generator
    # named in the manifest of a run that drew nothing.
    built = []
    make_gate = export.make_gate
    monkeypatch.setattr(export, "make_gate",
                        lambda spec, sampled: built.append(sampled) or make_gate(spec, sampled))
    target_dir, drafter_dir = case_models("demo", tmp_path)
    kw = dict(max_new_tokens=4, block_size=4, gate="entropy", gguf=False)
    below = float(np.nextafter(1e-5, 0.0))
    runs = {t: export.export_case(tmp_path / f"t{i}", target_dir, drafter_dir, DEMO_PROMPT,
                                  temperature=t, seed=0, **kw)["run"]
            for i, t in enumerate((0.0, below, 1e-5))}
    assert built == [False, False, True]
    assert [r["rng"] is None for r in runs.values()] == [True, True, False]
