"""Speculative decoding pieces the loop calls: verifiers, gates, statistics.

- :mod:`~dflash_ref.spec_decode.verify`: chain verify, greedy and sampled (docs/spec_decode.md).
- :mod:`~dflash_ref.spec_decode.ddtree`: DDTree build, ancestor visibility, tree verify
  (liranringel/ddtree ``ddtree.py``, with the lucebox port's choices as options).
- :mod:`~dflash_ref.spec_decode.gate`: the entropy gate and the commit-EMA gate behind one
  protocol; :mod:`~dflash_ref.spec_decode.cost`: the cost model and a modelled gated run.
- :mod:`~dflash_ref.spec_decode.stats`: tau, acceptance rate, per-position acceptance.

All of them are pure functions or small objects on arrays; none runs a model.
"""

from dflash_ref.spec_decode.cost import CostModel, simulate_gated_decode
from dflash_ref.spec_decode.ddtree import (
    DDTree,
    DDTreeOptions,
    TreeVerifyResult,
    ancestor_matrix,
    build_ddtree,
    build_ddtree_from_topk,
    chain_tree,
    follow_verified_tree,
    topk_log_probs,
    verify_tree,
)
from dflash_ref.spec_decode.gate import (
    COMMIT_EMA_VERSIONS,
    CommitEmaGate,
    EntropyGate,
    GateDecision,
    GateObservation,
    StepObservation,
    p1_from_logits,
)
from dflash_ref.spec_decode.stats import (
    AcceptanceStats,
    acceptance_rate,
    tau_per_response,
    tau_pooled,
)
from dflash_ref.spec_decode.verify import (
    ChainVerifyResult,
    accept_length,
    sample_tokens,
    verify_chain_greedy,
    verify_chain_rejection,
    verify_chain_sampled,
)

__all__ = [
    "COMMIT_EMA_VERSIONS",
    "AcceptanceStats",
    "ChainVerifyResult",
    "CommitEmaGate",
    "CostModel",
    "DDTree",
    "DDTreeOptions",
    "EntropyGate",
    "GateDecision",
    "GateObservation",
    "StepObservation",
    "TreeVerifyResult",
    "accept_length",
    "acceptance_rate",
    "ancestor_matrix",
    "build_ddtree",
    "build_ddtree_from_topk",
    "chain_tree",
    "follow_verified_tree",
    "p1_from_logits",
    "sample_tokens",
    "simulate_gated_decode",
    "tau_per_response",
    "tau_pooled",
    "topk_log_probs",
    "verify_chain_greedy",
    "verify_chain_rejection",
    "verify_chain_sampled",
    "verify_tree",
]
