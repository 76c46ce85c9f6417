"""PNG plots of a run: speed-up over eager CPU, latency spread, LLM tokens/s."""
from __future__ import annotations

from pathlib import Path

from .record import Row

COLORS = {"vulkan": "#c0392b", "vulkan_kernel": "#e74c3c", "eager_cpu": "#7f8c8d", "inductor_cpu": "#2980b9",
          "torch_cuda": "#27ae60", "iree_vulkan": "#8e44ad", "llama_cpp_vulkan": "#d35400"}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _workloads(rows: list[Row]) -> list[tuple[str, str]]:
    seen = []
    for r in rows:
        k = (r.suite, r.workload)
        if k not in seen:
            seen.append(k)
    return seen


def speedup(rows: list[Row], path: Path, title: str) -> Path | None:
    rows = [r for r in rows if r.speedup and r.backend != "eager_cpu"]
    if not rows:
        return None
    plt = _plt()
    ys, ticks, labels, y = {}, [], [], 0.0
    for k in _workloads(rows):
        group = sorted((r for r in rows if (r.suite, r.workload) == k), key=lambda r: list(COLORS).index(r.backend)
                       if r.backend in COLORS else 99)
        first = y
        for r in group:
            ys[id(r)] = y
            y += 1
        ticks.append((first + y - 1) / 2)
        host = any(r.backend == "vulkan" and r.placement == "host" for r in group)
        labels.append(f"{k[0]}: {k[1]}" + (" (vulkan: placed on the host)" if host else ""))
        y += 0.7
    fig, ax = plt.subplots(figsize=(10, 0.17 * y + 1.6))
    for b in COLORS:
        sel = [r for r in rows if r.backend == b]
        if sel:
            ax.barh([ys[id(r)] for r in sel], [r.speedup for r in sel], height=0.9, color=COLORS[b],
                    label=b + (" (device time)" if b == "torch_cuda" else ""))
    ax.axvline(1.0, color="black", lw=0.8)
    ax.set_xscale("log")
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.set_ylim(y, -1)
    ax.set_xlabel("speed-up over eager CPU (wall time per call, torch_cuda's device time; >1 is faster)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency(rows: list[Row], path: Path, title: str) -> Path | None:
    rows = [r for r in rows if r.ms is not None]
    if not rows:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(rows) + 1.5))
    for i, r in enumerate(rows):
        c = COLORS.get(r.backend, "black")
        ax.plot([r.ms.min, r.ms.max], [i, i], color=c, lw=0.8)
        ax.plot([r.ms.p10, r.ms.p90], [i, i], color=c, lw=4, alpha=0.6)
        ax.plot([r.ms.median], [i], "|", color="black", ms=9)
    ax.set_yticks(range(len(rows)), [f"{r.workload} [{r.backend}{', on host' if r.placement == 'host' else ''}"
                                     f"{', device time' if r.ms_basis == 'device' else ''}]" for r in rows],
                  fontsize=6)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ms per call (thin: min-max, thick: p10-p90, tick: median)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def tokens(rows: list[Row], path: Path, title: str) -> Path | None:
    rows = [r for r in rows if r.suite == "llm" and r.unit == "tok/s" and r.throughput]
    if not rows:
        return None
    plt = _plt()
    keys = _workloads(rows)
    backends = [b for b in COLORS if any(r.backend == b for r in rows)]
    w = 0.8 / len(backends)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(keys)), 4.5))
    for j, b in enumerate(backends):
        xs, ys = [], []
        for i, k in enumerate(keys):
            r = next((r for r in rows if (r.suite, r.workload) == k and r.backend == b), None)
            if r is not None:
                xs.append(i + j * w)
                ys.append(r.throughput)
        ax.bar(xs, ys, width=w, color=COLORS[b], label=b)
    ax.set_xticks([i + 0.4 - w / 2 for i in range(len(keys))], [k[1] for k in keys], fontsize=7, rotation=15)
    ax.set_yscale("log")
    ax.set_ylabel("tokens/s (median)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_all(rows: list[Row], out: Path, title: str) -> list[Path]:
    made = [speedup(rows, out / "speedup.png", title), latency(rows, out / "latency.png", title),
            tokens(rows, out / "tokens.png", title)]
    return [p for p in made if p is not None]
