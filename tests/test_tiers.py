"""The reading order in tiers (scripts/architecture_numbers.py, ``TIERS``): every file lands in
one tier, tiers 1 + 2 (the real loop, target, state and drafter) stay within their line budget,
and every file one greedy speculative step runs is in a tier."""

from __future__ import annotations

import pytest

from tests.test_architecture_numbers import _script

TIER12_BUDGET = 2500


SCRIPT = _script()


def test_every_product_file_is_in_exactly_one_tier():
    files = SCRIPT.product_files()
    tiers = SCRIPT.tiers()
    assert sorted(f for tier in tiers for f in tier) == files
    assert len(tiers) == 5


@pytest.mark.parametrize(("path", "tier"), [
    ("dflash_ref/minimal.py", 0),
    ("dflash_ref/spec_decode/loop.py", 1),
    ("dflash_ref/spec_decode/cursor.py", 1),  # a part the loop may grow lands with the loop
    ("dflash_ref/ops/sampling.py", 3),
    ("dflash_ref/models/target.py", 2),
    ("dflash_ref/models/target/state.py", 2),  # a part that moves into a sub-folder stays
    ("dflash_ref/models/runner.py", 2),
    ("dflash_ref/ops/norm.py", 3),
    ("dflash_ref/ops/new_op.py", 3),
    ("dflash_ref/backend.py", 3),
    ("dflash_ref/spec_decode/gate.py", 4),
    ("dflash_ref/models/graphs.py", 4),
    ("kernels_cupy/norm.py", 4),
    ("dflash_ref/anything_new.py", 4),
])
def test_a_file_lands_in_the_first_tier_that_matches(path, tier):
    assert SCRIPT.tier_of(path)[0] == tier


def test_every_file_a_greedy_speculative_step_runs_is_in_some_tier():
    # "In some tier", not "in tiers 0 to 3": the step reports to the null observer, which lives
    # with the observers it stands in for (observe.py, tier 4).
    _, files, _ = SCRIPT.spec_step()
    outside = [f for f in files if not 0 <= SCRIPT.tier_of(f)[0] < len(SCRIPT.TIERS)]
    assert files and not outside, f"the greedy step runs files in no tier: {outside}"


def test_tiers_1_and_2_fit_their_budget():
    numbers = SCRIPT.tier_numbers()
    assert numbers["tier12_lines"] <= TIER12_BUDGET, numbers["tier_lines"]
