"""Train the demo pair: a byte-level Qwen3 target and its DFlash drafter (docs/training.md).

    PYTHONPATH=$PWD python scripts/train_demo_pair.py [OUT_DIR]    # default: dflash_ref/data/demo

Needs the ``train`` extra (PyTorch, tokenizers). Four stages, each seeded:

1. target: a Qwen3-layout LM over bytes (``demo_corpus``) trained with next-byte cross-entropy;
   its weights are rounded to bf16 before anything else uses them, so the rollouts below are
   the greedy text of the checkpoint that is shipped.
2. rollouts: greedy continuations of random training-corpus prompts, then one teacher-forced
   pass over each rollout captures the raw outputs of ``target_layer_ids``. Inside a rollout the
   tokens after any generated position are the target's own greedy continuation, which is what
   the drafter must predict (labels = target output, not corpus text).
3. drafter: the DFlash recipe. Per rollout, ``anchors`` random positions s in the generated part;
   block s is [x_s, MASK x (B-1)] at positions s..s+B-1, it attends to the context features of
   positions < s (never its own or later ones) and to its own block (non-causal); row j is
   scored against x_{s+j} with weight exp(-(j-1)/gamma). All blocks of a rollout share one
   context K/V, with a mask per block. The embedding and lm_head are the target's, frozen.
4. check: both directories load in dflash_ref; on the held-out prompts speculative == plain
   greedy, and tau is measured with the captured features as they are and zeroed.
5. GGUF: ``scripts/convert_demo_pair.py`` converts both to ``gguf/{target,drafter}.gguf``
   (llama.cpp names, BF16 like the safetensors) with dflash_ref's converters.

The torch drafter computes what ``dflash_ref.models.drafter.DFlashDrafter.forward_block`` computes
(context K/V first, per-layer k_norm, NEOX RoPE at absolute positions, non-causal block);
stage 4 checks the two agree on logits. Wall times and loss curves go to ``train_log.json``
next to the checkpoints.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import demo_corpus  # noqa: E402
from convert_demo_pair import convert_demo_pair  # noqa: E402

from dflash_ref.demo_text import bytes_to_unicode  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "dflash_ref" / "data" / "demo"

TARGET = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, intermediate_size=384, rope_theta=10000.0,
              rms_norm_eps=1e-6)
DRAFTER = dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
               intermediate_size=512, rope_theta=10000.0, rms_norm_eps=1e-6, block_size=8,
               target_layer_ids=[1, 2])
KNOBS = dict(seed=15, threads=2, target_steps=800, target_batch=16, target_seq=256,
             target_lr=3e-3, rollouts=1536, rollout_new=64, drafter_steps=1200,
             drafter_batch=16, anchors=16, drafter_lr=2e-3, gamma=4.0, eval_prompts=24,
             eval_new_tokens=128)
ROLLOUT_PROMPT_LENGTHS = (32, 48, 64, 80)  # one decode batch per length


# ---------------------------------------------------------------------------------- pieces

def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(theta: float, d: int, n_pos: int):
    """cos, sin [n_pos, d/2] with float32 angles, as dflash_ref.ops.rope computes them."""
    inv = 1.0 / (torch.tensor(theta, dtype=torch.float32)
                 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    ang = torch.arange(n_pos, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cos(ang), torch.sin(ang)


def apply_rope(x, cos, sin):
    """NEOX halves. x [..., T, d]; cos, sin [..., T, d/2] broadcast over the heads."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Norm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))


class Lin(nn.Module):
    """A bias-free linear layer whose parameter is named ``weight`` ([out, in], HF order)."""

    def __init__(self, n_in, n_out, std=0.02):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_out, n_in) * std)

    def forward(self, x):
        return x @ self.weight.T


class Attention(nn.Module):
    def __init__(self, H, nh, nkv, d, n_layers):
        super().__init__()
        self.nh, self.nkv, self.d = nh, nkv, d
        self.q_proj, self.k_proj = Lin(H, nh * d), Lin(H, nkv * d)
        self.v_proj, self.o_proj = Lin(H, nkv * d), Lin(nh * d, H, 0.02 / math.sqrt(2 * n_layers))
        self.q_norm, self.k_norm = Norm(d), Norm(d)


