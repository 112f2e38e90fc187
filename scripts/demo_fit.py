"""The demo checkpoints shipped in ``dflash_ref/data/demo``: a tiny target and a drafter fitted
to it in closed form, which the target accepts (used by make_demo_checkpoints.py; docs/demo.md).

A drafter with random weights is never accepted (tau = 1), so a demo built on one shows no
speculation at all. Training a real DFlash drafter needs a gradient framework and hours; the
construction below needs NumPy and seconds. :func:`write_demo_checkpoints` is the entry point:
:func:`write_demo_target` (the tiny qwen3 of ``dflash_ref.tiny`` with damped attention), then
:func:`fit_tiny_drafter` (explained step by step in its docstring and in docs/demo.md).

Not part of the library: ``dflash-ref demo`` only reads the shipped files. Import it from this
directory (``python scripts/make_demo_checkpoints.py`` puts it on ``sys.path``) or by path.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dflash_ref.config import DrafterConfig, TargetConfig
from dflash_ref.io.quant import bf16_bits_to_float32, float32_to_bf16_bits
from dflash_ref.io.safetensors_io import write_safetensors
from dflash_ref.models.drafter import DFlashDrafter, drafter_expected_tensors
from dflash_ref.models.target import TargetModel, expected_tensors
from dflash_ref.ops.activations import swiglu
from dflash_ref.ops.norm import rms_norm
from dflash_ref.spec_decode.loop import generate
from dflash_ref.tiny import tiny_drafter_config, tiny_target_config, tiny_weights

DEMO_TARGET_SEED = 6
DEMO_ATTENTION_SCALE = 0.35  # every o_proj of the demo target is multiplied by this
DEMO_DTYPE = "bfloat16"  # storage of both demo checkpoints (like the published ones)
DEMO_FIT_SEED = 0  # rollout prompts and the drafter's random MLP features

# Drafter layer 1 routing (fit_tiny_drafter step 3). NEOX RoPE turns channel pair (i, i + d/2)
# by theta^(-2i/d) rad per position: pair 0 by 1 rad, pair d/2 - 1 by ~6e-6 rad (theta = 1e6,
# d = 16), a channel that carries a position-free bias. Scores are sqrt(d) gain^2 (q_hat . k_hat).
_ROUTE_AMPLITUDE = 0.07  # sin^2(beta): the share of each score that depends on the offset
_ROUTE_GAIN = 3.0  # q_norm / k_norm weight: scores 36 (q_hat . k_hat) at d = 16
_ROUTE_PHASES = (0.0, 0.5 * np.pi, np.pi, 1.5 * np.pi)  # RoPE phase of each query head
_FLAG = 2.0  # the value of the two coordinates drafter layer 0 writes


def _round_to_storage(x, dtype: str | None) -> np.ndarray:
    """float32 ``x`` rounded exactly as ``write_safetensors(dtype=...)`` then loading stores it."""
    x = np.asarray(x, dtype=np.float32)
    if dtype in ("bfloat16", "bf16"):
        return bf16_bits_to_float32(float32_to_bf16_bits(x))
    if dtype in ("float16", "f16"):
        return x.astype(np.float16).astype(np.float32)
    return x


def write_demo_target(path, seed: int = DEMO_TARGET_SEED,
                      attention_scale: float = DEMO_ATTENTION_SCALE,
                      dtype: str | None = DEMO_DTYPE) -> Path:
    """The demo target: the tiny untied qwen3 of :func:`write_tiny_target` with every
    ``self_attn.o_proj.weight`` multiplied by ``attention_scale``.

    Damping attention makes the next token depend mostly on the current token, as it often does
    in real text, so a drafter that sees the anchor token can predict several tokens ahead; with
    seed 6 and 0.35 the greedy text still wanders over dozens of distinct tokens instead of
    locking into a short loop (docs/demo.md has the numbers).
    """
    config = tiny_target_config("qwen3")
    tensors = tiny_weights(expected_tensors(TargetConfig.from_hf(config)), seed, 0.0)
    for name in tensors:
        if name.endswith("self_attn.o_proj.weight"):
            tensors[name] = tensors[name] * np.float32(attention_scale)
    if dtype is not None:
        config["torch_dtype"] = dtype
    return write_safetensors(path, tensors, config=config, dtype=dtype, overwrite=True)


def random_prompts(n: int, vocab_size: int, seed: int,
                   avoid_token: int | None = None) -> list[np.ndarray]:
    """``n`` prompts of 2..11 token ids drawn uniformly from the vocabulary without
    ``avoid_token`` (e.g. the drafter's mask token), from ``np.random.default_rng(seed)``."""
    allowed = np.array([t for t in range(vocab_size) if t != avoid_token], dtype=np.int64)
    rng = np.random.default_rng(seed)
    return [rng.choice(allowed, size=int(rng.integers(2, 12))) for _ in range(n)]


def greedy_rollouts(target, n_prompts: int, length: int, seed: int,
                    avoid_token: int | None = None) -> list[tuple[int, np.ndarray]]:
    """Plain greedy continuations of :func:`random_prompts`: ``[(N, ids)]`` where ids [N +
    length] is the N-token prompt followed by ``length`` generated tokens."""
    out = []
    for prompt in random_prompts(n_prompts, target.config.vocab_size, seed, avoid_token):
        tokens = generate(target, None, prompt, length).tokens
        out.append((prompt.size, np.concatenate([prompt, np.asarray(tokens, dtype=np.int64)])))
    return out


def block_successor_counts(rollouts, vocab_size: int, block_size: int) -> np.ndarray:
    """``counts[a, j, k]`` [V, B, V]: how often a generated token a (a possible anchor t_s) is
    followed j positions later by k (t_{s+j} = k), j = 1..B-1; row j = 0 stays zero."""
    counts = np.zeros((vocab_size, block_size, vocab_size), dtype=np.int64)
    for n, ids in rollouts:
        for j in range(1, block_size):
            a, k = ids[n:len(ids) - j], ids[n + j:]  # anchors at positions >= N only
            np.add.at(counts, (a, j, k), 1)
    return counts


def fit_tiny_drafter(path, target_dir, block_size: int = 8, intermediate_size: int = 512,
                     n_prompts: int = 120, rollout_length: int = 64, seed: int = DEMO_FIT_SEED,
                     dtype: str | None = DEMO_DTYPE, ridge: float = 1e-8,
                     row_decay: float = 0.5, rollouts=None) -> Path:
    """Write a 2-layer z-lab drafter for the target in ``target_dir`` that the target accepts.

    No gradient descent: layer 1's MLP is fitted by ridge regression onto a lookup table, layer
    0's MLP by a min-norm least-squares solve, and the attention is set by hand. Shapes: V vocab,
    H hidden, B block, F = ``intermediate_size``, d head_dim, nh / nkv query / kv heads.

    The result is an *anchor-only* block drafter: block row j drafts t_{s+j} from the anchor
    token t_s alone. ``fc`` is 0, so the context rows have zero keys and values and the attention
    of step 3 gives them a weight < e^-33 each: the drafts are a table ``draft[a, j]``, and the
    fit makes it the target's most frequent continuation.

    1. **Data** (:func:`greedy_rollouts`, :func:`block_successor_counts`): greedy rollouts of the
       target (``n_prompts`` random prompts, ``rollout_length`` tokens each; or ``rollouts``
       given) -> ``counts[a, j, k]`` [V, B, V]. The wanted draft is ``mode[a, j] = argmax_k``
       and the sample weight ``weight[a, j] = sum_k counts * row_decay^(j-1)``: row j only
       matters when rows 1..j-1 were accepted.
    2. **Layer 0 writes flags** (:func:`_fit_flag_layer`): attention off (projections 0); the
       MLP makes the residual of token t equal to its embedding with coordinate H-1 set to +2
       (-2 for the mask token: a "flag") and H-2 set to +2 (a common bias), and zeroes the rest
       of the mask token's embedding. ``down_proj`` is the min-norm solution over all V tokens
       of ``phi0 @ down^T = want - E`` with random features ``phi0`` [V, F].
    3. **Layer 1 attention routes the anchor to every mask row** (:func:`_routing_attention`,
       by hand): the anchor key is ``cos(b) e_bias + sin(b) e_0``, every mask key
       ``cos(b) e_bias - sin(b) e_0``, read from the two flags; the mask rows' query of head h
       is ``cos(b) e_bias + sin(b) R(phase_h) e_0``. After RoPE, row j scores the anchor
       ``36 (cos^2 b + sin^2 b cos(j + phase_h))`` and mask row j'
       ``36 (cos^2 b - sin^2 b cos(j - j' + phase_h))``, i.e. 33.5 +- 2.5, and each context row
       0. The mask rows' values are 0 (their residual is flags only; ``v_proj`` ignores flags),
       so head h of row j outputs ``alpha[j, h] v_anchor`` with a weight that depends on j and
       h only: four heads give each row its own mix of the anchor's value.
    4. **Layer 1 MLP is the lookup table** (:func:`_fit_lookup_mlp`): the drafter itself
       computes, for every anchor a and row j = 1..B-1, the MLP input ``r[a, j]`` [H] and the
       features ``X = swiglu(rms_norm(r) Wg^T, rms_norm(r) Wu^T)`` [V(B-1), F]. The output
       wanted is ``y = T p[mode] - r`` [V(B-1), H] where ``p[:, k]`` is column k of
       ``pinv(W_lm diag(g))`` [H, V] (the hidden state whose logits after the final norm g are
       closest to the one-hot e_k) scaled to rms 1, and T = 4 rms(r). Then::

           down_proj^T = (X^T diag(weight) X + ridge tr(.)/F I)^-1 X^T diag(weight) y    [F, H]

    The drafter's ``norm`` is the target's final norm; the random ``gate_proj`` / ``up_proj``
    / ``v_proj`` / ``o_proj`` come from ``np.random.default_rng(seed)``. Every weight is rounded
    to ``dtype`` before the features are computed, so the fit sees what the file holds.
    """
    target_config = json.loads((Path(target_dir) / "config.json").read_text())
    config = tiny_drafter_config(target_config, block_size=block_size,
                                 intermediate_size=intermediate_size,
                                 torch_dtype=dtype or "float32")
    cfg = DrafterConfig.from_hf(config)
    target = TargetModel.from_pretrained(target_dir)
    H, V, F = cfg.hidden_size, cfg.vocab_size, intermediate_size
    rng = np.random.default_rng(seed)

    # 1. data: what follows each anchor, j tokens later
    if rollouts is None:
        rollouts = greedy_rollouts(target, n_prompts, rollout_length, seed,
                                   avoid_token=cfg.mask_token_id)
    counts = block_successor_counts(rollouts, V, block_size)  # [V, B, V]
    mode = counts.argmax(axis=-1)  # [V, B]
    weight = counts.sum(axis=-1) * row_decay ** np.arange(-1.0, block_size - 1)  # [V, B]

    # all weights 0 and norms 1, then the random parts
    w = {name: np.zeros(shape) for name, shape in drafter_expected_tensors(cfg).items()}
    for name in w:
        if name.endswith("norm.weight"):
            w[name][:] = 1.0
    for name in ("gate_proj", "up_proj"):
        for i in range(2):
            w[f"layers.{i}.mlp.{name}.weight"] = rng.normal(0.0, H ** -0.5, (F, H))
    n_q, n_kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    w["layers.1.self_attn.v_proj.weight"] = rng.normal(0.0, H ** -0.5, (n_kv, H))
    w["layers.1.self_attn.o_proj.weight"] = rng.normal(0.0, n_q ** -0.5, (H, n_q))
    w["norm.weight"] = target.be.to_numpy(target.final_norm) + target.config.norm_offset
    w = {name: _round_to_storage(x, dtype) for name, x in w.items()}

    # 2. + 3. layer 0 flags, layer 1 routing
    E = target.be.to_numpy(target.embed_tokens) * cfg.noise_embedding_scale(target.config)
    w["layers.0.mlp.down_proj.weight"], after0 = _fit_flag_layer(w, E, cfg)
    w.update(_routing_attention(w, after0[cfg.mask_token_id], cfg))
    w = {name: _round_to_storage(x, dtype) for name, x in w.items()}
    write_safetensors(path, w, config=config, dtype=dtype, overwrite=True)

    # 4. layer 1 MLP, fitted on the features of the drafter just written
    drafter = DFlashDrafter.from_pretrained(path, target)
    lm = target.be.to_numpy(target.lm_head_weight).astype(np.float64) * w["norm.weight"]
    down = _fit_lookup_mlp(drafter, w, lm, mode[:, 1:], weight[:, 1:], ridge)
    w["layers.1.mlp.down_proj.weight"] = _round_to_storage(down, dtype)
    return write_safetensors(path, w, config=config, dtype=dtype, overwrite=True)


def _swiglu_features(w: dict, layer: int, u) -> np.ndarray:
    """``silu(u Wg^T) * (u Wu^T)`` [..., F] of drafter layer ``layer`` for MLP inputs u [..., H]."""
    return swiglu(u @ w[f"layers.{layer}.mlp.gate_proj.weight"].T.astype(np.float64),
                  u @ w[f"layers.{layer}.mlp.up_proj.weight"].T.astype(np.float64))


def _fit_flag_layer(w: dict, E, cfg) -> tuple[np.ndarray, np.ndarray]:
    """Step 2 of :func:`fit_tiny_drafter`: layer 0's ``down_proj`` [H, F] and the residual
    ``want`` [V, H] it produces (E [V, H]: the block's embedding rows for every token).

    Layer 0's attention is 0, so its MLP sees ``rms_norm(E)``; it must add ``want - E``."""
    V, H = E.shape
    mask, flag, common = cfg.mask_token_id, H - 1, H - 2
    E = E.astype(np.float64)
    phi = _swiglu_features(w, 0, rms_norm(E, np.ones(H), cfg.rms_norm_eps))  # [V, F]
    want = E.copy()  # [V, H]
    want[:, [flag, common]] = _FLAG
    want[mask] = 0.0
    want[mask, [flag, common]] = (-_FLAG, _FLAG)
    gram = phi @ phi.T  # [V, V]; F > V, so an exact interpolant exists
    gram += 1e-9 * np.trace(gram) / V * np.eye(V)
    down = (phi.T @ np.linalg.solve(gram, want - E)).T  # [H, F], min-norm
    return down, want


def _routing_attention(w: dict, mask_residual, cfg) -> dict:
    """Step 3 of :func:`fit_tiny_drafter`: layer 1's q/k projections and norms, by hand.

    ``mask_residual`` [H] is a mask row's residual after layer 0 (flags only). Keys read only
    the flag coordinates; queries are a rank-1 map sending the mask rows' normed input to the
    designed direction (anchor rows get q = 0; their output is never used). v_proj and o_proj
    (random, already in ``w``) lose their flag columns / rows so values carry the embedding only.
    """
    H, d, nh, nkv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, \
        cfg.num_key_value_heads
    flag, common = H - 1, H - 2
    eye = np.eye(d)
    e_bias, e_0, e_0b = eye[d // 2 - 1], eye[0], eye[d // 2]  # slow pair, fast pair (0, d/2)
    cos_b, sin_b = np.sqrt(1.0 - _ROUTE_AMPLITUDE), np.sqrt(_ROUTE_AMPLITUDE)
    u_mask = rms_norm(mask_residual, np.ones(H), cfg.rms_norm_eps)  # [H]
    wq, wk = np.zeros((nh * d, H)), np.zeros((nkv * d, H))
    for g in range(nkv):  # anchor: flag +2 -> +sin_b e_0; mask: flag -2 -> -sin_b e_0
        wk[g * d:(g + 1) * d, flag] = sin_b * e_0
        wk[g * d:(g + 1) * d, common] = cos_b * e_bias
    for h in range(nh):
        phase = _ROUTE_PHASES[h % len(_ROUTE_PHASES)]
        q = cos_b * e_bias + sin_b * (np.cos(phase) * e_0 + np.sin(phase) * e_0b)  # [d]
        wq[h * d:(h + 1) * d] = np.outer(q, u_mask) / (u_mask @ u_mask)  # u_mask -> q
    L = "layers.1.self_attn."
    wv, wo = w[L + "v_proj.weight"].copy(), w[L + "o_proj.weight"].copy()
    wv[:, [flag, common]] = 0.0
    wo[[flag, common]] = 0.0
    gain = np.full(d, _ROUTE_GAIN)
    return {L + "q_proj.weight": wq, L + "k_proj.weight": wk, L + "v_proj.weight": wv,
            L + "o_proj.weight": wo, L + "q_norm.weight": gain, L + "k_norm.weight": gain}


def _fit_lookup_mlp(drafter, w: dict, lm, mode, weight, ridge: float) -> np.ndarray:
    """Step 4 of :func:`fit_tiny_drafter`: layer 1's ``down_proj`` [H, F] by weighted ridge.

    ``lm`` [V, H] is ``W_lm diag(g)``; ``mode`` / ``weight`` [V, B-1] the wanted draft and the
    sample weight of every (anchor, row). ``drafter`` holds ``w`` with layer 1's down_proj = 0,
    so the output of its layer 1 is the MLP input r.
    """
    cfg, be = drafter.config, drafter.be
    V, H, B = cfg.vocab_size, cfg.hidden_size, drafter.block_size
    ctx = drafter.encode(be.xp.zeros((1, cfg.n_capture * H), dtype=be.xp.float32))  # c = 0
    ctx_pos, noise_pos = np.zeros(1, dtype=np.int64), np.arange(1, 1 + B)
    r = np.zeros((V, B - 1, H))
    for a in range(V):  # the block [a, mask x (B-1)] after the context row at position 0
        h = drafter.embed_block(a)
        for i in range(cfg.num_hidden_layers):
            ck, cv = drafter.context_kv(i, ctx, ctx_pos)
            h = drafter.decoder_layer(i, h, ck, cv, ctx_pos, noise_pos)
        r[a] = be.to_numpy(h)[1:]
    u = rms_norm(r, w["layers.1.post_attention_layernorm.weight"], cfg.rms_norm_eps)
    X = _swiglu_features(w, 1, u).reshape(V * (B - 1), -1)  # [V(B-1), F]
    proto = np.linalg.pinv(lm)  # [H, V]
    proto /= np.sqrt(np.mean(proto * proto, axis=0, keepdims=True))
    T = 4.0 * np.sqrt(np.mean(r * r))
    y = (T * proto.T[mode] - r).reshape(V * (B - 1), H)  # [V(B-1), H]
    sw = weight.reshape(-1, 1)  # [V(B-1), 1]
    A = X.T @ (sw * X)  # [F, F]
    A += ridge * np.trace(A) / A.shape[0] * np.eye(A.shape[0])
    return np.linalg.solve(A, X.T @ (sw * y)).T  # [H, F]


def write_demo_checkpoints(out_dir) -> tuple[Path, Path]:
    """Build the demo target and its fitted drafter in ``out_dir``/target and ``out_dir``/drafter.

    Deterministic: :func:`write_demo_target` (seeded random weights) then
    :func:`fit_tiny_drafter` with the demo defaults. ``scripts/make_demo_checkpoints.py`` writes
    the copies shipped in ``dflash_ref/data/demo``.
    """
    out_dir = Path(out_dir)
    target_dir = write_demo_target(out_dir / "target")
    drafter_dir = fit_tiny_drafter(out_dir / "drafter", target_dir)
    return target_dir, drafter_dir
