"""Chunk relevance for the KVFlash pager, and when to re-select (docs/kvflash.md, "Scorers";
Luce-Org/lucebox ``server/src/common/kvflash_scorer.h``).

A *scorer* turns a model's attention into one float per 64-token chunk, higher meaning keep; the
pager consults it through a *score hook* (``hook(chunks) -> scores``) when it evicts and when it
re-selects. Three policies exist upstream (DFLASH_KVFLASH_POLICY):

- **LRU** (:class:`LRUScorer`): no hook. Eviction takes the least recently *allocated* chunk and
  reselect does nothing; memory is recency only (a needle outside the tail window is lost).
- **Tail attention** (:class:`TailAttentionScorer`, the "drafter" policy): the last 8
  queries of a model attend over the whole history; a key's relevance is the max attention
  probability over heads and layers, averaged over the 8 queries, box-smoothed (13 tokens),
  z-normalised over the segment, and averaged per chunk. Upstream feeds it a Qwen3-0.6B drafter
  with pre-RoPE ("NoPE") Q and K; here it takes the tail queries and the keys as arrays, so the
  target itself or any drafter can feed it. :class:`ModelTailScorer` is the pager's scorer: it
  re-runs a model (the target, or a small LM) over the history ids and feeds the result in.
- **Target QK** (:func:`qk_chunk_scores`, lucebox ``kvflash_qk.h``): cosine between the last
  decode query and each chunk's mean-pooled, L2-normalised keys; max over query heads, mean over
  layers.

The cadence: re-select every ``tau_eff = max(tau, history // 45)`` generated tokens
(:func:`reselect_interval`, :func:`reselect_due`, and :func:`reselect_due_in` for speculative
steps that emit several tokens); the divisor 45 keeps rescoring near 15% of decode time.
:func:`hook_from_scores` builds the hook from the last rescore (chunks newer than it score 1e30
and are kept). ``KVFlashPager(..., scorer=, tau=).maybe_reselect`` is the glue ``generate``
calls after every step; :func:`maybe_reselect` is the same step for a caller-made rescore.

The scorer math runs in float64 after the attention probabilities (upstream z-normalises in
double); the attention itself follows the compute-dtype rule (float32, float64 for float64 input).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dflash_ref.ops._dtypes import in_compute_dtype

LOOKAHEAD = 8  # tail queries (kLookahead)
POOL_KERNEL = 13  # box smoothing width (kPoolKernel): [j-6, j+6]
MIN_SEGMENT = 4096  # no bisection at or below this many tokens (kMinSegment)
Z_EPS = 1e-6  # z = (v - mean) / (sigma_pop + 1e-6)
QK_EPS = 1e-6  # chunk keys: K / (|K| + 1e-6)
QK_MISSING = -2.0  # target-QK score of a chunk without valid keys: below any cosine
NEWER_THAN_SCORES = 1e30  # hook value of chunks newer than the last rescore (kept)
DEFAULT_TAU = 64  # DFLASH_KVFLASH_TAU default
CADENCE_DIVISOR = 45  # tau_eff = max(tau, history // 45)
VOCAB_CLAMP = 100000  # drafter vocabulary fold (kVocabClamp)


# ---------------------------------------------------------------------- tail-attention scorer


def tail_attention_max(q_tail, keys) -> np.ndarray:
    """Max over layers and heads of the tail queries' attention probabilities.

    Query t (of n tail queries) sits at position ``S - n + t`` and sees keys ``j <= S - n + t``;
    for each layer and query head h (reading kv head ``h // (Hq / Hkv)``)::

        p[t, j] = softmax_j(q[t] . k[j] / sqrt(D))      over the visible keys, 0 elsewhere
        running_max[t, j] = max over layers and heads of p[t, j]

    Args:
        q_tail: [n_layers, n, Hq, D] tail queries (upstream: pre-RoPE, the last 8 positions).
        keys: [n_layers, S, Hkv, D] keys of every position (same RoPE choice as the queries).
    Returns:
        [n, S] running max in the compute dtype.
    """
    q, k = in_compute_dtype(q_tail, keys)
    dt = q.dtype
    if q.ndim != 4 or k.ndim != 4 or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"tail_attention_max: q_tail {q.shape} must be [n_layers, n, Hq, D] and "
                         f"keys {k.shape} [n_layers, S, Hkv, D] with matching layers and D")
    n_layers, n, Hq, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    if Hq % Hkv or n > S:
        raise ValueError(f"tail_attention_max: Hq={Hq} must be a multiple of Hkv={Hkv} and the "
                         f"{n} tail queries must be among the S={S} positions")
    group = Hq // Hkv
    visible = np.arange(S)[None, :] <= (S - n + np.arange(n))[:, None]  # [n, S]
    running = np.zeros((n, S), dtype=dt)
    for l in range(n_layers):
        kh = np.repeat(k[l], group, axis=1)  # [S, Hkv, D] -> [S, Hq, D]
        logits = np.einsum("thd,shd->hts", q[l], kh) / dt.type(np.sqrt(D))  # [Hq, n, S]
        logits = np.where(visible[None], logits, -np.inf)
        p = np.exp(logits - logits.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)  # [Hq, n, S], 0 on hidden keys
        running = np.maximum(running, p.max(axis=0))  # max over heads, then layers
    return running


def box_smooth(s, kernel: int = POOL_KERNEL) -> np.ndarray:
    """``out[j] = mean(s[max(0, j-h) : min(S, j+h+1)])`` with h = kernel // 2, clipped at edges.

    The divisor is the clipped count (13 inside, 7 at the first and last token for kernel 13).

    Args:
        s: [S] per-token scores.
        kernel: odd window width.
    Returns:
        [S] float64.
    """
    if kernel <= 0 or kernel % 2 == 0:
        raise ValueError(f"box_smooth: kernel must be a positive odd width, got {kernel}")
    s = np.asarray(s, dtype=np.float64).reshape(-1)
    S, h = s.size, kernel // 2
    csum = np.concatenate([[0.0], np.cumsum(s)])  # [S + 1], csum[j] = sum(s[:j])
    j = np.arange(S)
    lo, hi = np.maximum(j - h, 0), np.minimum(j + h + 1, S)  # window [lo, hi)
    return (csum[hi] - csum[lo]) / (hi - lo)


def z_normalise(v) -> np.ndarray:
    """``(v - mean(v)) / (std_pop(v) + 1e-6)`` in float64."""
    v = np.asarray(v, dtype=np.float64)
    return (v - v.mean()) / (v.std() + Z_EPS)


def chunk_means(z, chunk_tokens: int = 64) -> np.ndarray:
    """Mean of ``z`` [S] over each chunk of T tokens (the last may be partial) -> [ceil(S/T)]."""
    if chunk_tokens <= 0:
        raise ValueError(f"chunk_means: chunk_tokens must be > 0, got {chunk_tokens}")
    z = np.asarray(z, dtype=np.float64).reshape(-1)
    if z.size == 0:
        return np.zeros(0)
    starts = np.arange(0, z.size, chunk_tokens)  # [n_chunks]
    counts = np.minimum(starts + chunk_tokens, z.size) - starts
    return np.add.reduceat(z, starts) / counts


def fold_vocab(ids, clamp: int = VOCAB_CLAMP) -> np.ndarray:
    """Fold target ids into a smaller drafter vocabulary: id >= clamp -> 1000 + id % (clamp - 1000).

    With the upstream clamp 100000 this is ``1000 + id mod 99000``, applied only when
    clamp > 1001; it keeps 248K-vocabulary target ids inside Qwen3-0.6B's vocabulary.
    """
    ids = np.asarray(ids, dtype=np.int64)
    if clamp <= 1001:
        return ids.copy()
    return np.where(ids >= clamp, 1000 + ids % (clamp - 1000), ids)


class TailAttentionScorer:
    """The drafter tail-attention policy, fed with arrays.

    ``token_scores(q_tail, keys)`` = z_normalise(box_smooth(mean_t(tail_attention_max))) and
    ``chunk_scores`` averages them per chunk. ``lookahead`` is the number of tail queries (8);
    a segment shorter than lookahead + 1 tokens cannot be scored (None).
    """

    def __init__(self, lookahead: int = LOOKAHEAD, pool_kernel: int = POOL_KERNEL):
        self.lookahead, self.pool_kernel = lookahead, pool_kernel

    def token_scores(self, q_tail, keys) -> np.ndarray | None:
        """[S] smoothed z-scores of every position, or None if S < lookahead + 1.

        Args:
            q_tail: [n_layers, lookahead, Hq, D] queries of the last ``lookahead`` positions.
            keys: [n_layers, S, Hkv, D].
        """
        S = np.shape(keys)[1]
        if S < self.lookahead + 1:
            return None
        if np.shape(q_tail)[1] != self.lookahead:
            raise ValueError(f"TailAttentionScorer: q_tail holds {np.shape(q_tail)[1]} queries, "
                             f"expected lookahead={self.lookahead}")
        s = tail_attention_max(q_tail, keys).astype(np.float64).mean(axis=0)  # [S]
        return z_normalise(box_smooth(s, self.pool_kernel))

    def chunk_scores(self, q_tail, keys, chunk_tokens: int = 64) -> np.ndarray | None:
        """[ceil(S / T)] chunk scores (higher = keep), or None when the segment is too short."""
        z = self.token_scores(q_tail, keys)
        return None if z is None else chunk_means(z, chunk_tokens)


def resilient_token_scores(ids: Sequence[int], token_scorer: Callable, *,
                           lookahead: int = LOOKAHEAD, min_segment: int = MIN_SEGMENT):
    """Score ``ids`` with ``token_scorer``, bisecting when a forward fails.

    ``token_scorer(ids) -> [len(ids)] z-scores or None`` (None = the forward failed, e.g. out of
    memory). On failure with S > min_segment: mid = S // 2; the left half is ``ids[:mid]`` plus the
    true last ``lookahead`` ids appended (so its tail queries are the real ones), the right half
    ``ids[mid:]``; each half is scored (recursively) and z-normalised on its own, and the result is
    ``left[:mid] ++ right`` (the appended tail scores are dropped). Returns None when a segment of
    at most min_segment tokens fails.
    """
    ids = list(ids)
    z = token_scorer(ids)
    if z is not None:
        return np.asarray(z, dtype=np.float64)
    S = len(ids)
    if S <= min_segment:
        return None
    mid = S // 2
    left = resilient_token_scores(ids[:mid] + ids[S - lookahead :], token_scorer,
                                  lookahead=lookahead, min_segment=min_segment)
    right = resilient_token_scores(ids[mid:], token_scorer, lookahead=lookahead,
                                   min_segment=min_segment)
    if left is None or right is None:
        return None
    return np.concatenate([left[:mid], right[: S - mid]])


class ModelTailScorer:
    """Tail-attention chunk relevance from a model run over the history ids.

    The pager's ``scorer``: ``chunk_scores(history_ids, T)`` re-runs ``model`` (a
    :class:`~dflash_ref.models.target.TargetModel`: the target itself, or a small LM that shares
    the tokenizer, as upstream's Qwen3-0.6B "drafter" scorer) over the whole history through
    :meth:`~dflash_ref.models.target.TargetModel.attention_qk`, takes the queries of the last
    ``lookahead`` positions and the keys of every position (pre-RoPE by default), and scores
    them with :class:`TailAttentionScorer`. Because the keys are recomputed from the token ids,
    chunks the pager has paged out are scored like resident ones.

    Cost per rescore: one forward of ``model`` over S history tokens (the public scorer's
    "full re-prefill": 245 ms at 2-2.8K tokens for the 0.6B model, per Luce-Org/lucebox
    ``optimizations/kvflash/RESULTS.md``) plus the [8, S] tail attention; the cadence
    ``max(tau, S // 45)`` amortises it to about 45 scorer-token forwards per generated token at
    long context. With the target itself as
    ``model`` that is ~45x a decode step (exact, for tests and small models); a model ~45x
    smaller than the target keeps it near 15% of decode time, which is upstream's design.

    Args:
        model: the scoring model (``attention_qk(ids, n_tail, rope, layers)``).
        rope: score post-RoPE q and k instead of upstream's NoPE default.
        layers: the model's attention layers to score (default: its full-attention layers).
        lookahead, pool_kernel: tail queries (8) and smoothing width (13).
        vocab_clamp: fold ids >= clamp into the scorer's vocabulary (:func:`fold_vocab`;
            upstream 100000 for a Qwen3-0.6B scorer of a 248K-vocabulary target); None = no fold.
        min_segment: bisection threshold when a forward runs out of memory
            (:func:`resilient_token_scores`).
    """

    def __init__(self, model, *, rope: bool = False, layers=None, lookahead: int = LOOKAHEAD,
                 pool_kernel: int = POOL_KERNEL, vocab_clamp: int | None = None,
                 min_segment: int = MIN_SEGMENT):
        self.model, self.rope, self.layers = model, rope, layers
        self.vocab_clamp, self.min_segment = vocab_clamp, min_segment
        self.tail = TailAttentionScorer(lookahead, pool_kernel)
        self.calls = 0  # forwards of the scoring model (bisection halves count separately)

    def token_scores(self, ids) -> np.ndarray | None:
        """[S] smoothed z-scores of one segment, or None (too short, or out of memory)."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if ids.size < self.tail.lookahead + 1:
            return None
        self.calls += 1
        try:
            q_tail, keys = self.model.attention_qk(ids, n_tail=self.tail.lookahead,
                                                   rope=self.rope, layers=self.layers)
        except MemoryError:  # cupy's OutOfMemoryError is a MemoryError
            return None
        return self.tail.token_scores(q_tail, keys)

    def chunk_scores(self, history_ids, chunk_tokens: int = 64) -> np.ndarray | None:
        """[ceil(S / T)] chunk scores of the history (higher = keep), or None to skip."""
        ids = np.asarray(history_ids, dtype=np.int64).reshape(-1)
        if self.vocab_clamp is not None:
            ids = fold_vocab(ids, self.vocab_clamp)
        vocab = self.model.config.vocab_size
        if ids.size and ids.max() >= vocab:
            raise ValueError(f"ModelTailScorer: history id {int(ids.max())} is outside the "
                             f"scoring model's vocabulary of {vocab}; set vocab_clamp to fold "
                             f"large ids (upstream: 100000)")
        z = resilient_token_scores(ids.tolist(), self.token_scores,
                                   lookahead=self.tail.lookahead, min_segment=self.min_segment)
        return None if z is None else chunk_means(z, chunk_tokens)


# ---------------------------------------------------------------------- target-QK scorer


def qk_chunk_keys(k_chunk) -> np.ndarray | None:
    """A sealed chunk's key summary: mean over its tokens, L2-normalised.

    Args:
        k_chunk: [n_layers, T, Hkv, D] the chunk's K rows of every full-attention layer.
    Returns:
        [n_layers, Hkv, D] float64 ``mean_T(K) / (|mean_T(K)| + 1e-6)``, or None when a value is
        not finite (the chunk is then "missing" and scores -2).
    """
    k = np.asarray(k_chunk, dtype=np.float64)
    m = k.mean(axis=1)  # [n_layers, T, Hkv, D] -> [n_layers, Hkv, D]
    out = m / (np.linalg.norm(m, axis=-1, keepdims=True) + QK_EPS)
    return out if np.all(np.isfinite(out)) else None


def qk_chunk_scores(q, chunk_keys) -> np.ndarray:
    """Target-QK chunk scores: per layer max over q heads of cos(q[h], K[h // group]); mean over
    layers; a missing chunk (None) scores -2.

    Args:
        q: [n_layers, Hq, D] the last decode step's queries (post-RoPE upstream); each head is
            normalised here as ``q / (|q| + 1e-6)`` (the spec says "normalised"; the eps is the
            reference's choice, matching the keys).
        chunk_keys: a sequence of [n_layers, Hkv, D] summaries (from :func:`qk_chunk_keys`) or
            None, one per chunk.
    Returns:
        [n_chunks] float64 in [-1, 1], or -2 for missing chunks.
    """
    q = np.asarray(q, dtype=np.float64)
    qn = q / (np.linalg.norm(q, axis=-1, keepdims=True) + QK_EPS)  # [n_layers, Hq, D]
    out = np.full(len(chunk_keys), QK_MISSING)
    for c, kc in enumerate(chunk_keys):
        if kc is None:
            continue
        kc = np.asarray(kc, dtype=np.float64)
        group = qn.shape[1] // kc.shape[1]
        kh = np.repeat(kc, group, axis=1)  # [n_layers, Hkv, D] -> [n_layers, Hq, D]
        cos = np.sum(qn * kh, axis=-1)  # [n_layers, Hq]
        out[c] = cos.max(axis=1).mean()
    return out


# ---------------------------------------------------------------------- policies and cadence


class LRUScorer:
    """No relevance signal: the pager runs without a score hook (LRU eviction, no reselect)."""

    def hook(self):
        return None

    def chunk_scores(self, history_ids, chunk_tokens: int = 64) -> None:
        """Never a score: as a pager's ``scorer`` every rescore is skipped (pure LRU)."""
        return None


def hook_from_scores(scores) -> Callable[[np.ndarray], np.ndarray]:
    """The pager hook of the last rescore: ``scores[c]`` if ``c < len(scores)``, else 1e30.

    Chunks newer than the rescore rank as kept until the next one.
    """
    table = np.asarray(scores, dtype=np.float64).reshape(-1)

    def hook(chunks: np.ndarray) -> np.ndarray:
        chunks = np.asarray(chunks, dtype=np.int64)
        out = np.full(chunks.shape, NEWER_THAN_SCORES)
        known = chunks < table.size
        out[known] = table[chunks[known]]
        return out

    return hook


def reselect_interval(tau: int, history_len: int) -> int:
    """``tau_eff = max(tau, history_len // 45)`` generated tokens between reselects.

    Args:
        tau: DFLASH_KVFLASH_TAU (default 64, at least 1).
        history_len: prompt ids + generated ids so far.
    """
    if tau < 1:
        raise ValueError(f"reselect cadence tau must be >= 1, got {tau}")
    return max(int(tau), int(history_len) // CADENCE_DIVISOR)


def reselect_due(generated: int, tau: int, history_len: int) -> bool:
    """True when a reselect fires: ``generated % tau_eff == 0`` for generated >= 1.

    ``generated`` counts the tokens of this decode call, checked after each token.
    """
    return generated >= 1 and generated % reselect_interval(tau, history_len) == 0


def reselect_due_in(generated: int, n_new: int, tau: int, history_len: int) -> bool:
    """True when a decode step that emitted ``n_new`` tokens passed a due count.

    The step took the generated count from ``generated - n_new`` to ``generated`` (history
    ``history_len`` at the end); it is due when some count g in that range has
    ``reselect_due(g, tau, history at g)``. With n_new = 1 (plain decoding) this is the public
    check after each token; a speculative step that emits several tokens fires once if it
    passed a due count.
    """
    return any(reselect_due(g, tau, history_len - (generated - g))
               for g in range(max(1, generated - n_new + 1), generated + 1))


def maybe_reselect(pager, generated: int, history_len: int, rescore: Callable,
                   tau: int = DEFAULT_TAU) -> int:
    """The decode loop's reselect step: when due, rescore, install the hook, reselect.

    ``rescore() -> chunk scores or None``; None (the scorer failed or is unavailable) skips this
    round and leaves the pager's current hook (LRU when none was ever installed). Returns the
    number of page events.
    """
    if not reselect_due(generated, tau, history_len):
        return 0
    scores = rescore()
    if scores is None:
        return 0
    pager.score_hook = hook_from_scores(scores)
    return pager.reselect()