class MLP(nn.Module):
    def __init__(self, H, F_, n_layers):
        super().__init__()
        self.gate_proj, self.up_proj = Lin(H, F_), Lin(H, F_)
        self.down_proj = Lin(F_, H, 0.02 / math.sqrt(2 * n_layers))

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c, n_layers):
        super().__init__()
        H = c["hidden_size"]
        self.input_layernorm, self.post_attention_layernorm = Norm(H), Norm(H)
        self.self_attn = Attention(H, c["num_attention_heads"], c["num_key_value_heads"],
                                   c["head_dim"], n_layers)
        self.mlp = MLP(H, c["intermediate_size"], n_layers)


class Target(nn.Module):
    """Qwen3ForCausalLM with tied embeddings; parameter names are HF's minus the ``model.``."""

    def __init__(self, c, vocab):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Parameter(torch.randn(vocab, c["hidden_size"]) * 0.02)
        self.layers = nn.ModuleList(Layer(c, c["num_hidden_layers"])
                                    for _ in range(c["num_hidden_layers"]))
        self.norm = Norm(c["hidden_size"])
        self.cos, self.sin = rope_tables(c["rope_theta"], c["head_dim"], 4096)

    def forward(self, ids, capture=(), past=None):
        """ids [b, t] at positions len(past)..; returns logits, {layer: raw output}, new past."""
        eps = self.c["rms_norm_eps"]
        b, t = ids.shape
        p0 = 0 if past is None else past[0][0].shape[2]
        cos, sin = self.cos[p0:p0 + t], self.sin[p0:p0 + t]
        x = self.embed_tokens[ids]
        feats, new_past = {}, []
        for i, L in enumerate(self.layers):
            a = L.self_attn
            u = rms_norm(x, L.input_layernorm.weight, eps)
            q = a.q_proj(u).view(b, t, a.nh, a.d).transpose(1, 2)
            k = a.k_proj(u).view(b, t, a.nkv, a.d).transpose(1, 2)
            v = a.v_proj(u).view(b, t, a.nkv, a.d).transpose(1, 2)
            q = apply_rope(rms_norm(q, a.q_norm.weight, eps), cos, sin)
            k = apply_rope(rms_norm(k, a.k_norm.weight, eps), cos, sin)
            if past is not None:
                k = torch.cat([past[i][0], k], 2)
                v = torch.cat([past[i][1], v], 2)
            new_past.append((k, v))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=past is None and t > 1,
                                               enable_gqa=True)
            x = x + a.o_proj(o.transpose(1, 2).reshape(b, t, a.nh * a.d))
            x = x + L.mlp(rms_norm(x, L.post_attention_layernorm.weight, eps))
            if i in capture:
                feats[i] = x
        logits = rms_norm(x, self.norm.weight, eps) @ self.embed_tokens.T
        return logits, feats, new_past


class Drafter(nn.Module):
    """The DFlash drafter in the z-lab layout (fc, hidden_norm, layers.N.*, norm)."""

    def __init__(self, c, H, n_capture):
        super().__init__()
        self.c = c
        self.fc = Lin(n_capture * H, H)
        self.hidden_norm, self.norm = Norm(H), Norm(H)
        self.layers = nn.ModuleList(Layer(dict(c, hidden_size=H), c["num_hidden_layers"])
                                    for _ in range(c["num_hidden_layers"]))
        self.cos, self.sin = rope_tables(c["rope_theta"], c["head_dim"], 4096)

    def forward(self, feats, block_ids, anchors, embed):
        """feats [b, L, C*H] of positions 0..L-1; block_ids [b, K, B]; anchors s [b, K].

        Block k sits at positions s_k..s_k+B-1 and sees context positions < s_k plus its own
        rows. Returns logits [b, K, B, V] through the target's (tied) lm_head ``embed``.
        """
        return self.blocks(feats, embed[block_ids], anchors, embed)

    def blocks(self, feats, x, anchors, head):
        """:meth:`forward` from the block's input embeddings ``x`` [b, K, B, H], with logits
        over the rows of ``head`` [V', H] (the Gemma recipe scales its embeddings and trains
        over a candidate vocabulary: scripts/train_gemma3_drafter.py)."""
        eps = self.c["rms_norm_eps"]
        b, L, _ = feats.shape
        _, K, B, _ = x.shape
        ctx = rms_norm(self.fc(feats), self.hidden_norm.weight, eps)  # [b, L, H]
        h = x.reshape(b, K * B, -1)
        npos = (anchors[:, :, None] + torch.arange(B)).reshape(b, K * B)
        ncos, nsin = self.cos[npos][:, None], self.sin[npos][:, None]  # [b, 1, KB, d/2]
        ccos, csin = self.cos[:L], self.sin[:L]
        blk = torch.arange(K).repeat_interleave(B)
        # every row of block k sees the context before its anchor only: row j must not see the
        # features of s..s+j-1, which hold the target's own prediction of the labels
        s_row = anchors.repeat_interleave(B, dim=1)  # [b, KB]
        see_ctx = torch.arange(L)[None, None, :] < s_row[:, :, None]  # [b, KB, L]
        see_noise = (blk[:, None] == blk[None, :]).expand(b, K * B, K * B)
        mask = torch.cat([see_ctx, see_noise], dim=2)[:, None]  # [b, 1, KB, L + KB]
        for lay in self.layers:
            a = lay.self_attn
            u = rms_norm(h, lay.input_layernorm.weight, eps)
            q = a.q_proj(u).view(b, K * B, a.nh, a.d).transpose(1, 2)
            q = apply_rope(rms_norm(q, a.q_norm.weight, eps), ncos, nsin)
            ck = a.k_proj(ctx).view(b, L, a.nkv, a.d).transpose(1, 2)
            nk = a.k_proj(u).view(b, K * B, a.nkv, a.d).transpose(1, 2)
            ck = apply_rope(rms_norm(ck, a.k_norm.weight, eps), ccos, csin)
            nk = apply_rope(rms_norm(nk, a.k_norm.weight, eps), ncos, nsin)
            cv = a.v_proj(ctx).view(b, L, a.nkv, a.d).transpose(1, 2)
            nv = a.v_proj(u).view(b, K * B, a.nkv, a.d).transpose(1, 2)
            k, v = torch.cat([ck, nk], 2), torch.cat([cv, nv], 2)  # context FIRST
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
            h = h + a.o_proj(o.transpose(1, 2).reshape(b, K * B, a.nh * a.d))
            h = h + lay.mlp(rms_norm(h, lay.post_attention_layernorm.weight, eps))
        return (rms_norm(h, self.norm.weight, eps) @ head.T).view(b, K, B, -1)


