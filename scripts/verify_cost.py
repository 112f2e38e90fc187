"""What one speculative step costs, phase by phase, on the real Gemma 3 270M target with the
shipped drafter: the draft, the verify's layers, the verify's head rows, the rollback, the rest.

    python scripts/verify_cost.py                          # 3 held-out prompts, 48 tokens
    python scripts/verify_cost.py --prompts 2 --new 32 --groups "" 1 1,1 1,1,1,1,1,1,1
    python scripts/verify_cost.py --head-costs-only        # the head's cost per row count
    python scripts/verify_cost.py --threads 2 --groups "1,1+layers" --p-min 0.9
    python scripts/verify_cost.py --prompts 16 --eval-prompts --threads 2 --model ...

``--threads`` BLAS threads (1 by default; ``dflash-ref generate`` runs Gemma 3 270M on all of
them, ``dflash_ref.backend.LARGE_HEAD``). Each prompt runs every verify
form in turn (``eager``: ``ChainVerifier``, every row through the head in the verify forward;
``lazy a,b``: ``LazyChainVerifier(head_groups=(a, b))``; ``lazy a,b+layers``: the layers too,
group by group, ``layers_later=True``; ``cut p``: ``ConfidentChainVerifier(p_min=p)``, the drafts
cut where the drafter doubts, verified in one forward), ``--rounds`` times, so that a load on the
machine falls on every form alike. Checked first: every form emits the same tokens, and every
form but the cuts the same acceptance lengths (a mismatch prints MISMATCH and no timings).

Printed: the head's cost for 1..B rows (median of ``--reps``), with the backend's ``linear``
and as one matrix product (the reference ``linear``); per form the mean ms per step of
each phase, tokens/s and tau; then the expected head cost per step of each grouping, from the
measured row costs and the eager run's acceptance lengths (``expected_head_ms``).

``--model`` also runs plain decoding first on each prompt (every form must emit its tokens),
keeps the wall of every call of the layers and the head by its number of rows, and fits the
break-even model of ``dflash_ref/spec_decode/break_even.py`` to the run: L(r) and H(r) the
medians of those calls (a row count seen fewer than 3 times interpolated between its
neighbours), D and R the default chain's draft and rollback + rest, P plain decoding's ms per
decode step. Printed and logged (``model``): each form's step ms and speedup predicted at the
eager run's accept counts next to the measured ones, the bound of a verify that knew a in
advance (``oracle``), and the tau from which each form is 1.0x and 1.3x plain decoding.

How a phase is timed: the target's ``hidden_states`` (embedding, the layers, the final norm) and
``lm_head`` are wrapped on the instance (the prefill's first call and the drafter's own use of
the target's head left out), the state's ``rollback`` likewise; "draft" is generate's own phase;
"rest" is the step's wall minus these (the verify decision, the commit, the features' copy).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from dflash_ref.ops.linear import linear  # noqa: E402
from dflash_ref.spec_decode.confident_verify import ConfidentChainVerifier  # noqa: E402
from dflash_ref.spec_decode.lazy_verify import LazyChainVerifier  # noqa: E402
from dflash_ref.spec_decode.verifiers import ChainVerifier  # noqa: E402

DRAFTER = ROOT / "dflash_ref" / "data" / "gemma3_270m_drafter"
DEFAULT = "lazy 1,1+layers"  # generate's verify="chain" (LazyChainVerifier's defaults)
AT_TAU = (2.0, 2.5, 3.0)  # the model's speedups at these taus too (geometric acceptance)
PHASES = ("draft", "verify layers", "verify head", "rollback", "rest")


class Mismatch(Exception):
    pass


class Timed:
    """Seconds spent in the target's layers and head, and in the state's rollback, per run."""

    def __init__(self, target, drafter):
        self.sums = dict.fromkeys(("layers", "head", "rollback"), 0.0)
        self.calls = dict.fromkeys(self.sums, 0)
        self.walls = {"layers": {}, "head": {}}  # rows -> seconds of every call, all runs
        self.in_draft = False
        target.hidden_states = self.wrap("layers", target.hidden_states)
        target.lm_head = self.wrap("head", target.lm_head)
        drafter_logits = drafter.logits

        def draft_logits(z):  # the drafter borrows the target's head: not the verify's
            self.in_draft = True
            try:
                return drafter_logits(z)
            finally:
                self.in_draft = False
        drafter.logits = draft_logits

    def wrap(self, name, fn):
        def timed(*args, **kwargs):
            if self.in_draft:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            if self.calls[name] or name == "rollback":  # the prefill's call left out
                wall = time.perf_counter() - t0
                self.sums[name] += wall
                if name != "rollback":  # rows of this call: ids [T] or h [T, H]
                    self.walls[name].setdefault(len(args[0]), []).append(wall)
            self.calls[name] += 1
            return out
        return timed

    def reset(self, state):
        self.sums = dict.fromkeys(self.sums, 0.0)
        self.calls = dict.fromkeys(self.calls, 0)
        state.rollback = self.wrap("rollback", state.rollback)


def head_costs(head, hidden_size: int, block: int, reps: int) -> list[float]:
    """Median ms of ``head(h)`` (the target's ``lm_head``, or another product by its weight) on
    r = 1..block rows."""
    rng = np.random.default_rng(0)
    h = rng.standard_normal((block, hidden_size)).astype(np.float32)
    out = []
    for r in range(1, block + 1):
        walls = []
        for _ in range(reps):
            t0 = time.perf_counter()
            head(h[:r])
            walls.append(time.perf_counter() - t0)
        out.append(1e3 * float(np.median(walls)))
    return out


def expected_head_ms(groups, costs, a_values) -> float:
    """Mean head ms per step of ``groups`` over steps that accepted ``a_values``: a span
    (lo, hi) is paid when the step reaches row lo (a >= lo)."""
    from dflash_ref.spec_decode.lazy_verify import row_spans
    n = len(costs)
    a = np.asarray(a_values)
    return float(sum(np.mean(a >= lo) * costs[hi - lo - 1] for lo, hi in row_spans(n, groups)))


def loop_costs(walls: dict, block: int, min_calls: int = 3) -> tuple[list[float], list[int]]:
    """Median ms of the calls with r = 1..block rows that ``Timed`` saw in the runs (``walls``:
    rows -> seconds), a row count with fewer than ``min_calls`` calls interpolated linearly
    between the nearest counts that have them; and the calls per row count."""
    calls = [len(walls.get(r, ())) for r in range(1, block + 1)]
    have = [r for r in range(1, block + 1) if calls[r - 1] >= min_calls]
    med = [1e3 * float(np.median(walls[r])) for r in have]
    return [float(np.interp(r, have, med)) for r in range(1, block + 1)], calls


def model_report(report: dict, a_values, block: int) -> dict:
    """The break-even model (dflash_ref/spec_decode/break_even.py) on this run's measured row
    costs, D and R of generate's default form and the plain decode step: each form's step ms
    and speedup predicted at the run's accept counts next to the measured ones, the oracle's
    bound, and the tau from which each form is 1.0x and 1.3x plain decoding."""
    from dflash_ref.spec_decode import break_even as be
    ms = report[DEFAULT]["ms_per_step"]
    c = be.RowCosts(tuple(report["loop_ms_by_rows"]["layers"]),
                    tuple(report["loop_ms_by_rows"]["head"]),
                    draft=ms["draft"], rest=ms["rollback"] + ms["rest"],
                    plain=report["plain"]["ms_per_token"])
    law = be.measured_law(a_values, block)
    forms = {"eager": be.EAGER, DEFAULT: be.Form("lazy", (1, 1), True),
             "lazy ()": be.Form("lazy", (), False), "oracle": be.ORACLE}
    out = {"costs": {"layers": c.layers, "head": c.head, "draft": c.draft, "rest": c.rest,
                     "plain": c.plain}, "eager_accepts": [int(a) for a in a_values],
           "tau": be.law_tau(law), "forms": {}}
    for name, form in forms.items():
        f = {"step_ms": be.expected_step_ms(c, form, law),
             "speedup": be.speedup(c, form, law),
             "break_even_tau": be.break_even_tau(c, form, 1.0),
             "tau_for_1.3x": be.break_even_tau(c, form, 1.3),
             "speedup_at_tau": {str(t): be.speedup(c, form, be.geometric_law(
                 be.geometric_alpha(t, block), block)) for t in AT_TAU}}
        if name in report:  # measured
            f["measured_step_ms"] = sum(report[name]["ms_per_step"].values())
            f["measured_speedup"] = report[name]["tokens_per_s"] / report["plain"]["tokens_per_s"]
        out["forms"][name] = f
    return out


def run_generate(target, drafter, verifier, timed, prompt, args):
    """``generate`` of ``prompt`` on a new state, timed by ``timed`` (drafter None: plain
    decoding): its result and its seconds after the prefill."""
    from dflash_ref.spec_decode.loop import generate
    state = target.new_state()
    timed.reset(state)
    t0 = time.perf_counter()
    res = generate(target, drafter, prompt, args.new, block_size=args.block, verify=verifier,
                   state=state)
    return res, time.perf_counter() - t0 - res.timings["prefill"]


def run_form(target, drafter, verifier, timed, prompt, args):
    res, spec = run_generate(target, drafter, verifier, timed, prompt, args)
    steps = len(res.acceptance_lengths)
    ms = {"draft": res.timings["draft"], "verify layers": timed.sums["layers"],
          "verify head": timed.sums["head"], "rollback": timed.sums["rollback"]}
    ms["rest"] = spec - sum(ms.values())
    return res, {k: 1e3 * v / steps for k, v in ms.items()}, spec, steps


def lazy_form(text: str) -> LazyChainVerifier:
    """``"1,1"``: ``LazyChainVerifier(head_groups=(1, 1))``; ``"1,1+layers"``: with
    ``layers_later=True`` (the layers too group by group)."""
    groups, _, layers = text.partition("+")
    return LazyChainVerifier(head_groups=tuple(int(g) for g in groups.split(",") if g.strip()),
                             layers_later=layers == "layers")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--eval-prompts", action="store_true",
                    help="the eval's in-domain set (half held-out code, half held-out prose; "
                         "scripts/train_gemma3_drafter.py eval) instead of held-out code only")
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--groups", nargs="*", default=["1", "1,1"],
                    help='lazy groupings to run besides eager, e.g. 1 "1,1" "" (all rows at once) '
                         '"1,1+layers" (the layers too, group by group)')
    ap.add_argument("--p-min", type=float, nargs="*", default=[],
                    help="cut forms to run too: ConfidentChainVerifier(p_min=P) for each P")
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads")
    ap.add_argument("--head-costs-only", action="store_true")
    ap.add_argument("--model", action="store_true",
                    help="also time plain decoding and the layers per row count, and fit the "
                         "break-even model (dflash_ref/spec_decode/break_even.py)")
    ap.add_argument("--json", help="also write the numbers to this file")
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=args.threads, user_api="blas"):
        return measure(args, argv)


def measure(args, argv) -> int:
    """The run ``main`` parsed, on its BLAS threads."""
    import gemma3_corpus

    from dflash_ref.models.drafter import DFlashDrafter
    from dflash_ref.models.target import TargetModel
    t0 = time.perf_counter()
    target = TargetModel.from_gguf(gemma3_corpus.gguf_path())
    drafter = DFlashDrafter.from_pretrained(DRAFTER, target)
    print(f"loaded in {time.perf_counter() - t0:.1f} s; {args.threads} BLAS thread(s); load "
          f"average {os.getloadavg()[0]:.2f}")
    costs = head_costs(target.lm_head, target.config.hidden_size, args.block, args.reps)
    print("head ms by rows: " + ", ".join(f"{r}: {c:.1f}" for r, c in enumerate(costs, 1)))
    gemm = head_costs(partial(linear, w=target.lm_head_weight), target.config.hidden_size,
                      args.block, args.reps)  # the reference: one matrix product of r rows
    print("the same as one matrix product (dflash_ref.ops.linear.linear): "
          + ", ".join(f"{r}: {c:.1f}" for r, c in enumerate(gemm, 1)))
    report = {"head_ms_by_rows": costs, "head_ms_by_rows_matrix_product": gemm,
              "load_average_start": os.getloadavg()[0], "blas_threads": args.threads}
    if args.head_costs_only:
        return 0
    forms = {"eager": ChainVerifier()}
    forms.update({f"lazy {g or '()'}": lazy_form(g) for g in args.groups})
    forms.update({f"cut {p}": ConfidentChainVerifier(p_min=p) for p in args.p_min})
    prompts = (gemma3_corpus.eval_prompts if args.eval_prompts
               else gemma3_corpus.held_out_prompts)(args.prompts)
    timed = Timed(target, drafter)
    per_form = {name: [] for name in forms}
    plain_runs = []
    a_values = []
    for _ in range(args.rounds):
        for i, prompt in enumerate(prompts):
            tokens0 = lengths0 = None  # the first run's tokens, the first uncut form's lengths
            if args.model:  # plain decoding first: its tokens are the ones every form must emit
                res, spec = run_generate(target, None, "chain", timed, prompt, args)
                plain_runs.append((spec, len(res.tokens)))
                tokens0 = res.tokens
            for name, verifier in forms.items():
                res, ms, spec, steps = run_form(target, drafter, verifier, timed, prompt, args)
                lengths = None if name.startswith("cut") else res.acceptance_lengths
                tokens0 = res.tokens if tokens0 is None else tokens0
                lengths0 = lengths if lengths0 is None else lengths0
                if res.tokens != tokens0 or lengths not in (None, lengths0):
                    print(f"MISMATCH on prompt {i}: {name} emits other tokens or acceptance "
                          f"lengths than the forms before it")
                    return 1
                per_form[name].append((ms, spec, steps, len(res.tokens), res.tau))
                if name == "eager":
                    a_values += [n - 1 for n in res.acceptance_lengths]
    print(f"identical tokens in every form, acceptance lengths but the cuts'; load average "
          f"{os.getloadavg()[0]:.2f}")
    print(f"{'form':<16}" + "".join(f"{p:>14}" for p in PHASES) + f"{'step ms':>10}"
          f"{'tok/s':>8}{'tau':>6}")
    for name, runs in per_form.items():
        steps = sum(r[2] for r in runs)
        mean = {p: sum(r[0][p] * r[2] for r in runs) / steps for p in PHASES}
        tok_s = sum(r[3] for r in runs) / sum(r[1] for r in runs)
        tau = sum(r[3] for r in runs) / steps
        print(f"{name:<16}" + "".join(f"{mean[p]:>14.1f}" for p in PHASES)
              + f"{sum(mean.values()):>10.1f}{tok_s:>8.2f}{tau:>6.2f}")
        report[name] = {"ms_per_step": mean, "tokens_per_s": tok_s, "tau": tau, "steps": steps}
    if args.model:
        spec, tokens = (sum(r[i] for r in plain_runs) for i in (0, 1))
        report["plain"] = {"ms_per_token": 1e3 * spec / (tokens - len(plain_runs)),
                           "tokens_per_s": tokens / spec}
        print(f"plain: {report['plain']['ms_per_token']:.1f} ms per decode step, "
              f"{report['plain']['tokens_per_s']:.2f} tok/s")
        report["loop_ms_by_rows"] = {}
        for part in ("layers", "head"):
            ms, calls = loop_costs(timed.walls[part], args.block)
            report["loop_ms_by_rows"][part] = ms
            report["loop_ms_by_rows"][part + "_calls"] = calls
            print(f"{part} ms by rows in the runs (calls): " + ", ".join(
                f"{r}: {m:.1f} ({n})" for r, (m, n) in enumerate(zip(ms, calls), 1)))
    print("expected head ms per step (measured row costs, eager's acceptance):")
    for g in ((), (1,), (1, 1), (1, 1, 1), (1, 2), (2,), (1,) * (args.block - 1)):
        ms = expected_head_ms(g, costs, a_values)
        print(f"  head_groups={g!s:<24} {ms:6.1f}")
        report.setdefault("expected_head_ms", {})[str(g)] = ms
    if args.model:
        report["model"] = model_report(report, a_values, args.block)
        m = report["model"]
        print(f"model (dflash_ref/spec_decode/break_even.py) at tau {m['tau']:.2f}:")
        for name, f in m["forms"].items():
            measured = (f"  measured {f['measured_step_ms']:6.1f} ms {f['measured_speedup']:.2f}x"
                        if "measured_step_ms" in f else "")
            tau = [f"{t:.2f}" if t is not None else "never" for t in
                   (f["break_even_tau"], f["tau_for_1.3x"])]
            at = ", ".join(f"{t}: {x:.2f}x" for t, x in f["speedup_at_tau"].items())
            print(f"  {name:<16} step {f['step_ms']:6.1f} ms {f['speedup']:.2f}x{measured}"
                  f"   1.0x from tau {tau[0]}, 1.3x from tau {tau[1]}; at tau {at}")
    report["load_average_end"] = os.getloadavg()[0]
    report["command"] = "python scripts/verify_cost.py " + " ".join(
        sys.argv[1:] if argv is None else argv)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
