"""``generate``'s arguments checked, with the fix in each error, before anything runs; the
``verify`` argument read as a :class:`~dflash_ref.spec_decode.verifiers.Verifier`."""

from __future__ import annotations

import warnings

import numpy as np

from dflash_ref.errors import ConfigError, PositionWarning
from dflash_ref.ops.sampling import SamplingParams
from dflash_ref.spec_decode.extra_verifiers import SampledTreeVerifier, TreeVerifier
from dflash_ref.spec_decode.lazy_verify import LazyChainVerifier, LazyRejectionChainVerifier
from dflash_ref.spec_decode.verifiers import ChainVerifier, RejectionChainVerifier, Verifier

VERIFY_MODES = ("chain", "tree")
CHAIN_RULES = {  # (greedy, lazy) -> "chain": lazy, the head runs on rows 0..a only
    (True, True): LazyChainVerifier, (False, True): LazyRejectionChainVerifier,
    (True, False): ChainVerifier, (False, False): RejectionChainVerifier}
LAZY_MIN_VOCAB = 32768
"""The smallest vocabulary for which "chain" is lazy on NumPy: below it a row of the head costs
little beside the layers, and one forward of the block beats a forward per group."""


def check_arguments(target, drafter, prompt_ids, max_new_tokens: int, sampling: SamplingParams,
                    block_size: int | None, verify) -> tuple[np.ndarray, int, Verifier]:
    """Refuse what the arguments cannot mean, with the fix, before anything runs; return the
    prompt as [N] int64, the block size and the verifier built from ``verify`` (plain
    decoding, without a drafter: block size 1 and no verifier).

    Refused (:class:`~dflash_ref.errors.ConfigError`): a prompt that is not one non-empty
    sequence of integer ids in [0, vocab) (a 2-D batch goes to ``generate_batch``), a
    ``max_new_tokens`` or ``block_size`` that is not an integer >= 1, T > 0 without a seed, a
    drafter bound to another target. Warned (:class:`~dflash_ref.errors.PositionWarning`): a run
    that would reach past the target's ``max_position_embeddings``. Arguments in the wrong role
    are a ``TypeError`` (:func:`check_roles`).
    """
    check_roles(target, drafter, sampling)
    prompt = np.asarray(prompt_ids)
    if prompt.ndim != 1:
        raise ConfigError(f"prompt_ids must be one sequence of token ids, shape [N]; got shape "
                          f"{list(prompt.shape)}; pass one prompt's ids (text: load_tokenizer(path)"
                          f".encode(text); several prompts: generate_batch(target, drafter, "
                          f"prompts, ...))")
    if prompt.size == 0:
        raise ConfigError("prompt_ids is empty; generation needs at least one prompt token")
    if prompt.dtype.kind not in "iu":
        raise ConfigError(f"prompt_ids must be integer token ids, got dtype {prompt.dtype} "
                          f"(e.g. {prompt.reshape(-1)[0].item()!r}); pass ints, e.g. "
                          f"load_tokenizer(path).encode(text)")
    vocab = target.config.vocab_size
    if prompt.min() < 0 or prompt.max() >= vocab:
        raise ConfigError(f"prompt_ids must lie in [0, {vocab}) (the target's vocab_size); got "
                          f"ids from {prompt.min()} to {prompt.max()}; encode the text with "
                          f"this target's tokenizer")
    if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool) \
            or max_new_tokens < 1:
        raise ConfigError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}; "
                          f"pass e.g. max_new_tokens=32")
    if block_size is not None and (not isinstance(block_size, (int, np.integer))
                                   or isinstance(block_size, bool) or block_size < 1):
        raise ConfigError(f"block_size must be an integer >= 1 (1: plain decoding), got "
                          f"{block_size!r}; pass e.g. block_size=drafter.block_size, or None for "
                          f"the drafter's")
    if not sampling.greedy and sampling.seed is None:
        raise ConfigError("temperature > 0 needs a seed (SamplingParams(..., seed=int or "
                          "np.random.Generator)) so that the sampled output is reproducible")
    limit = target.config.max_position_embeddings
    if limit is not None and prompt.size + max_new_tokens > limit:
        warnings.warn(f"the prompt ({prompt.size} tokens) and max_new_tokens={max_new_tokens} "
                      f"reach position {prompt.size + max_new_tokens - 1}, past the target's "
                      f"max_position_embeddings={limit}: positions it was never trained on; "
                      f"shorten the prompt or lower max_new_tokens", PositionWarning,
                      stacklevel=3)
    prompt = prompt.astype(np.int64)
    if drafter is None:  # plain decoding runs no verifier; a mode that does not exist is refused
        if not isinstance(verify, Verifier) and verify not in VERIFY_MODES:
            raise unknown_verify_mode(verify)
        return prompt, 1, None
    verifier = make_verifier(verify, sampling, target.be.name, target.config.vocab_size)
    trained_block_size = int(drafter.block_size)
    block_size = trained_block_size if block_size is None else int(block_size)
    verifier.check(sampling, block_size, trained_block_size)
    if drafter.target is not target:
        raise ConfigError("the drafter is bound to another TargetModel; load it with "
                          "DFlashDrafter.from_pretrained(path, target)")
    return prompt, block_size, verifier