def round_bf16_(module: nn.Module) -> None:
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(torch.bfloat16).float())


def cosine_lr(step, total, peak, warmup=100):
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


# ---------------------------------------------------------------------------------- stages

def train_target(tokens: np.ndarray, k: dict, log: dict) -> Target:
    torch.manual_seed(k["seed"])
    rng = np.random.default_rng(k["seed"])
    model = Target(TARGET, demo_corpus.VOCAB_SIZE)
    opt = torch.optim.AdamW(model.parameters(), lr=k["target_lr"], betas=(0.9, 0.95),
                            weight_decay=0.05)
    data = torch.from_numpy(tokens)
    T, bsz, steps = k["target_seq"], k["target_batch"], k["target_steps"]
    curve, t0 = [], time.time()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, steps, k["target_lr"])
        starts = rng.integers(0, data.numel() - T - 1, bsz)
        batch = torch.stack([data[s: s + T + 1] for s in starts])
        logits, _, _ = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == steps - 1:
            bpb = loss.item() / math.log(2)
            curve.append({"step": step, "bits_per_byte": round(bpb, 4),
                          "wall_s": round(time.time() - t0, 1)})
            print(f"target step {step:5d}  {bpb:.3f} bits/byte  {time.time() - t0:6.0f} s",
                  flush=True)
    log["target_curve"], log["target_train_s"] = curve, round(time.time() - t0, 1)
    round_bf16_(model)
    return model


@torch.no_grad()
def held_out_bits_per_byte(model: Target, held: dict, T: int = 256) -> float:
    total, n = 0.0, 0
    for data in held.values():
        x = torch.from_numpy(np.frombuffer(data, np.uint8).astype(np.int64))
        for s in range(0, x.numel() - T - 1, T):
            seq = x[s: s + T + 1][None]
            logits, _, _ = model(seq[:, :-1])
            total += F.cross_entropy(logits[0], seq[0, 1:], reduction="sum").item()
            n += T
    return total / n / math.log(2)


