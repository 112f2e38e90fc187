"""DDTree build, visibility and tree verify (liranringel/ddtree ``ddtree.py``; lucebox options).

Hand cases use log-probabilities that are exact in binary (multiples of 1/8), so path scores are
exact and ties are real ties, decided by the rank-path rule.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dflash_ref.backend import get_backend
from dflash_ref.spec_decode.ddtree import (
    DDTreeOptions,
    ancestor_matrix,
    build_ddtree,
    build_ddtree_from_topk,
    chain_tree,
    follow_verified_tree,
    topk_log_probs,
    verify_tree,
)
from dflash_ref.spec_decode.verify import verify_chain_greedy
from tests.spec_decode.targets import greedy_next, greedy_rollout, logits_for

NP = get_backend("numpy")
ROOT = 99
# Depth d (row d-1): candidates best first.
IDS = np.array([[10, 11], [20, 21], [30, 31]])
LP = np.array([[-0.5, -1.5], [-0.25, -2.0], [-0.125, -0.75]], np.float32)


# -- building: hand cases ----------------------------------------------------------------------


def test_authors_build_hand_case_with_a_tie():
    # Heap trace (score, rank path):
    #   pop (-0.5, (0,))     -> node 1 = 10 under 0; push sibling (-1.5, (1,)), child (-0.75, (0,0))
    #   pop (-0.75, (0,0))   -> node 2 = 20 under 1; push (-2.5, (0,1)), child (-0.875, (0,0,0))
    #   pop (-0.875,(0,0,0)) -> node 3 = 30 under 2; push sibling -0.875+0.125-0.75 = -1.5 (0,0,1)
    #   tie at -1.5 between (0,0,1) and (1,): the smaller rank path (0,0,1) wins
    #   pop (-1.5, (0,0,1))  -> node 4 = 31 under 2          [budget 4 reached]
    t = build_ddtree_from_topk(ROOT, IDS, LP, budget=4)
    assert t.tokens.tolist() == [ROOT, 10, 20, 30, 31]
    assert t.parents.tolist() == [-1, 0, 1, 2, 2]
    assert t.depths.tolist() == [0, 1, 2, 3, 3]
    assert t.log_weights.tolist() == [0.0, -0.5, -0.75, -0.875, -1.5]
    assert t.ranks.tolist() == [0, 0, 0, 0, 1]
    assert t.child_maps == ({10: 1}, {20: 2}, {30: 3, 31: 4}, {}, {})
    # budget 5: the other -1.5 entry, token 11 at depth 1, comes next.
    t5 = build_ddtree_from_topk(ROOT, IDS, LP, budget=5)
    assert t5.tokens.tolist() == [ROOT, 10, 20, 30, 31, 11]
    assert t5.parents.tolist() == [-1, 0, 1, 2, 2, 0]


def test_chain_seed_differs_from_the_authors_builder():
    # lp depth 1: [-1, -1.25], depth 2: [-2, -2.5]; budget 2.
    # Authors: node 1 = 10 (-1); heap {sibling 11: -1.25, child 20: -3} -> node 2 = 11.
    # Chain seeded: the top-1 chain 10, 20 occupies indices 1, 2 and the budget is spent.
    ids = np.array([[10, 11], [20, 21]])
    lp = np.array([[-1.0, -1.25], [-2.0, -2.5]], np.float32)
    authors = build_ddtree_from_topk(ROOT, ids, lp, budget=2)
    assert authors.tokens.tolist() == [ROOT, 10, 11] and authors.parents.tolist() == [-1, 0, 0]
    seeded = build_ddtree_from_topk(ROOT, ids, lp, budget=2, chain_seed=True)
    assert seeded.tokens.tolist() == [ROOT, 10, 20] and seeded.parents.tolist() == [-1, 0, 1]
    assert seeded.log_weights.tolist() == [0.0, -1.0, -3.0]


def test_chain_seed_hand_case_queues_rank1_siblings():
    # Chain 10, 20, 30 at indices 1..3 (scores -0.5, -0.75, -0.875); queued siblings:
    # depth 1: -0.5 + 0.5 - 1.5 = -1.5 (1,); depth 2: -0.75 + 0.25 - 2 = -2.5 (0,1);
    # depth 3: -0.875 + 0.125 - 0.75 = -1.5 (0,0,1). Tie at -1.5: (0,0,1) first -> 31, then 11.
    t = build_ddtree_from_topk(ROOT, IDS, LP, budget=5, chain_seed=True)
    assert t.tokens.tolist() == [ROOT, 10, 20, 30, 31, 11]
    assert t.parents.tolist() == [-1, 0, 1, 2, 2, 0]


def test_degenerate_budgets_give_a_root_only_tree():
    for t in (build_ddtree_from_topk(ROOT, IDS, LP, budget=0),
              build_ddtree(NP, ROOT, np.zeros((0, 5), np.float32)),
              build_ddtree(NP, ROOT, np.zeros((3, 5), np.float32), DDTreeOptions(budget=0))):
        assert t.tokens.tolist() == [ROOT] and t.parents.tolist() == [-1]
        assert t.visibility().tolist() == [[True]]


def test_options_resolve_budget_and_k():
    # Authors: budget None -> L, K = min(budget, V). lucebox: budget 22, K = 8 if budget > L else 1.
    assert DDTreeOptions().resolve(L=15, V=151936) == (15, 15)
    assert DDTreeOptions(budget=40).resolve(L=15, V=6) == (40, 6)
    assert DDTreeOptions.lucebox().resolve(L=15, V=151936) == (22, 8)
    assert DDTreeOptions.lucebox(budget=10).resolve(L=15, V=151936) == (10, 1)
    assert DDTreeOptions(top_k=3).resolve(L=15, V=100) == (15, 3)


def test_topk_log_probs_hand_values_and_ties():
    # logits [0, ln 3, ln 3, 0] -> p = [1/8, 3/8, 3/8, 1/8]; equal lp go to the lower id.
    logits = np.log(np.array([[1.0, 3.0, 3.0, 1.0]], np.float32))
    ids, lp = topk_log_probs(NP, logits, 3)
    assert ids.tolist() == [[1, 2, 0]]
    np.testing.assert_allclose(lp, np.log([[3 / 8, 3 / 8, 1 / 8]]), rtol=1e-6)
    assert lp.dtype == np.float32
    # temperature 0.5 squares the odds: p ∝ [1, 9, 9, 1] -> top-1 lp = ln(9/20).
    _, lp_t = topk_log_probs(NP, logits, 1, temperature=0.5)
    np.testing.assert_allclose(lp_t, [[np.log(9 / 20)]], rtol=1e-6)
    with pytest.raises(ValueError, match="finite"):
        topk_log_probs(NP, np.array([[0.0, -np.inf, -np.inf]], np.float32), 2)


def test_build_ddtree_top1_is_the_chain_of_argmaxes(rng):
    logits = rng.standard_normal((6, 40)).astype(np.float32)
    t = build_ddtree(NP, ROOT, logits, DDTreeOptions(top_k=1))
    assert t.tokens.tolist() == [ROOT, *np.argmax(logits, -1).tolist()]
    assert t.parents.tolist() == [-1, 0, 1, 2, 3, 4, 5]


# -- visibility --------------------------------------------------------------------------------


def test_ancestor_matrix_hand_case():
    # parents [-1, 0, 1, 2, 2]: node 4's ancestors are 2, 1, 0; node 3 does not see node 4.
    vis = ancestor_matrix([-1, 0, 1, 2, 2])
    expected = np.array([
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 1, 1, 1, 0],
        [1, 1, 1, 0, 1],
    ], bool)
    assert (vis == expected).all()
    with pytest.raises(ValueError, match="precede"):
        ancestor_matrix([-1, 2, 0])


def test_positions_are_start_plus_depth():
    t = build_ddtree_from_topk(ROOT, IDS, LP, budget=5)
    assert t.positions(100).tolist() == [100, 101, 102, 103, 103, 101]
    assert t.path_to(4) == [0, 1, 2, 4]


# -- verify ------------------------------------------------------------------------------------


def test_follow_hand_case():
    # Tree [root, 10, 20, 30, 31]; the target says root -> 10, node 1 -> 20, node 2 -> 31,
    # node 4 -> 77. Path 0, 1, 2, 4; accepted 10, 20, 31; bonus 77 (no child 77 under node 4).
    t = build_ddtree_from_topk(ROOT, IDS, LP, budget=4)
    r = verify_tree(NP, t, logits_for([10, 20, 31, 5, 77], V=100))
    assert r.path == (0, 1, 2, 4)
    assert r.accepted == (10, 20, 31) and r.bonus == 77
    assert r.committed == (10, 20, 31, 77)
    assert r.acceptance_length == 4 and r.a == 3
    # Rejected at the root: the target wants 11, which is not in the budget-4 tree.
    r0 = follow_verified_tree(t, [11, 20, 31, 5, 77])
    assert (r0.path, r0.committed) == ((0,), (11,))


def test_verify_tree_rejects_wrong_row_count():
    t = build_ddtree_from_topk(ROOT, IDS, LP, budget=4)
    with pytest.raises(ValueError, match="rows but the block/tree has 5"):
        verify_tree(NP, t, np.array([1, 2, 3]))


# -- properties --------------------------------------------------------------------------------


@st.composite
def topk_tables(draw, exact: bool = False):
    """(ids [L, K], lp [L, K] sorted descending, budget). exact: lp multiples of 1/8."""
    L = draw(st.integers(1, 5))
    K = draw(st.integers(1, 4))
    if exact:
        lp = [sorted((-draw(st.integers(0, 24)) / 8 for _ in range(K)), reverse=True)
              for _ in range(L)]
    else:
        lp = [sorted((draw(st.floats(-6, 0, width=32)) for _ in range(K)), reverse=True)
              for _ in range(L)]
    ids = [draw(st.permutations(range(10)))[:K] for _ in range(L)]
    budget = draw(st.integers(0, 16))
    return np.array(ids), np.array(lp, np.float32), budget


@given(topk_tables(), st.booleans())
def test_tree_invariants(table, chain_seed):
    ids, lp, budget = table
    L, K = ids.shape
    t = build_ddtree_from_topk(ROOT, ids, lp, budget, chain_seed)
    n = t.n_nodes - 1
    assert n == min(budget, sum(K**d for d in range(1, L + 1)))  # stops at budget or exhaustion
    assert t.parents[0] == -1 and t.depths[0] == 0 and t.tokens[0] == ROOT
    for i in range(1, t.n_nodes):
        p = t.parents[i]
        assert 0 <= p < i  # parent precedes child
        assert t.depths[i] == t.depths[p] + 1 <= L
        assert t.child_maps[p][int(t.tokens[i])] == i
        assert t.tokens[i] == ids[t.depths[i] - 1, t.ranks[i]]
        assert t.log_weights[i] == pytest.approx(t.log_weights[p] + lp[t.depths[i] - 1, t.ranks[i]],
                                                 abs=1e-9)
    assert sum(len(m) for m in t.child_maps) == n
    again = build_ddtree_from_topk(ROOT, ids.copy(), lp.copy(), budget, chain_seed)
    for field in ("tokens", "parents", "depths", "ranks", "log_weights"):  # deterministic
        assert getattr(t, field).tolist() == getattr(again, field).tolist()
    vis = t.visibility()
    for i in range(t.n_nodes):
        assert set(np.flatnonzero(vis[i]).tolist()) == set(t.path_to(i))
    if chain_seed:  # the top-1 chain occupies indices 1..min(L, budget)
        c = min(L, budget)
        assert t.tokens[1 : c + 1].tolist() == ids[:c, 0].tolist()
        assert t.parents[1 : c + 1].tolist() == list(range(c))


@given(topk_tables(exact=True))
def test_authors_tree_is_the_best_nodes_in_rank_path_order(table):
    # Scores only decrease along the generating edges (child: + lp <= 0; next sibling: lower lp),
    # and ties are broken by the rank path, which also increases along them. So best-first pops
    # the nodes of the full K-ary tree in sorted (-score, rank path) order: the tree is the first
    # `budget` of them. Brute force over every rank path; lp are multiples of 1/8 so sums are exact.
    ids, lp, budget = table
    L, K = ids.shape
    nodes = []
    for depth in range(1, L + 1):
        for path in itertools.product(range(K), repeat=depth):
            score = sum(float(lp[d, r]) for d, r in enumerate(path))
            nodes.append((-score, path))
    nodes.sort()
    t = build_ddtree_from_topk(ROOT, ids, lp, budget)
    got = [tuple(int(t.ranks[j]) for j in t.path_to(i)[1:]) for i in range(1, t.n_nodes)]
    assert got == [p for _, p in nodes[:budget]]
    assert all(np.diff(t.log_weights[1:]) <= 0)  # pop order is best first


@given(st.lists(st.integers(0, 9), min_size=1, max_size=10), st.lists(st.integers(0, 9),
                                                                      min_size=10, max_size=10))
def test_chain_tree_verify_equals_chain_verify(block, posterior):
    block = np.array(block)
    posterior = np.array(posterior[: block.shape[0]])
    c = verify_chain_greedy(NP, block, posterior)
    r = verify_tree(NP, chain_tree(block), posterior)
    assert r.path == tuple(range(c.a + 1))
    assert (r.a, r.accepted, r.bonus, r.committed) == (c.a, c.accepted, c.bonus, c.committed)


@given(st.lists(st.integers(0, 5), min_size=1, max_size=4), topk_tables(), st.booleans())
def test_tree_verify_commits_the_targets_greedy_continuation(prompt, table, chain_seed):
    # Each tree row sees the prompt, its ancestors and itself; the toy target's greedy token at
    # node i is f(prompt + path tokens). The committed tokens must equal plain greedy decoding
    # from the root, and the walk stops exactly where the target's token is not a child.
    V = 10
    ids, lp, budget = table
    root = greedy_next(prompt, V)
    t = build_ddtree_from_topk(root, ids, lp, budget, chain_seed)
    posterior = [greedy_next([*prompt, *t.tokens[t.path_to(i)].tolist()], V)
                 for i in range(t.n_nodes)]
    r = verify_tree(NP, t, logits_for(posterior, V))
    assert list(r.committed) == greedy_rollout([*prompt, root], len(r.committed), V)
    assert r.bonus not in t.child_maps[r.path[-1]]
    assert [t.parents[j] for j in r.path[1:]] == list(r.path[:-1])


# -- NumPy vs CuPy -----------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("options", [DDTreeOptions(), DDTreeOptions.lucebox(),
                                     DDTreeOptions(budget=30, temperature=0.8)],
                         ids=["authors", "lucebox", "budget30-T0.8"])
def test_build_and_verify_cupy_matches_numpy(rng, options):
    # Continuous random logits: a near-tie between two path scores (which float32 rounding on
    # either backend could flip) has probability ~1e-3 here, and the seed is fixed.
    cp_be = get_backend("cupy")
    L, V = 15, 4096
    logits = (3 * rng.standard_normal((L, V))).astype(np.float32)
    a = build_ddtree(NP, ROOT, logits, options)
    b = build_ddtree(cp_be, ROOT, cp_be.to_backend(logits), options)
    for field in ("tokens", "parents", "depths", "ranks"):
        assert getattr(a, field).tolist() == getattr(b, field).tolist()
    target = (4 * rng.standard_normal((a.n_nodes, V))).astype(np.float32)
    for i in range(a.n_nodes):  # make the target prefer a child where there is one
        if a.child_maps[i]:
            target[i, next(iter(a.child_maps[i]))] += 50.0
    ra = verify_tree(NP, a, target)
    rb = verify_tree(cp_be, b, cp_be.to_backend(target))
    assert (ra.path, ra.committed) == (rb.path, rb.committed)
