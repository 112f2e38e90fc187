"""The report's figures (``dflash-ref explain --plot DIR``), with matplotlib (the ``notebooks``
extra): one PNG each for the acceptance per block position, tau by context and the ablations,
written by the project's rule for outputs (dflash_ref/io/writing.py)."""

from __future__ import annotations

from pathlib import Path

from dflash_ref.io.writing import NEVER, OutputFolder

FIGURES = ("acceptance.png", "context.png", "ablations.png")


def a_figure(path: Path) -> str | None:
    """``--force``'s test for ``--plot``: only the figures ``explain`` writes are replaced."""
    return None if path.name in FIGURES else "not a figure explain writes"


def write_figures(report, out_dir, replace=NEVER) -> list[Path]:
    """Write :data:`FIGURES` into ``out_dir`` (made if missing, locked while written; an
    existing figure is replaced only where ``replace`` allows, e.g. :func:`a_figure`); return
    their paths."""
    with OutputFolder(out_dir, "--plot", replace=replace) as out:
        _draw(report, out)
        return out.commit()


def _draw(report, out: OutputFolder) -> None:
    """Draw the three figures into temporary files of ``out``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(f"--plot needs matplotlib ({exc}); pip install 'dflash-ref[notebooks]' "
                          f"or drop --plot") from None
    s = report.stats
    j = list(range(1, len(s.p_at_least) + 1))
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.2))
    a1.plot(j, s.p_at_least, "o-", label="P(a >= j)")
    a1.plot(j, s.p_conditional, "s--", label="P(a >= j | a >= j-1)")
    a1.set_xlabel("block position j")
    a1.set_ylim(0, 1.02)
    a1.legend()
    a2.bar(range(1, len(s.histogram) + 1), s.histogram)
    a2.set_xlabel("acceptance length a + 1")
    a2.set_ylabel("steps")
    fig.suptitle(f"tau {s.tau:.2f}, acceptance rate {100 * s.acceptance_rate:.0f}%")
    fig.tight_layout()
    fig.savefig(out.new("acceptance.png"), format="png")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([lo for lo, _, _ in s.tau_by_context], [t for _, t, _ in s.tau_by_context], "o-")
    ax.set_xlabel("context position (bucket start)")
    ax.set_ylabel("tau")
    fig.tight_layout()
    fig.savefig(out.new("context.png"), format="png")
    plt.close(fig)

    ran = {n: a.tau for n, a in report.ablations.items() if a is not None}
    names, taus = ["baseline", *ran], [s.tau, *ran.values()]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.barh(names, taus)
    ax.set_xlabel("tau")
    fig.tight_layout()
    fig.savefig(out.new("ablations.png"), format="png")
    plt.close(fig)
