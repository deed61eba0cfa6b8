"""PNG plots of a ``fastspec bench`` report (needs the ``[plot]`` extra: matplotlib)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plot_report"]


def plot_report(report: dict, folder: str | Path) -> list[Path]:
    """Draw the report's plots into ``folder``; return the files written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    source = report.get("models", {}).get("source", "")

    rows = report.get("context_scaling", [])
    if rows:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for backend in sorted({r["backend"] for r in rows}):
            sel = [r for r in rows if r["backend"] == backend]
            ctx = [r["context"] for r in sel]
            ax1.plot(ctx, [r["vanilla_ms_per_token"] for r in sel], "o-", label=f"vanilla ({backend})")
            ax1.plot(ctx, [r["speculative_ms_per_token"] for r in sel], "s--", label=f"draft model, gamma 4 ({backend})")
            ax2.plot(ctx, [r["speedup"] for r in sel], "o-", label=backend)
        ax1.set(xscale="log", yscale="log", xlabel="context length (tokens)", ylabel="ms per generated token",
                title=f"Decode cost vs context ({source})")
        ax2.axhline(1.0, color="grey", lw=0.8)
        ax2.set(xscale="log", xlabel="context length (tokens)", ylabel="speedup over vanilla (x)",
                title="Speculative speedup vs context")
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        written.append(_save(fig, folder / "speedup_vs_context.png"))

    rows = report.get("gamma_scaling", [])
    if rows:
        fig, ax = plt.subplots(figsize=(6.5, 4.2))
        for key in sorted({(r["backend"], r["drafter"]) for r in rows}):
            sel = [r for r in rows if (r["backend"], r["drafter"]) == key]
            ax.plot([r["gamma"] for r in sel], [r["speedup"] for r in sel], "o-", label=f"{key[1]} ({key[0]})")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(xscale="log", xlabel="gamma / DFlash block size - 1 (tokens per round)",
               ylabel="speedup over vanilla (x)", title=f"Speedup vs draft length ({source})")
        ax.set_xticks(sorted({r["gamma"] for r in rows}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.get_xaxis().set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        written.append(_save(fig, folder / "speedup_vs_gamma.png"))

    rows = [r for r in report.get("kernels", []) if "speedup" in r]
    if rows:
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        names = [r["case"] for r in rows]
        ax.barh(names, [r["speedup"] for r in rows], color="tab:blue")
        ax.axvline(1.0, color="grey", lw=0.8)
        for i, r in enumerate(rows):
            ax.text(r["speedup"], i, f" {r['speedup']:.1f}x", va="center", fontsize=8)
        ax.set(xscale="log", xlabel="Cython speedup over the NumPy twin (x, same run)",
               title="Kernels: Cython vs NumPy (float32)")
        ax.invert_yaxis()
        ax.grid(alpha=0.3, axis="x")
        written.append(_save(fig, folder / "kernels_cython_vs_numpy.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
