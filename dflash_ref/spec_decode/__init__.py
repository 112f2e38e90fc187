"""Speculative decoding: the loop and the parts it calls.

- :mod:`~dflash_ref.spec_decode.loop`: ``generate`` (prefill, then gate -> draft -> verify ->
  commit); :mod:`~dflash_ref.spec_decode.decoding`: one request's steps, its token cursor and
  its result; :mod:`~dflash_ref.spec_decode.drafting`: the drafting context a verifier drafts
  from and the proposer (the drafter and its cache); :mod:`~dflash_ref.spec_decode.arguments`:
  ``generate``'s arguments checked, the verify mode read; :mod:`~dflash_ref.spec_decode.batch`:
  ``generate_batch``.
- :mod:`~dflash_ref.spec_decode.verifiers`: the verify rules as objects, the interface and the
  chain rules (greedy, and sampled with rejection sampling);
  :mod:`~dflash_ref.spec_decode.extra_verifiers`: DDTree, the sampled tree, the chain with
  greedy drafts and sampled rows;
  :mod:`~dflash_ref.spec_decode.confident_verify`: the greedy chain cut at the first draft the
  drafter doubts (llama.cpp's ``--spec-draft-p-min``);
  :mod:`~dflash_ref.spec_decode.verify`: chain verify, greedy and sampled (docs/spec_decode.md);
  :mod:`~dflash_ref.spec_decode.ddtree`: DDTree build, ancestor visibility, tree verify
  (liranringel/ddtree ``ddtree.py``, with the lucebox port's choices as options).
- :mod:`~dflash_ref.spec_decode.gate`: the entropy gate and the commit-EMA gate behind one
  protocol, and ``ALWAYS_SPECULATE``, the gate of a run given none;
  :mod:`~dflash_ref.spec_decode.cost`: the cost model and a modelled gated run.
- :mod:`~dflash_ref.spec_decode.observe`: the observer protocol (timing, progress, streaming,
  recording).
- :mod:`~dflash_ref.spec_decode.stats`: tau, acceptance rate, per-position acceptance.
- The sampling law the drafter and the verifiers share lives below the models,
  :mod:`dflash_ref.ops.sampling`, and is re-exported here.

Apart from the loop, they are pure functions or small objects on arrays; none runs a model.
"""

from dflash_ref.ops.sampling import (
    DraftProposal,
    SamplingParams,
    as_generator,
    sample_from_probs,
    sample_tokens,
    sampling_probs,
    target_probs,
)
from dflash_ref.spec_decode.arguments import make_verifier
from dflash_ref.spec_decode.confident_verify import ConfidentChainVerifier
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
from dflash_ref.spec_decode.drafting import DraftingContext
from dflash_ref.spec_decode.extra_verifiers import (
    GreedyDraftChainVerifier,
    SampledTreeVerifier,
    TreeVerifier,
    chain_sampled_core,
)
from dflash_ref.spec_decode.gate import COMMIT_EMA_VERSIONS, CommitEmaGate, EntropyGate
from dflash_ref.spec_decode.gating import (
    ALWAYS_SPECULATE,
    GateDecision,
    GateObservation,
    StepObservation,
    p1_from_logits,
)
from dflash_ref.spec_decode.lazy_verify import LazyChainVerifier, LazyRejectionChainVerifier
from dflash_ref.spec_decode.loop import GateOptions, GenerationResult, generate
from dflash_ref.spec_decode.observe import Clock, Observer, Observers, Progress, Stream
from dflash_ref.spec_decode.stats import (
    AcceptanceStats,
    acceptance_rate,
    tau_per_response,
    tau_pooled,
)
from dflash_ref.spec_decode.verifiers import ChainVerifier, RejectionChainVerifier, Verifier
from dflash_ref.spec_decode.verify import (
    ChainVerifyResult,
    accept_length,
    rejection_core,
    verify_chain_greedy,
    verify_chain_sampled,
)

__all__ = [
    "ALWAYS_SPECULATE",
    "COMMIT_EMA_VERSIONS",
    "AcceptanceStats",
    "ChainVerifier",
    "ChainVerifyResult",
    "Clock",
    "CommitEmaGate",
    "ConfidentChainVerifier",
    "CostModel",
    "DDTree",
    "DDTreeOptions",
    "DraftProposal",
    "DraftingContext",
    "EntropyGate",
    "GateDecision",
    "GateObservation",
    "GateOptions",
    "GenerationResult",
    "GreedyDraftChainVerifier",
    "LazyChainVerifier",
    "LazyRejectionChainVerifier",
    "Observer",
    "Observers",
    "Progress",
    "RejectionChainVerifier",
    "SampledTreeVerifier",
    "SamplingParams",
    "StepObservation",
    "Stream",
    "TreeVerifier",
    "TreeVerifyResult",
    "Verifier",
    "accept_length",
    "acceptance_rate",
    "ancestor_matrix",
    "as_generator",
    "build_ddtree",
    "build_ddtree_from_topk",
    "chain_sampled_core",
    "chain_tree",
    "follow_verified_tree",
    "generate",
    "make_verifier",
    "p1_from_logits",
    "rejection_core",
    "sample_from_probs",
    "sample_tokens",
    "sampling_probs",
    "simulate_gated_decode",
    "target_probs",
    "tau_per_response",
    "tau_pooled",
    "topk_log_probs",
    "verify_chain_greedy",
    "verify_chain_sampled",
    "verify_tree",
]