@torch.no_grad()
def rollouts(model: Target, tokens: np.ndarray, k: dict, log: dict):
    """Greedy continuations of random training prompts; returns ids [R, P+G], features
    [R, P+G, C*H] (float16) and the prompt lengths [R] (each row is left-aligned; rows with a
    shorter prompt end earlier and are padded with PAD, never used as labels)."""
    rng = np.random.default_rng(k["seed"] + 1)
    R, G = k["rollouts"], k["rollout_new"]
    hi = max(ROLLOUT_PROMPT_LENGTHS)
    capture = tuple(DRAFTER["target_layer_ids"])
    t0 = time.time()
    plens = np.asarray(ROLLOUT_PROMPT_LENGTHS)[rng.integers(len(ROLLOUT_PROMPT_LENGTHS), size=R)]
    ids = np.full((R, hi + G), demo_corpus.PAD, np.int64)
    # prompts of one length per chunk, so that a batch decodes in lock step
    for P in np.unique(plens):
        rows = np.flatnonzero(plens == P)
        starts = rng.integers(0, tokens.size - P, rows.size)
        prompt = torch.from_numpy(np.stack([tokens[s: s + P] for s in starts]))
        logits, _, past = model(prompt)
        out = [logits[:, -1].argmax(-1)]
        for _ in range(G - 1):
            logits, _, past = model(out[-1][:, None], past=past)
            out.append(logits[:, -1].argmax(-1))
        ids[rows, :P] = prompt.numpy()
        ids[rows, P:P + G] = torch.stack(out, 1).numpy()
    feats = []
    for i in range(0, R, 64):
        _, f, _ = model(torch.from_numpy(ids[i: i + 64]), capture=capture)
        feats.append(torch.cat([f[j] for j in capture], -1).half())
    log["rollouts_s"] = round(time.time() - t0, 1)
    print(f"rollouts: {R} x {G} tokens, {time.time() - t0:.0f} s", flush=True)
    return torch.from_numpy(ids), torch.cat(feats), torch.from_numpy(plens)


def train_drafter(target: Target, ids, feats, plens, k: dict, log: dict) -> Drafter:
    torch.manual_seed(k["seed"] + 2)
    rng = np.random.default_rng(k["seed"] + 2)
    B, G = DRAFTER["block_size"], k["rollout_new"]
    drafter = Drafter(DRAFTER, TARGET["hidden_size"], len(DRAFTER["target_layer_ids"]))
    embed = target.embed_tokens.detach()
    opt = torch.optim.AdamW(drafter.parameters(), lr=k["drafter_lr"], betas=(0.9, 0.95),
                            weight_decay=0.01)
    weights = torch.exp(-torch.arange(B - 1, dtype=torch.float32) / k["gamma"])
    R, bsz, K, steps = ids.shape[0], k["drafter_batch"], k["anchors"], k["drafter_steps"]
    curve, t0 = [], time.time()
    n_val = min(32, R // 4)  # the last rollouts are kept for a validation accuracy
    for step in range(steps + 1):
        val = step == steps or step % 250 == 0
        rows = (np.arange(R - n_val, R) if val
                else rng.integers(0, R - n_val, bsz))
        P = plens[rows].numpy()
        # anchors s in [P, P + G - B]: the block's labels x_{s+1..s+B-1} are all generated
        s = np.stack([P + rng.choice(G - B + 1, K, replace=False) for P in P])
        L = int(s.max())  # context positions < max anchor are enough
        x, f = ids[rows], feats[rows, :L].float()
        s_t = torch.from_numpy(s)
        block = torch.full((len(rows), K, B), demo_corpus.MASK, dtype=torch.int64)
        block[:, :, 0] = torch.gather(x, 1, s_t)
        labels = torch.gather(x, 1, (s_t[:, :, None] + torch.arange(1, B)).reshape(len(rows), -1)
                              ).view(len(rows), K, B - 1)
        if val:
            with torch.no_grad():
                logits = drafter(f, block, s_t, embed)[:, :, 1:]
                hit = (logits.argmax(-1) == labels).float()
                # expected accepted drafts per block if each block started at these anchors
                accepted = torch.cumprod(hit, -1).sum(-1).mean().item()
            curve.append({"step": step, "val_acc_row1": round(hit[:, :, 0].mean().item(), 4),
                          "val_acc_all": round(hit.mean().item(), 4),
                          "val_tau_estimate": round(1 + accepted, 3),
                          "wall_s": round(time.time() - t0, 1)})
            print(f"drafter step {step:5d}  val tau~{1 + accepted:.2f}  row-1 acc "
                  f"{hit[:, :, 0].mean().item():.3f}  {time.time() - t0:6.0f} s", flush=True)
            if step == steps:
                break
            continue
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, steps, k["drafter_lr"])
        logits = drafter(f, block, s_t, embed)[:, :, 1:]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                             reduction="none").view(labels.shape)
        loss = (ce * weights).sum(-1).mean() / weights.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            curve.append({"step": step, "loss": round(loss.item(), 4),
                          "wall_s": round(time.time() - t0, 1)})
    log["drafter_curve"], log["drafter_train_s"] = curve, round(time.time() - t0, 1)
    round_bf16_(drafter)
    return drafter


