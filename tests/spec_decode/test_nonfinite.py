"""Verify and draft refuse non-finite logits (docs/conventions.md, "Non-finite logits").

Every verifier (greedy chain, sampled chain: the package's form and the HF reference's form of
tests/spec_decode/oracle_sampling.py, tree) and both draft paths
(``DFlashDrafter.draft_tokens``, the DDTree top-k) raise NonFiniteLogitsError naming the role, the
rows and the NaN/+inf/-inf counts, instead of emitting a token; finite logits pass untouched.
Expected rows and counts are read off the hand-built inputs.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dflash_ref.backend import get_backend
from dflash_ref.errors import DFlashRefError, NonFiniteLogitsError
from dflash_ref.models.drafter import DFlashDrafter
from dflash_ref.models.target import TargetModel
from dflash_ref.ops.reductions import argmax_rows_checked
from dflash_ref.ops.sampling import SamplingParams, sample_tokens
from dflash_ref.spec_decode.ddtree import build_ddtree, chain_tree, topk_log_probs, verify_tree
from dflash_ref.spec_decode.verify import verify_chain_greedy
from dflash_ref.tiny import write_tiny_drafter, write_tiny_target
from tests.spec_decode.oracle_sampling import hf_verify_chain_sampled, verify_one_hot
from tests.spec_decode.targets import logits_for

NP = get_backend("numpy")
BLOCK = np.array([5, 7, 9, 2])
V = 12


def _poisoned(rows_values: dict[int, list[tuple[int, float]]]) -> np.ndarray:
    """Finite logits for BLOCK (argmax rows [7, 9, 4, 11]) with entries overwritten."""
    x = logits_for([7, 9, 4, 11], V=V).astype(np.float32)  # [4, V]
    for r, entries in rows_values.items():
        for j, v in entries:
            x[r, j] = v
    return x


# (case, poisoned entries, expected rows, (n_nan, n_posinf, n_neginf))
CASES = [
    ("one NaN", {2: [(0, np.nan)]}, (2,), (1, 0, 0)),
    ("NaN row", {1: [(j, np.nan) for j in range(V)]}, (1,), (V, 0, 0)),
    ("+inf", {0: [(3, np.inf)]}, (0,), (0, 1, 0)),
    ("-inf", {3: [(5, -np.inf)]}, (3,), (0, 0, 1)),
    ("mixed rows", {0: [(1, np.nan)], 3: [(2, np.inf), (4, -np.inf)]}, (0, 3), (1, 1, 1)),
]


def _check(err: NonFiniteLogitsError, role: str, rows, counts) -> None:
    assert err.role == role and err.rows == tuple(rows)
    assert (err.n_nan, err.n_posinf, err.n_neginf) == counts
    msg = str(err)
    assert msg.startswith(f"{role} logits are non-finite")
    assert f"rows {list(rows)}" in msg and "features" in msg and "mask" in msg


def test_error_type():
    assert issubclass(NonFiniteLogitsError, DFlashRefError)
    assert issubclass(NonFiniteLogitsError, ValueError)


@pytest.mark.parametrize("case,entries,rows,counts", CASES, ids=[c[0] for c in CASES])
def test_greedy_chain_and_tree_verify_refuse(case, entries, rows, counts):
    x = _poisoned(entries)
    calls = {
        "greedy": lambda: verify_chain_greedy(NP, BLOCK, x),
        "tree": lambda: verify_tree(NP, chain_tree(BLOCK), x),
        "sampled T~0": lambda: hf_verify_chain_sampled(NP, BLOCK, x, 1e-6, rng=0),
        "rejection T~0": lambda: verify_one_hot(NP, BLOCK, x, 1e-6, rng=0),
    }
    for name, call in calls.items():
        with pytest.raises(NonFiniteLogitsError) as info:
            call()
        assert info.value.role == "verify", name
        _check(info.value, "verify", rows, counts)


@pytest.mark.parametrize("case,entries,rows,counts", CASES, ids=[c[0] for c in CASES])
def test_sampled_verify_refuses(case, entries, rows, counts):
    x = _poisoned(entries)
    for fn in (hf_verify_chain_sampled, verify_one_hot):
        with pytest.raises(NonFiniteLogitsError) as info:
            fn(NP, BLOCK, x, 0.7, rng=0)
        _check(info.value, "verify", rows, counts)
    with pytest.raises(NonFiniteLogitsError) as info:  # the prefill's first token
        sample_tokens(NP, x, SamplingParams(0.7), rng=0)
    _check(info.value, "target", rows, counts)


def test_finite_logits_pass_every_verifier():
    x = _poisoned({})
    x[1, 0] = -1e30  # large but finite
    assert verify_chain_greedy(NP, BLOCK, x).committed == (7, 9, 4)
    assert verify_tree(NP, chain_tree(BLOCK), x).committed == (7, 9, 4)
    for fn in (hf_verify_chain_sampled, verify_one_hot):
        assert fn(NP, BLOCK, x, 0.7, rng=0).a in range(4)
    assert sample_tokens(NP, x, SamplingParams(0.7), rng=0).shape == (4,)


def test_already_reduced_ids_are_taken_as_they_are():
    # Integer ids carry no finiteness information: the guard applies to logits only.
    assert verify_chain_greedy(NP, BLOCK, np.array([7, 9, 4, 11])).a == 2


def test_guard_adds_no_host_copy_on_finite_logits():
    # ids and the non-finite counts travel in one device -> host copy; the logits are copied only
    # on the error path, to name the rows.
    copies = []

    def to_numpy(a):
        copies.append(np.shape(a))
        return np.asarray(a)

    be = SimpleNamespace(ops=NP.ops, xp=np, to_numpy=to_numpy)
    x = _poisoned({})
    assert argmax_rows_checked(be, x, "verify").tolist() == [7, 9, 4, 11]
    assert copies == [(2, 4)]
    copies.clear()
    with pytest.raises(NonFiniteLogitsError):
        argmax_rows_checked(be, _poisoned({1: [(0, np.nan)]}), "verify")
    assert copies == [(2, 4), (4, V)]


# -- draft ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    root = tmp_path_factory.mktemp("nonfinite")
    target_dir = write_tiny_target(root / "t", "qwen3", seed=3)
    target = TargetModel.from_pretrained(target_dir)
    return DFlashDrafter.from_pretrained(write_tiny_drafter(root / "d", target_dir, seed=4), target)


def test_draft_tokens_refuses_and_names_block_rows(drafter):
    x = _poisoned({2: [(0, np.nan), (1, np.nan)], 3: [(0, np.inf)]})  # block rows 2 and 3
    with pytest.raises(NonFiniteLogitsError) as info:
        drafter.draft_tokens(x)
    _check(info.value, "draft", (2, 3), (2, 1, 0))


def test_draft_tokens_ignores_the_anchor_row(drafter):
    # Row 0 (the anchor) is not drafted from, so its values do not matter.
    x = _poisoned({0: [(0, np.nan)]})
    assert drafter.draft_tokens(x).tolist() == [9, 4, 11]
    assert drafter.draft_tokens(_poisoned({})).tolist() == [9, 4, 11]


def test_nan_features_reach_draft_tokens_as_an_error(drafter):
    # The seeds' failure: the drafter reads feature rows that were never written (NaN here, as
    # an unwritten buffer in these tests) and its logits turn NaN; draft_tokens must not emit ids.
    n, width = 6, drafter.fc.shape[1]  # [ctx, C*H]
    feats = np.random.default_rng(0).standard_normal((n, width)).astype(np.float32)
    logits = drafter.forward_block(feats, np.arange(n), 3, n)
    assert drafter.draft_tokens(logits).shape == (drafter.block_size - 1,)
    feats[n - 2:] = np.nan  # the last two context rows were never filled
    logits = drafter.forward_block(feats, np.arange(n), 3, n)
    with pytest.raises(NonFiniteLogitsError) as info:
        drafter.draft_tokens(logits)
    assert info.value.role == "draft" and info.value.rows == tuple(range(1, drafter.block_size))


def test_ddtree_draft_refuses():
    x = _poisoned({1: [(4, np.nan)]})  # depth rows 1..4 -> block rows 1..4; this is block row 2
    for call in (lambda: topk_log_probs(NP, x, 2), lambda: build_ddtree(NP, 5, x)):
        with pytest.raises(NonFiniteLogitsError) as info:
            call()
        _check(info.value, "draft", (2,), (1, 0, 0))
    ids, _ = topk_log_probs(NP, _poisoned({}), 1)
    assert ids[:, 0].tolist() == [7, 9, 4, 11]


# -- CuPy: the same refusals with the same rows and counts ----------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("case,entries,rows,counts", CASES, ids=[c[0] for c in CASES])
def test_cupy_verify_and_draft_refuse_like_numpy(case, entries, rows, counts):
    cp_be = get_backend("cupy")
    x = cp_be.to_backend(_poisoned(entries))
    for call in (lambda: verify_chain_greedy(cp_be, BLOCK, x),
                 lambda: verify_tree(cp_be, chain_tree(BLOCK), x),
                 lambda: verify_one_hot(cp_be, BLOCK, x, 0.7, rng=0)):
        with pytest.raises(NonFiniteLogitsError) as info:
            call()
        _check(info.value, "verify", rows, counts)
    drafted = tuple(r for r in rows if r >= 1)  # draft_tokens drops row 0, the anchor
    if drafted:
        with pytest.raises(NonFiniteLogitsError) as info:
            argmax_rows_checked(cp_be, x[1:], "draft", first_row=1)
        assert info.value.role == "draft" and info.value.rows == drafted
    else:
        assert argmax_rows_checked(cp_be, x[1:], "draft", first_row=1).tolist() == [9, 4, 11]
    finite = cp_be.to_backend(_poisoned({}))
    assert verify_chain_greedy(cp_be, BLOCK, finite).committed == (7, 9, 4)
