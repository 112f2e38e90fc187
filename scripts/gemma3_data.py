"""The Gemma 3 drafter's training data by teacher-forced prefill (NumPy only; docs/training.md).

One forward of dflash_ref's own Gemma 3 270M target over a window of corpus text (``<bos>`` and
``window - 1`` ids) gives, for every position t of the window, the captured features (the raw
outputs of the layers ``target_layer_ids``) and the target's greedy prediction ``pred[t]`` (the
argmax of row t, lowest id on ties: what greedy verification compares a draft with). A block
anchored at s then has exact labels for as long as the corpus agrees with the target:

    row 1 label = pred[s]            always exact
    row j label = pred[s + j - 1]    exact iff x[s+1 .. s+j-1] == pred[s .. s+j-2]

because the target's greedy continuation of x[..s] is pred[s], pred[s+1], ... only while the
corpus text it was fed equals that continuation. :func:`exact_rows` gives that mask; training
weighs row j by it (docs/training.md, "Labels").

    PYTHONPATH=$PWD python scripts/gemma3_data.py [--minutes M] [--window 256] [--cache DIR]

Chunks of ``chunk`` windows go to ``--cache`` as they finish (each file written whole, then
renamed into place); a later run continues where the last stopped, and chunk i holds the same
windows on any machine (the window list is seeded).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gemma3_corpus import BOS, dflash_tokenizer, gguf_path, training_parts  # noqa: E402

DEFAULT_CACHE = Path.home() / ".cache" / "dflash_ref" / "gemma3_drafter_windows"
TARGET_LAYER_IDS = [1, 8, 15]
KNOBS = dict(window=256, chunk=16, seed=39, minutes=30.0, threads=2, max_chunks=10_000)


def windows(texts: dict[str, str], tok, window: int, seed: int) -> list[tuple[str, np.ndarray]]:
    """Every text cut into windows of ``window - 1`` ids (the last one ends at the text's end),
    ``<bos>`` first: [(name, ids [window])], in a seeded order that mixes code and prose."""
    out = []
    for name, text in texts.items():
        ids = np.asarray(tok.encode(text, add_bos=False), np.int32)
        n = window - 1
        if ids.size < n:
            continue
        starts = list(range(0, ids.size - n + 1, n))
        if starts[-1] != ids.size - n:
            starts.append(ids.size - n)
        out += [(name, np.concatenate([[BOS], ids[s: s + n]]).astype(np.int32)) for s in starts]
    order = np.random.default_rng(seed).permutation(len(out))
    return [out[i] for i in order]


def chunks(parts: list[dict[str, str]], tok, window: int, chunk: int, seed: int):
    """The cache's chunks: :func:`windows` of each part in turn (part i seeded ``seed + i``), cut
    into chunks of ``chunk`` windows, a part's last chunk possibly short. A part added later
    appends its chunks and leaves every earlier one as it was."""
    out = []
    for i, texts in enumerate(parts):
        wins = windows(texts, tok, window, seed + i)
        out += [wins[j: j + chunk] for j in range(0, len(wins), chunk)]
    return out


def exact_rows(ids: np.ndarray, pred: np.ndarray, anchors: np.ndarray, rows: int) -> np.ndarray:
    """[..., rows] bool: row j (1..rows) of the block anchored at s has an exact label pred[s+j-1].

    ``ids``, ``pred`` [W]; ``anchors`` [...] in 0..W-1. Row j is exact iff s + j - 1 < W and the
    corpus tokens x[s+1 .. s+j-1] equal the target's predictions pred[s .. s+j-2].
    """
    W = ids.shape[-1]
    agree = np.append(ids[1:] == pred[:-1], False)  # agree[t]: x[t+1] == pred[t]   [W]
    j = np.arange(rows)  # row j+1 needs agree[s .. s+j-1] and s + j < W
    t = anchors[..., None] + j  # [..., rows]
    inside = t < W
    chain = np.ones(anchors.shape + (rows,), bool)
    for i in range(1, rows):  # row i+1 is exact iff row i is and x[s+i] == pred[s+i-1]
        prev = np.minimum(t[..., i - 1], W - 1)
        chain[..., i] = chain[..., i - 1] & agree[prev]
    return chain & inside


def draft_vocabulary(preds: np.ndarray, size: int) -> np.ndarray:
    """The ``size`` ids the target predicts most often in ``preds`` (ties: lower id), sorted:
    the draft vocabulary, row i of the drafter's head being target id ``vocab[i]``."""
    ids, counts = np.unique(preds, return_counts=True)
    top = ids[np.lexsort((ids, -counts))[:size]]
    return np.sort(top)


def prefill(tm, ids: np.ndarray):
    """One teacher-forced forward: (pred [W] int32, features [W, C*H] float32)."""
    out = tm.forward(ids, tm.new_state())
    pred = np.argmax(np.asarray(out.logits), axis=1).astype(np.int32)
    return pred, np.asarray(out.features, np.float32)


def write_whole(path: Path, **arrays) -> None:
    """``np.savez`` of ``arrays`` published whole at ``path`` (the project's write rule,
    dflash_ref/io/writing.py: a temporary file beside it, then moved into place)."""
    from dflash_ref.io.writing import new_file

    with new_file(path, "--cache") as tmp:  # tmp ends in .npz: savez adds no suffix
        np.savez(tmp, **arrays)


def make_data(k: dict, cache: Path) -> dict:
    from threadpoolctl import threadpool_limits

    from dflash_ref.models.target import TargetModel

    cache.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    tm = TargetModel.from_gguf(gguf_path())
    tm.set_target_layer_ids(TARGET_LAYER_IDS)
    parts = chunks(training_parts(), dflash_tokenizer(), k["window"], k["chunk"], k["seed"])
    n_chunks, n_wins = min(k["max_chunks"], len(parts)), sum(map(len, parts))
    print(f"{n_wins} windows of {k['window']} ids ({n_chunks} chunks); target loaded in "
          f"{time.time() - t0:.0f} s", flush=True)
    done = sorted(cache.glob("chunk*.npz"))
    first = chunk = len(done)
    deadline, t1 = time.time() + 60 * k["minutes"], time.time()
    with threadpool_limits(k["threads"]):
        if not (cache / "bos_features.npy").exists():  # position 0 is the same in every window
            from dflash_ref.io.writing import new_file

            with new_file(cache / "bos_features.npy", "--cache") as tmp:
                np.save(tmp, prefill(tm, np.array([BOS]))[1][0])
        while chunk < n_chunks and time.time() < deadline:
            part = parts[chunk]
            ids = np.stack([w for _, w in part])
            preds, feats = zip(*(prefill(tm, w) for w in ids))
            # float32: Gemma's activations reach beyond float16's range (65504) in layers 8
            # and 15, at <bos> and elsewhere
            write_whole(cache / f"chunk{chunk:05d}.npz", ids=ids, preds=np.stack(preds),
                        feats=np.stack(feats)[:, 1:], names=np.array([n for n, _ in part]))
            chunk += 1
            rate = sum(map(len, parts[first:chunk])) * k["window"] / (time.time() - t1)
            print(f"chunk {chunk}/{n_chunks}: {rate:.0f} positions/s, "
                  f"{time.time() - t0:.0f} s in all", flush=True)
    n_windows = sum(map(len, parts[:chunk]))  # a part's last chunk may be short
    log = {"knobs": k, "windows_total": n_wins, "chunks": chunk,
           "this_run_chunks": chunk - first, "positions": n_windows * k["window"],
           "data_s": round(time.time() - t0, 1), "prefill_s": round(time.time() - t1, 1)}
    (cache / f"data_log{first:05d}.json").write_text(json.dumps(log, indent=1) + "\n")
    return log


def load_data(cache: Path):
    """(ids [N, W] int64, preds [N, W] int64, feats [N, W, C*H] float32 with <bos>'s row
    zero, bos_features [C*H] float32, names [N])."""
    files = sorted(cache.glob("chunk*.npz"))
    if not files:
        raise SystemExit(f"no windows under {cache}: run scripts/gemma3_data.py first")
    parts = [np.load(f) for f in files]
    ids = np.concatenate([p["ids"] for p in parts]).astype(np.int64)
    preds = np.concatenate([p["preds"] for p in parts]).astype(np.int64)
    names = np.concatenate([p["names"] for p in parts])
    first = parts[0]["feats"]  # [n, W-1, C*H]: positions 1..W-1
    feats = np.zeros((ids.shape[0], first.shape[1] + 1, first.shape[2]), np.float32)
    row = 0
    for i, p in enumerate(parts):  # filled chunk by chunk: the features are most of the memory
        f = first if i == 0 else p["feats"]  # an npz member is read each time it is asked for
        feats[row: row + f.shape[0], 1:] = f
        row += f.shape[0]
    return ids, preds, feats, np.load(cache / "bos_features.npy"), names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cache", default=str(DEFAULT_CACHE), help="where the windows are kept")
    for name, value in KNOBS.items():
        ap.add_argument("--" + name.replace("_", "-"), type=type(value), default=value)
    args = ap.parse_args(argv)
    make_data({n: getattr(args, n) for n in KNOBS}, Path(args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
