"""Export a golden-vector case: run ``generate`` under the recorder and write the layout.

:func:`export_case` loads the target and drafter, runs
:func:`~dflash_ref.spec_decode.loop.generate` with the
:class:`~dflash_ref.oracle.record.Recorder` as its observer, and writes ``manifest.json``,
``inputs.safetensors``, one ``step<NNNN>.safetensors`` per step and, on request, the models as
GGUF in llama.cpp's naming (docs/golden_vectors.md). The folder is written by the project's one
rule for outputs (:mod:`dflash_ref.io.writing`): created and locked for the run, every file
published only once all are complete, the manifest last; ``overwrite`` replaces only the files
an earlier export's manifest names, and nothing else in the folder is touched.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np

import dflash_ref
from dflash_ref.errors import ConfigError
from dflash_ref.io.writing import OutputError, OutputFolder, folder_contents
from dflash_ref.ops.sampling import SamplingParams
from dflash_ref.oracle.conventions import conventions_in_force
from dflash_ref.oracle.layout import (
    INPUTS_FILE,
    LAYOUT_VERSION,
    MANIFEST,
    TOLERANCES,
    kind_of,
    parse_key,
    step_file,
    tensor_key,
    write_tensors,
)
from dflash_ref.oracle.record import Recorder

GGUF_FILES = {"target": "target.gguf", "drafter": "drafter.gguf"}


def _options(text: str | None, kind_name: str) -> tuple[str | None, dict]:
    """``"name,key=value,..."`` -> (name, {key: int | float | str})."""
    if not text:
        return None, {}
    name, *rest = text.split(",")
    opts = {}
    for item in rest:
        if "=" not in item:
            raise ConfigError(f"--{kind_name} {text!r}: expected name,key=value,...")
        k, v = item.split("=", 1)
        for cast in (int, float):
            try:
                v = cast(v)
                break
            except ValueError:
                pass
        opts[k.strip()] = v
    return name.strip(), opts


DEFAULT_COST = {"target_fixed": 1.0, "target_per_row": 0.05, "drafter_fixed": 0.5}


def make_gate(spec: str | None, sampled: bool):
    """``entropy[,ar_p1=..,tie_p1=..,sustain=..]`` | ``commit-ema[,version=..,margin=..,...]``.

    Returns (gate or None, cost model or None, the spec as a dict for the manifest). The
    commit-EMA gate runs on a cost model (``cost_*`` options, else :data:`DEFAULT_COST`) so that
    the case is deterministic.
    """
    from dflash_ref.spec_decode.cost import CostModel
    from dflash_ref.spec_decode.gate import CommitEmaGate, EntropyGate

    name, opts = _options(spec, "gate")
    if name is None:
        return None, None, None
    cost_opts = {k[5:]: float(opts.pop(k)) for k in list(opts) if k.startswith("cost_")}
    if name == "entropy":
        return EntropyGate(sampled=sampled, **opts), None, {"gate": name, **opts}
    if name == "commit-ema":
        cost = CostModel(**{**DEFAULT_COST, **cost_opts})
        return (CommitEmaGate(sampled=sampled, **opts), cost,
                {"gate": name, **opts, "cost_model": dataclasses.asdict(cost)})
    raise ConfigError(f"--gate {spec!r}: unknown gate {name!r}; use entropy or commit-ema")


def make_pager(spec: str | None):
    """``pool=P[,chunk=T,sink=S,tail=W]`` -> a KVFlashPager (LRU) and its spec for the manifest."""
    from dflash_ref.kvflash.pager import KVFlashPager

    if not spec:
        return None, None
    _, opts = _options("pager," + spec, "pager")
    known = {"pool": "pool_tokens", "chunk": "chunk_tokens", "sink": "sink_chunks",
             "tail": "tail_window_chunks"}
    bad = sorted(set(opts) - set(known))
    if bad or "pool" not in opts:
        raise ConfigError(f"--pager {spec!r}: expected pool=P[,chunk=T,sink=S,tail=W]")
    kwargs = {known[k]: int(v) for k, v in opts.items()}
    return KVFlashPager(**kwargs), kwargs


def _model_info(path: Path, config) -> dict:
    files = sorted(p for p in Path(path).iterdir() if p.suffix == ".safetensors")
    return {"name": Path(path).name,
            "config_json": json.loads((Path(path) / "config.json").read_text()),
            "derived": config.describe().splitlines(),
            "sha256": {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in files}}


def export_case(out, target_dir, drafter_dir, prompt_ids, max_new_tokens: int = 16,
                block_size: int | None = None, verify: str = "chain", temperature: float = 0.0,
                seed: int | None = None, gate: str | None = None, pager: str | None = None,
                detail_steps=(), gguf: bool = True, backend: str = "numpy",
                note: str | None = None, overwrite: bool = False) -> dict:
    """Run one generation under the recorder and write the case directory ``out``.

    Args: as ``dflash-ref oracle export`` (docs/golden_vectors.md); ``detail_steps``: steps whose
    target forward is recorded per layer; ``gguf``: also write target.gguf / drafter.gguf (f32,
    llama.cpp naming); ``note``: free text kept in the manifest (e.g. how the models were built).
    Returns the manifest.
    """
    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel

    final = Path(out)
    check_replaceable(final, overwrite)
    prompt = np.asarray(prompt_ids, dtype=np.int64).reshape(-1)
    with OutputFolder(final, "OUT", replace=_case_file_of(final) if overwrite else None,
                      check=lambda folder: check_replaceable(folder, overwrite)) as folder:
        earlier = case_files(final)
        target = TargetModel.from_pretrained(target_dir, backend=backend)
        drafter = DFlashDrafter.from_pretrained(drafter_dir, target)
        sampled = not SamplingParams(temperature).greedy  # generate's rule: greedy below 1e-5
        gate_obj, cost, gate_spec = make_gate(gate, sampled)
        pager_obj, pager_spec = make_pager(pager)
        manifest = _run_and_write(folder, target, drafter, target_dir, drafter_dir, prompt,
                                  max_new_tokens, block_size, verify, temperature, seed, sampled,
                                  gate_obj, cost, gate_spec, pager_obj, pager_spec, detail_steps,
                                  gguf, note)
        folder.commit(remove=earlier)
    return manifest


def check_replaceable(out: Path, overwrite: bool) -> None:
    """Refuse to write the case folder ``out`` where that could mix it with what a user owns.

    An absent or empty folder is written; a non-empty one only with ``overwrite`` and only when
    it is an exported case (it holds ``manifest.json``) and not the current directory (or one of
    its parents), the home directory, a repository root or a filesystem root. Even then only
    the files its manifest names are replaced (:func:`case_files`); anything else stays.
    """
    if not out.exists():
        return
    if not out.is_dir():
        raise OutputError(f"{out} is a file, not a case directory; choose another OUT")
    if not folder_contents(out):
        return
    if not overwrite:
        raise OutputError(f"{out} is not empty; pass overwrite=True (--force) to replace an "
                          f"exported case, or choose another OUT")
    where = out.resolve()
    refusals = [
        (where == Path(where.anchor), "a filesystem root"),
        (Path.cwd().resolve().is_relative_to(where), "the current directory or one of its "
                                                       "parents"),
        (where == Path.home().resolve(), "the home directory"),
        ((where / ".git").exists(), "a repository root (it holds .git)"),
        (not (where / MANIFEST).is_file(), f"not an exported case (no {MANIFEST})"),
    ]
    for refused, what in refusals:
        if refused:
            raise OutputError(f"{out} is {what}; --force replaces only a case directory "
                              f"written by 'dflash-ref oracle export'; choose another OUT")


def case_files(folder: Path) -> set[str]:
    """The names of the files an earlier export wrote in ``folder``, as its manifest lists them
    (the manifest, every tensor file, the GGUF files); empty where there is no manifest."""
    try:
        m = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return set()
    if not isinstance(m, dict):
        return set()
    names = {MANIFEST} | {t.get("file") for t in m.get("tensors") or [] if isinstance(t, dict)}
    names |= {GGUF_FILES[k] for k, v in (m.get("gguf") or {}).items()
              if k in GGUF_FILES and str(v).startswith(GGUF_FILES[k])}
    return {n for n in names if isinstance(n, str) and n and Path(n).name == n}


def _case_file_of(folder: Path):
    """``replace`` for the case folder: a file the earlier export wrote (writing.py, rule 2)."""
    def replace(path: Path) -> str | None:
        if path.name in case_files(folder):
            return None
        return "not a file of the exported case (its manifest does not name it)"

    return replace


def _run_and_write(out, target, drafter, target_dir, drafter_dir, prompt, max_new_tokens,
                   block_size, verify, temperature, seed, sampled, gate_obj, cost, gate_spec,
                   pager_obj, pager_spec, detail_steps, gguf, note) -> dict:
    """Run the generation under the recorder and write every file of the case into ``out``."""
    from dflash_ref.spec_decode.loop import GateOptions, generate

    rec = Recorder(target, drafter, detail_steps)
    result = generate(target, drafter, prompt, max_new_tokens,
                      sampling=SamplingParams(temperature, seed=seed), block_size=block_size,
                      verify=verify, gate=GateOptions(gate_obj, cost), pager=pager_obj,
                      observer=rec)
    tensors = rec.finished()
    inputs = {tensor_key(None, "", "prompt_ids"): prompt,
              tensor_key(None, "", "prompt_positions"): np.arange(prompt.size, dtype=np.int64)}
    write_tensors(out.new(INPUTS_FILE), inputs)
    by_step: dict[int, dict] = {}
    for key, arr in tensors.items():
        by_step.setdefault(parse_key(key).step, {})[key] = arr
    for step, group in by_step.items():
        write_tensors(out.new(step_file(step)), group)
    order = [{"key": k, "file": INPUTS_FILE if parse_key(k).step is None
              else step_file(parse_key(k).step), "dtype": str(a.dtype),
              "shape": list(a.shape), "kind": kind_of(k)}
             for k, a in {**inputs, **tensors}.items()]
    B = int(block_size or drafter.block_size)
    manifest = {
        "layout_version": LAYOUT_VERSION,
        "producer": {"name": "dflash-ref", "version": dflash_ref.__version__,
                     "backend": target.be.name, "compute_dtype": "float32"},
        "note": note,
        "run": {"prompt_ids": prompt.tolist(), "max_new_tokens": max_new_tokens,
                "block_size": B, "verify": verify, "temperature": temperature, "seed": seed,
                "rng": "numpy.random.default_rng(seed) (PCG64)" if sampled else None,
                "gate": gate_spec, "pager": pager_spec,
                "detail_steps": sorted(int(s) for s in detail_steps)},
        "result": {"tokens": result.tokens, "acceptance_lengths": result.acceptance_lengths,
                   "tau": result.tau, "target_forward_passes": result.target_forward_passes,
                   "floored_at": result.floored_at},
        "models": {"target": _model_info(Path(target_dir), target.config),
                   "drafter": _model_info(Path(drafter_dir), drafter.config)},
        "conventions": conventions_in_force(target, drafter, B),
        "tolerances": {k: {"atol": t.atol, "rtol": t.rtol, "why": t.reason}
                       for k, t in TOLERANCES.items()},
        "tolerance_rule": "per element |other - ref| <= atol + rtol * |ref|; NaN equals NaN "
                          "only; shapes must be equal; integer tensors exact",
        "steps": [{k: v for k, v in s.items() if k != "forward_done"}
                  for s in rec.steps],
        "tensors": order,
    }
    if gguf:
        manifest["gguf"] = _write_gguf(out, target_dir, drafter_dir)
    out.new(MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")  # last: published last
    return manifest


def _write_gguf(out, target_dir, drafter_dir) -> dict:
    """The same weights as GGUF in llama.cpp's naming (f32: identical values)."""
    from dflash_ref.errors import DFlashRefError
    from dflash_ref.io.convert_drafter import convert_drafter
    from dflash_ref.io.convert_target import convert_target

    files = {}
    try:
        convert_target(target_dir, out.new(GGUF_FILES["target"]), "f32")
        files["target"] = "target.gguf"
    except DFlashRefError as exc:  # a family llama.cpp has no arch for: say so in the case
        files["target"] = f"not written: {exc}"
    convert_drafter(drafter_dir, out.new(GGUF_FILES["drafter"]), "f32", "llama.cpp",
                    target=target_dir)
    files["drafter"] = "drafter.gguf (arch dflash: target_layers = HF id + 1)"
    return files
