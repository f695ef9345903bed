"""PNG plots of a benchmark result: speed-up per case, and measured rates against ceilings."""

from __future__ import annotations

from pathlib import Path

from .report import speedups


def plot(doc: dict, out_dir: str | Path, stem: str) -> list[Path]:
    """Write ``<stem>-speedup.png`` and ``<stem>-roofline.png``; return the paths written
    (none when no row was timed, as on a CPU-only machine)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    rows = [r for r in doc["rows"] if r.get("ms_p50")]
    if not rows:
        return []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []

    sp = speedups(rows, field="graph_ms_p50") or speedups(rows)
    cases = list(dict.fromkeys(r["case"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 0.45 * len(cases)), 4))
    width = 0.8 / max(1, len(sp))
    for i, (prov, per_case) in enumerate(sp.items()):
        xs = [j + i * width for j, c in enumerate(cases) if c in per_case]
        ax.bar(xs, [per_case[c] for c in cases if c in per_case], width, label=prov)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cases))], cases, rotation=70,
                  ha="right", fontsize=7)
    ax.set_ylabel("speed-up over torch")
    ax.set_title(f"{doc['meta'].get('suite')} on {doc['meta'].get('gpu')}")
    ax.legend(fontsize=7)
    written.append(_save(plt, fig, out_dir / f"{stem}-speedup.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for prov in dict.fromkeys(r["provider"] for r in rows):
        pts = [(r["flops"] / r["min_bytes"], r["tflops"]) for r in rows if r["provider"] == prov]
        ax.scatter(*zip(*pts), label=prov, s=14)
    ceilings = doc["meta"].get("ceilings") or {}
    hbm = ceilings.get("hbm_gbps")
    for name, tflops in ceilings.items():
        if name.endswith("_tflops"):
            ax.axhline(tflops, linestyle="--", linewidth=0.8, color="gray")
            ax.text(0.99, tflops, f"{name} {tflops:.0f}", fontsize=7, va="bottom", ha="right",
                    transform=ax.get_yaxis_transform())
    if hbm:
        xs = sorted(r["flops"] / r["min_bytes"] for r in rows)
        ax.plot(xs, [x * hbm / 1e3 for x in xs], linestyle=":", color="gray",
                label="memory bound")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("FLOP per minimal byte")
    ax.set_ylabel("TFLOPS (eager median)")
    ax.legend(fontsize=7)
    written.append(_save(plt, fig, out_dir / f"{stem}-roofline.png"))
    return written


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
