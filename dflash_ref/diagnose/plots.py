"""The report's figures (``dflash-ref explain --plot DIR``), with matplotlib (the ``notebooks``
extra): one PNG each for the acceptance per block position, tau by context and the ablations."""

from __future__ import annotations

from pathlib import Path


def write_figures(report, out_dir) -> list[Path]:
    """Write ``acceptance.png``, ``context.png`` and ``ablations.png`` into ``out_dir`` (made if
    missing); return their paths."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(f"--plot needs matplotlib ({exc}); pip install 'dflash-ref[notebooks]' "
                          f"or drop --plot") from None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    s = report.stats
    j = list(range(1, len(s.p_at_least) + 1))
    paths = []

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
    paths.append(out / "acceptance.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot([lo for lo, _, _ in s.tau_by_context], [t for _, t, _ in s.tau_by_context], "o-")
    ax.set_xlabel("context position (bucket start)")
    ax.set_ylabel("tau")
    fig.tight_layout()
    paths.append(out / "context.png")
    fig.savefig(paths[-1])
    plt.close(fig)

    ran = {n: a.tau for n, a in report.ablations.items() if a is not None}
    names, taus = ["baseline", *ran], [s.tau, *ran.values()]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.barh(names, taus)
    ax.set_xlabel("tau")
    fig.tight_layout()
    paths.append(out / "ablations.png")
    fig.savefig(paths[-1])
    plt.close(fig)
    return paths
