"""Pictures of what tk_cute measures and builds (matplotlib; each function returns a Figure that
`.savefig` writes as PNG or SVG, and that a notebook shows inline).

- `speedup_plot(results)`: the NVFP4 bench's speedup over cuBLAS bf16 against M, one panel per
  (N, K), log-scaled M (`python -m tk_cute.bench nvfp4 --plot FILE`).
"""

from __future__ import annotations

from collections import defaultdict

# The bench's variants a reader compares, in legend order (others are drawn too, thinner).
MAIN_VARIANTS = ("tk_cute w4a16", "tk_cute w4a4", "cuBLAS fp8 _scaled_mm",
                 "speed of light: read W")


def _pyplot():
    import matplotlib

    if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
        try:
            matplotlib.use("Agg")
        except Exception:  # noqa: BLE001 - an interactive backend already in use is fine
            pass
    import matplotlib.pyplot as plt

    return plt


def speedup_plot(results: list[dict], baseline: str = "cuBLAS bf16 (deq W)",
                 variants: tuple[str, ...] | None = None):
    """Speedup over `baseline` against M, one panel per (N, K).

    Args:
        results: the bench's rows: dicts with variant, M, N, K, us.
        baseline: the variant every speedup divides (drawn as the line y = 1).
        variants: which variants to draw (default: MAIN_VARIANTS present in the results).

    Returns:
        The matplotlib Figure.
    """
    plt = _pyplot()
    times = {(r["variant"], r["M"], r["N"], r["K"]): r["us"] for r in results}
    panels = defaultdict(set)
    for r in results:
        panels[(r["N"], r["K"])].add(r["M"])
    panels = {nk: ms for nk, ms in panels.items() if len(ms) > 1}  # lines need two points
    present = {r["variant"] for r in results}
    variants = variants or tuple(v for v in MAIN_VARIANTS if v in present)
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5 * max(1, len(panels)), 4),
                             squeeze=False, sharey=True)
    for ax, ((N, K), ms) in zip(axes[0], sorted(panels.items())):
        ms = sorted(ms)
        for name in variants:
            pts = [(m, times[(baseline, m, N, K)] / times[(name, m, N, K)]) for m in ms
                   if (name, m, N, K) in times and (baseline, m, N, K) in times]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=name)
        ax.axhline(1.0, color="black", linewidth=1, label=f"{baseline} = 1")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (activation rows)")
        ax.set_title(f"N={N}, K={K}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel(f"speedup over {baseline}")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    return fig