# ---------------------------------------------------------------------------------- saving

def load_target(path: Path) -> Target:
    from safetensors.torch import load_file

    model = Target(TARGET, demo_corpus.VOCAB_SIZE)
    w = {k.removeprefix("model."): v.float() for k, v in load_file(str(path / "model.safetensors")
                                                                   ).items()}
    w["embed_tokens"] = w.pop("embed_tokens.weight")
    model.load_state_dict(w)
    return model


def save_safetensors(tensors: dict, path: Path) -> None:
    from safetensors.torch import save_file
    save_file({n: t.detach().to(torch.bfloat16).contiguous() for n, t in tensors.items()},
              str(path), metadata={"format": "pt"})


def target_config() -> dict:
    c = TARGET
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
            "vocab_size": demo_corpus.VOCAB_SIZE, "hidden_size": c["hidden_size"],
            "intermediate_size": c["intermediate_size"],
            "num_hidden_layers": c["num_hidden_layers"],
            "num_attention_heads": c["num_attention_heads"],
            "num_key_value_heads": c["num_key_value_heads"], "head_dim": c["head_dim"],
            "rms_norm_eps": c["rms_norm_eps"], "max_position_embeddings": 4096,
            "attention_bias": False, "attention_dropout": 0.0, "torch_dtype": "bfloat16",
            "bos_token_id": demo_corpus.EOT, "eos_token_id": demo_corpus.EOT,
            "pad_token_id": demo_corpus.PAD, "hidden_act": "silu",
            "rope_theta": c["rope_theta"], "rope_scaling": None, "tie_word_embeddings": True,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": 0}


def drafter_config() -> dict:
    c, t = DRAFTER, TARGET
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
            "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
            "hidden_size": t["hidden_size"], "num_hidden_layers": c["num_hidden_layers"],
            "num_attention_heads": c["num_attention_heads"],
            "num_key_value_heads": c["num_key_value_heads"], "head_dim": c["head_dim"],
            "intermediate_size": c["intermediate_size"], "hidden_act": "silu",
            "rms_norm_eps": c["rms_norm_eps"], "vocab_size": demo_corpus.VOCAB_SIZE,
            "rope_theta": c["rope_theta"], "rope_scaling": None,
            "max_position_embeddings": 4096, "attention_bias": False,
            "attention_dropout": 0.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
            "num_target_layers": t["num_hidden_layers"], "block_size": c["block_size"],
            "layer_types": ["full_attention"] * c["num_hidden_layers"],
            "sliding_window": None, "use_sliding_window": False,
            "dflash_config": {"mask_token_id": demo_corpus.MASK,
                              "target_layer_ids": c["target_layer_ids"]}}


