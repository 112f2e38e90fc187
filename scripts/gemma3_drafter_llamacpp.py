"""The shipped Gemma 3 270M drafter in llama.cpp's DFlash, against llama.cpp's plain decoding.

    python scripts/gemma3_drafter_llamacpp.py                       # the pinned build
    python scripts/gemma3_drafter_llamacpp.py --bin DIR --log OUT   # another build's bin/

1. ``drafter_gguf``: ``dflash-ref convert`` of dflash_ref/data/gemma3_270m_drafter (arch
   ``dflash``, llama.cpp naming, BF16 matrices, ``dflash.embedding_scale`` from the drafter's
   ``input_embedding_scale``), plus the target GGUF's ``tokenizer.*`` keys, which llama.cpp needs
   in a draft model ("error loading model vocabulary: key not found in model:
   tokenizer.ggml.model" otherwise). dflash-ref does not write a SentencePiece vocabulary
   (docs/interop.md), so the keys are copied from the Gemma 3 GGUF as they are (gguf-py).
With ``--f32`` both run in float32: the target as an F32 copy of the Q4_K_M GGUF (``f32_target``:
every tensor dequantized by gguf-py, the weights dflash-ref's ``TargetModel.from_gguf`` computes
with) and the drafter converted with F32 matrices. llama.cpp's Q4_K_M products round the
activations to 8 bits, so its logits part from dflash-ref's by about 0.1 and a near tie on the
path may go either way; in float32 only the order of the sums differs.

2. Per held-out prompt of scripts/gemma3_corpus.py (the eval's prompts, as text), alternating:
   plain greedy decoding (``llama-batched -np 1 --top-k 1``) and DFlash speculative decoding
   (``llama-speculative-simple --spec-type draft-dflash --spec-draft-n-max 7``), one thread,
   ``--temp 0``; each prints "decoded N tokens in T s" for its decode loop (prompt excluded).

llama.cpp build 11434 cannot run this pair as it ships: its Gemma 3 graph does not expose the
layer inputs DFlash reads (docs/training.md, "llama.cpp"). ``speculative`` reports that abort
as ``{"error": ...}`` and the script stops. A build with the one-line hook added
(``DFLASH_LLAMACPP_GEMMA3_HOOK=1 scripts/build_llamacpp.sh``, docs/training.md) runs it.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
DRAFTER = ROOT / "dflash_ref" / "data" / "gemma3_270m_drafter"
BUILD = Path.home() / ".cache" / "dflash-ref" / "llamacpp-11434"  # the hooked one: ...-gemma3hook
HOOK_ABORT = "layer input tensor is null"  # src/llama-graph.cpp, llm_graph_result::set_outputs


def drafter_gguf(out: Path, target_gguf: Path, qtype: str = "bf16") -> Path:
    """The drafter as a llama.cpp DFlash GGUF (matrices in ``qtype``) that carries the target's
    vocabulary."""
    import gguf

    from dflash_ref.io.convert_drafter import convert_drafter

    with tempfile.TemporaryDirectory() as tmp:
        plain = convert_drafter(DRAFTER, Path(tmp) / "drafter.gguf", qtype=qtype)
        d, t = gguf.GGUFReader(plain), gguf.GGUFReader(target_gguf)
        w = gguf.GGUFWriter(str(out), arch="dflash")
        for name, f in d.fields.items():
            if not name.startswith("GGUF.") and name != "general.architecture":
                copy_field(w, f)
        for name, f in t.fields.items():  # the drafter's own keys (its mask token) win
            if name.startswith("tokenizer.") and name not in d.fields:
                copy_field(w, f)
        for ti in d.tensors:
            w.add_tensor_info(ti.name, ti.data.shape, ti.data.dtype, ti.data.nbytes,
                              ti.tensor_type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for ti in d.tensors:
            w.write_tensor_data(ti.data)
        w.close()
    return out


def copy_field(w, f) -> None:
    """Key ``f`` of a ``gguf.GGUFReader``, with its value type, into the ``gguf.GGUFWriter`` w."""
    import gguf

    sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
    w.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)


def f32_target(src: Path, out: Path) -> Path:
    """``src`` with every tensor dequantized to F32 (gguf-py's ``dequantize``) and every key
    kept (the file type set to all-F32), complete or absent (``dflash_ref.io.writing.new_file``):
    the target dflash-ref computes with, for llama.cpp. An ``out`` already written is reused."""
    import gguf

    from dflash_ref.io.writing import new_file, replace_any

    if out.exists():
        return out
    r = gguf.GGUFReader(src)
    with new_file(out, "--f32", replace=replace_any) as tmp:
        w = gguf.GGUFWriter(str(tmp), arch=r.fields["general.architecture"].contents())
        for name, f in r.fields.items():
            if not name.startswith("GGUF.") and name not in ("general.architecture",
                                                             "general.file_type"):
                copy_field(w, f)
        w.add_file_type(gguf.LlamaFileType.ALL_F32)
        for ti in r.tensors:
            w.add_tensor(ti.name, gguf.quants.dequantize(ti.data, ti.tensor_type)
                         .astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return out


def _run(cmd: list[str], until: str, tries: int = 5) -> subprocess.CompletedProcess:
    """Run a tool; repeat while its stderr lacks ``until`` (llama.cpp's logger can lose the tail
    of a run's output at exit: docs/interop.md, "A lost tail")."""
    for _ in range(tries):
        p = subprocess.run(cmd, capture_output=True, stdin=subprocess.DEVNULL, timeout=600)
        p.out = p.stdout.decode("utf-8", "replace")
        p.err = p.stderr.decode("utf-8", "replace")
        if p.returncode != 0 or until in p.err:
            break
    return p


def _decoded(err: str) -> tuple[int, float]:
    m = re.findall(r"decoded\s+(\d+) tokens in\s+([\d.]+) s", err)
    if not m:
        raise RuntimeError(f"no 'decoded N tokens in T s' line:\n{err[-2000:]}")
    return int(m[-1][0]), float(m[-1][1])


def speculative(bin_dir: Path, target: Path, drafter: Path, text: str, n_new: int) -> dict:
    from dflash_ref.oracle.llamacpp_loop import spec_steps

    p = _run([str(bin_dir / "llama-speculative-simple"), "-m", str(target), "-md", str(drafter),
              "--spec-type", "draft-dflash", "--spec-draft-n-max", "7", "-n", str(n_new),
              "--temp", "0", "-t", "1", "-v", "-p", text], until="n_accept")
    if p.returncode != 0:
        line = next((x for x in p.err.splitlines() if "GGML_ASSERT" in x), p.err[-300:])
        return {"error": line.strip(), "returncode": p.returncode}
    n, s = _decoded(p.err)
    get = {k: int(re.search(rf"{k}\s*=\s*(\d+)", p.err).group(1))
           for k in ("n_predict", "n_drafted", "n_accept")}
    steps = get["n_predict"] - get["n_accept"]  # each verify step commits accepted + 1
    per_step = spec_steps(p.err)  # the -v lines
    return {"tokens": n, "s": s, **get, "tau": round(get["n_predict"] / max(steps, 1), 3),
            "text": p.out.split(text, 1)[-1], "steps": per_step}


def same_way(tm, dm, tok, ids, spec: dict, n_new: int) -> dict:
    """dflash-ref on the same prompt: its plain greedy tokens against llama.cpp's speculative
    text, the target's smallest top-2 gap along that path (a near tie is where the two stacks'
    float results may part), and the accepted drafts per step of dflash-ref driven in llama.cpp's
    order (``llamacpp_loop``) against llama.cpp's own, over llama.cpp's full-block steps."""
    from dflash_ref.oracle.llamacpp_loop import full_block_steps, greedy_gaps, llamacpp_loop
    from dflash_ref.spec_decode.loop import generate

    plain = generate(tm, None, ids, n_new).tokens
    gaps = greedy_gaps(tm, ids, plain)
    theirs = full_block_steps(spec["steps"])
    _, ours = llamacpp_loop(tm, dm, ids, n_new + 8)
    return {"min_gap": round(float(gaps.min()), 4),
            # decoded after the prompt: a continuation decoded alone loses its leading space
            "same_tokens": spec["text"].startswith(
                tok.decode([*ids[1:], *plain])[len(tok.decode(ids[1:])):]),
            "same_accepted": bool(theirs) and ours[:len(theirs)] == theirs,
            "accepted_llamacpp": theirs, "accepted_dflash_ref": ours[:len(theirs)]}


def plain(bin_dir: Path, target: Path, text: str, n_prompt: int, n_new: int) -> dict:
    p = _run([str(bin_dir / "llama-batched"), "-m", str(target), "-np", "1", "--top-k", "1",
              "--temp", "0", "-t", "1", "-n", str(n_prompt + n_new), "-p", text],
             until="decoded")
    if p.returncode != 0:
        raise RuntimeError(f"llama-batched exited {p.returncode}:\n{p.err[-2000:]}")
    n, s = _decoded(p.err)
    return {"tokens": n, "s": s, "text": (p.out + p.err).split(text, 1)[-1]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, default=BUILD / "bin", help="llama.cpp's bin/ folder")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--log", type=Path, default=None, help="write the results here (JSON)")
    ap.add_argument("--f32", action="store_true",
                    help="run llama.cpp on an F32 copy of the target (cached next to the build) "
                         "and an F32 drafter: the weights dflash-ref computes with")
    ap.add_argument("--same-way", action="store_true",
                    help="also run dflash-ref on each prompt: tokens and accepted drafts per "
                         "step against llama.cpp's")
    args = ap.parse_args(argv)
    import gemma3_corpus

    source = target = gemma3_corpus.gguf_path()
    tok = gemma3_corpus.dflash_tokenizer()
    work = Path(tempfile.mkdtemp(prefix="gemma3_llamacpp_"))
    if args.f32:
        target = f32_target(source, BUILD.parent / (source.stem + "-f32.gguf"))
    drafter = drafter_gguf(work / "drafter.gguf", source, "f32" if args.f32 else "bf16")
    rows, models = [], None
    if args.same_way:
        from dflash_ref.models.drafter import DFlashDrafter
        from dflash_ref.models.target import TargetModel

        tm = TargetModel.from_gguf(source)
        models = (tm, DFlashDrafter.from_pretrained(DRAFTER, tm))
    for i, ids in enumerate(gemma3_corpus.held_out_prompts(args.prompts)):
        text = tok.decode(ids[1:])
        same_ids = tok.encode(text) == ids  # llama.cpp adds <bos> as dflash-ref's encode does
        spec = speculative(args.bin, target, drafter, text, args.new_tokens)
        if "error" in spec:
            print(json.dumps(spec), flush=True)
            if args.log:
                args.log.write_text(json.dumps({"bin": str(args.bin), **spec}, indent=1) + "\n")
            return 1
        base = plain(args.bin, target, text, len(ids), args.new_tokens)
        row = {"prompt": i, "same_ids": same_ids, "plain_tokens": base["tokens"],
               "plain_s": base["s"], "spec_tokens": spec["tokens"], "spec_s": spec["s"],
               "tau": spec["tau"], "n_drafted": spec["n_drafted"], "n_accept": spec["n_accept"],
               "same_text": spec["text"][:40] == base["text"][:40]}
        if models:
            row.update(same_way(*models, tok, ids, spec, args.new_tokens))
        rows.append(row)
        print(json.dumps(row), flush=True)
    tot = {k: round(sum(r[k] for r in rows), 3)
           for k in ("plain_tokens", "plain_s", "spec_tokens", "spec_s")}
    summary = {"bin": str(args.bin), "f32": args.f32, "target": target.name,
               "prompts": len(rows), "new_tokens": args.new_tokens,
               **tot, "plain_tok_s": round(tot["plain_tokens"] / tot["plain_s"], 2),
               "spec_tok_s": round(tot["spec_tokens"] / tot["spec_s"], 2),
               "speedup": round((tot["spec_tokens"] / tot["spec_s"])
                                / (tot["plain_tokens"] / tot["plain_s"]), 3),
               "tau": round(sum(r["tau"] for r in rows) / len(rows), 3),
               "acceptance": round(sum(r["n_accept"] for r in rows)
                                   / max(sum(r["n_drafted"] for r in rows), 1), 3),
               "date": time.strftime("%Y-%m-%d"), "per_prompt": rows}
    if models:  # the prompts without a near tie on the target's path (gap >= 0.1)
        clear = [r for r in rows if r["min_gap"] >= 0.1]
        summary["same_way"] = {
            "prompts_gap_ge_0.1": len(clear),
            "same_tokens": sum(r["same_tokens"] for r in clear),
            "same_accepted": sum(r["same_accepted"] for r in clear),
            "same_tokens_all_prompts": sum(r["same_tokens"] for r in rows),
            "same_accepted_all_prompts": sum(r["same_accepted"] for r in rows)}
    print(json.dumps({k: v for k, v in summary.items() if k != "per_prompt"}))
    if args.log:
        args.log.write_text(json.dumps(summary, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