def check_roles(target, drafter, sampling) -> None:
    """A ``TypeError`` naming the fix when an argument is not what its place takes: the target
    a loaded target (``new_state``), the drafter a drafter (``propose``) or None, ``sampling``
    a :class:`~dflash_ref.ops.sampling.SamplingParams` (a dict of its fields is refused too)."""
    call = "generate(target, drafter, prompt_ids, max_new_tokens, ...)"
    if hasattr(target, "propose"):
        raise TypeError(f"{call}: the first argument is a drafter ({type(target).__name__}); "
                        f"pass the TargetModel first and the drafter second")
    if not hasattr(target, "new_state"):
        raise TypeError(f"{call}: target must be a loaded TargetModel, got "
                        f"{type(target).__name__}; load it with TargetModel.from_pretrained(path)"
                        f" or TargetModel.from_gguf(path)")
    if drafter is not None and not hasattr(drafter, "propose"):
        raise TypeError(f"{call}: drafter must be a DFlashDrafter loaded for this target, or None"
                        f" for plain decoding; got {type(drafter).__name__}; load it with "
                        f"DFlashDrafter.from_pretrained(path, target)")
    if not isinstance(sampling, SamplingParams):
        fix = (f"SamplingParams(**{sampling!r})" if isinstance(sampling, dict)
               else "SamplingParams(temperature=0.8, top_p=0.95, seed=0)")
        raise TypeError(f"sampling must be a SamplingParams (dflash_ref.spec_decode), got "
                        f"{type(sampling).__name__}; pass sampling={fix}")


def make_verifier(verify, sampling: SamplingParams, backend: str | None = None,
                  vocab_size: int | None = None) -> Verifier:
    """``generate``'s ``verify`` as a :class:`Verifier`: "chain", "tree" or a verifier itself.

    The one place a verify-mode string is read: "chain" is
    :class:`~dflash_ref.spec_decode.verifiers.ChainVerifier` when ``sampling`` is greedy, else
    :class:`~dflash_ref.spec_decode.verifiers.RejectionChainVerifier`; for a target on the
    ``backend`` "numpy" (``generate`` names it) with a ``vocab_size`` of at least
    :data:`LAZY_MIN_VOCAB` (or none named) their lazy forms (spec_decode/lazy_verify.py: the
    target's head only on the rows the accepted prefix reaches; on CuPy every row, as a recorded
    step computes them); "tree" is
    :class:`~dflash_ref.spec_decode.extra_verifiers.TreeVerifier` when greedy, else
    :class:`~dflash_ref.spec_decode.extra_verifiers.SampledTreeVerifier`.
    """
    if isinstance(verify, Verifier):
        return verify
    if verify == "chain":
        lazy = backend == "numpy" and (vocab_size is None or vocab_size >= LAZY_MIN_VOCAB)
        return CHAIN_RULES[sampling.greedy, lazy]()
    if verify == "tree":
        return TreeVerifier() if sampling.greedy else SampledTreeVerifier()
    raise unknown_verify_mode(verify)


def unknown_verify_mode(verify) -> ConfigError:
    """The error for a ``verify`` that is neither a mode name nor a :class:`Verifier`."""
    return ConfigError(f"verify={verify!r} is unknown; expected one of {VERIFY_MODES} or a "
                       f"Verifier (dflash_ref.spec_decode.verifiers)")