def write_tokenizer(out: Path) -> None:
    """tokenizer.json (byte-level BPE without merges: id b is byte b) + tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = bytes_to_unicode()  # the same table the demo decodes with
    tok = Tokenizer(models.BPE(vocab={alphabet[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(demo_corpus.SPECIAL_TOKENS))
    assert ByteLevel.alphabet() and all(tok.token_to_id(t) == i
                                        for t, i in demo_corpus.SPECIAL_TOKENS.items())
    tok.save(str(out / "tokenizer.json"))
    text = "def f(x):\n    return x + 1  # é\n"
    assert Tokenizer.from_file(str(out / "tokenizer.json")).encode(text).ids == list(
        text.encode()), "the byte tokenizer must map byte b to id b"
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>", "pad_token": "<|pad|>", "mask_token": "<|mask|>",
        "add_bos_token": False, "model_max_length": 4096}, indent=2) + "\n")


def save_pair(target: Target, drafter: Drafter, out: Path) -> tuple[Path, Path]:
    tdir, ddir = out / "target", out / "drafter"
    for d in (tdir, ddir):
        d.mkdir(parents=True, exist_ok=True)
        for old in d.iterdir():
            old.unlink()
    tw = {"model." + (n + ".weight" if n == "embed_tokens" else n): p
          for n, p in target.named_parameters()}
    save_safetensors(tw, tdir / "model.safetensors")
    (tdir / "config.json").write_text(json.dumps(target_config(), indent=2) + "\n")
    write_tokenizer(tdir)
    save_safetensors(dict(drafter.named_parameters()), ddir / "model.safetensors")
    (ddir / "config.json").write_text(json.dumps(drafter_config(), indent=2) + "\n")
    return tdir, ddir


# ---------------------------------------------------------------------------------- check

def check_in_dflash_ref(tdir: Path, ddir: Path, torch_drafter: Drafter, target: Target,
                        k: dict, log: dict) -> None:
    """Load the saved pair with dflash_ref: logits agree with torch, speculative == plain, tau."""
    sys.path.insert(0, str(ROOT))
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel
    from dflash_ref.spec_decode.loop import generate

    tm = TargetModel.from_pretrained(tdir)
    dm = DFlashDrafter.from_pretrained(ddir, tm)
    prompts = demo_corpus.held_out_prompts(k["eval_prompts"])
    # the torch and NumPy drafters compute the same logits: three blocks in one torch call (the
    # training form, one shared context and a mask per block) against three forward_block calls
    p = prompts[0]
    state = tm.new_state()
    tm.forward(p, state)
    feats = np.asarray(state.features.rows(0, p.size))
    anchors = [20, 41, p.size - 1]
    with torch.no_grad():
        block = torch.full((1, len(anchors), DRAFTER["block_size"]), demo_corpus.MASK)
        block[0, :, 0] = torch.from_numpy(p[anchors])
        got = torch_drafter(torch.from_numpy(feats)[None], block, torch.tensor([anchors]),
                            target.embed_tokens)[0].numpy()
    diff = 0.0
    for i, s in enumerate(anchors):
        ref = dm.forward_block(feats[:s], np.arange(s), int(p[s]), s)
        diff = max(diff, float(np.max(np.abs(got[i] - ref))) / max(1.0, float(np.abs(ref).max())))
    print(f"torch vs dflash_ref drafter logits (3 blocks): max relative |diff| {diff:.2e}")
    assert diff < 1e-3, diff
    log["torch_vs_dflash_ref_max_rel_diff"] = diff
    # the ablation: fc = 0 gives the encoder exactly what zeroed features give it
    zeroed = DFlashDrafter.from_pretrained(ddir, tm)
    zeroed.fc = zeroed.fc * 0
    taus, taus_zero, same = [], [], True
    for p in prompts:
        plain = generate(tm, None, p, k["eval_new_tokens"])
        spec = generate(tm, dm, p, k["eval_new_tokens"])
        same &= spec.tokens == plain.tokens
        taus.append(spec.tau)
        taus_zero.append(generate(tm, zeroed, p, k["eval_new_tokens"]).tau)
    log["eval"] = {"prompts": len(prompts), "new_tokens": k["eval_new_tokens"],
                   "lossless": bool(same), "tau": round(float(np.mean(taus)), 3),
                   "tau_min": round(float(np.min(taus)), 3),
                   "tau_features_zeroed": round(float(np.mean(taus_zero)), 3)}
    print(f"held-out: lossless {same}; tau {np.mean(taus):.2f} (min {np.min(taus):.2f}); with "
          f"features zeroed {np.mean(taus_zero):.2f}")


# ---------------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", default=str(DEFAULT_OUT))
    ap.add_argument("--reuse-target", metavar="DIR",
                    help="load this trained target instead of training one (drafter experiments)")
    for name, value in KNOBS.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            ap.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args = ap.parse_args(argv)
    k = dict(KNOBS, **{n: getattr(args, n) for n in KNOBS if hasattr(args, n)})
    torch.set_num_threads(k["threads"])
    out = Path(args.out)
    log = {"knobs": k, "target": TARGET, "drafter": DRAFTER, "torch": torch.__version__}
    t0 = time.time()
    tokens, held = demo_corpus.split_corpus()
    target = train_target(tokens, k, log) if args.reuse_target is None else load_target(
        Path(args.reuse_target))
    log["target_held_out_bits_per_byte"] = round(held_out_bits_per_byte(target, held), 4)
    print(f"target held-out: {log['target_held_out_bits_per_byte']:.3f} bits/byte", flush=True)
    ids, feats, plens = rollouts(target, tokens, k, log)
    drafter = train_drafter(target, ids, feats, plens, k, log)
    tdir, ddir = save_pair(target, drafter, out)
    log["train_total_s"] = round(time.time() - t0, 1)
    check_in_dflash_ref(tdir, ddir, drafter, target, k, log)
    for path in convert_demo_pair(out):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    log["total_s"] = round(time.time() - t0, 1)
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"wrote {tdir} and {ddir}; {log['total_s']:.0f} s in all")
    return 0 if log["eval"]["lossless"] else 1


if __name__ == "__main__":
    sys.exit(main())
