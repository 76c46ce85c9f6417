"""Markdown tables of a run: every row, and issue 6's targets."""
from __future__ import annotations

from .record import Row, TargetResult


def num(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a < 1e-2:
        return f"{v:.{digits - 1}e}"
    return f"{v:.{digits}g}"


def _ok(r: Row) -> str:
    ok = r.ok
    return "info" if ok is None and r.err is not None else ("-" if ok is None else ("ok" if ok else "FAIL"))


# "ms" is wall time per call, except where "ms is" says device (torch CUDA's events);
# "device ms" is our kernels' GPU timestamps; a throughput says which of the two it is from
ROW_HEADER = ("suite", "workload", "backend", "ran on", "ms (median)", "ms p10-p90", "ms is", "device ms",
              "throughput (from)", "x eager CPU", "% of limit", "max err", "err ok", "note")


def _ran_on(r: Row) -> str:
    if r.failed:
        return "failed"
    if r.placement == "vulkan" and r.cpu_nodes:
        return f"vulkan + {r.cpu_nodes} CPU node(s)"
    return r.placement or "-"


def rows_table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(ROW_HEADER) + " |", "|" + "---|" * len(ROW_HEADER)]
    for r in rows:
        tp = r.throughput
        cells = [
            r.suite, r.workload, r.backend, _ran_on(r),
            num(r.ms.median) if r.ms else "-",
            f"{num(r.ms.p10)}-{num(r.ms.p90)} (n={r.ms.n})" if r.ms else "-",
            r.ms_basis if r.ms else "-",
            num(r.gpu_ms.median) if r.gpu_ms else "-",
            f"{num(tp)} {r.unit} ({r.basis})" if tp is not None else "-",
            f"{r.speedup:.2f}x" if r.speedup else "-",
            f"{100 * r.of_limit:.0f}%" if r.of_limit else "-",
            num(r.err, 2) if r.err is not None else "-",
            _ok(r),
            r.note.replace("|", "/"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


TARGET_HEADER = ("target", "ours", "baseline", "ratio", "goal", "met", "max err (ours)", "note")


def targets_table(targets: list[TargetResult]) -> str:
    lines = ["| " + " | ".join(TARGET_HEADER) + " |", "|" + "---|" * len(TARGET_HEADER)]
    for t in targets:
        met = "n/a" if t.met is None else ("yes" if t.met else "no")
        base = f"{num(t.baseline)} {t.unit} ({t.baseline_name})" if t.baseline is not None else "-"
        cells = [t.name, f"{num(t.ours)} {t.unit}" if t.ours is not None else "-", base,
                 f"{t.ratio:.2f}" if t.ratio is not None else "-", t.goal, met,
                 num(t.err, 2) if t.err is not None else "-", t.note.replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def header(env: dict, probes: dict) -> str:
    d = env.get("device", {})
    lines = [f"date: {env['date']}", f"command: {env['command']}",
             f"device: {d.get('name')} ({d.get('driver_name', '')} {d.get('driver_info', '')}), "
             f"subgroup {d.get('subgroup_size')}",
             f"machine: {env['machine']['cpu']}, {env['machine']['cpu_count']} CPUs; "
             f"torch {env['versions']['torch']}, kp {env['versions']['kp']}; commit {env['git'].get('commit')}"
             + (" (dirty)" if env['git'].get('dirty') else "")]
    if env.get("settings"):
        lines.append("settings: " + ", ".join(f"{k} {v}" for k, v in env["settings"].items()))
    if env.get("cuda") and env["cuda"].get("name"):
        lines.append(f"torch CUDA device: {env['cuda']['name']}")
    lim = []
    if "gbps" in probes.get("vulkan_copy", {}):
        lim.append(f"Vulkan copy kernel {num(probes['vulkan_copy']['gbps'])} GB/s")
    if "gbps" in probes.get("cuda_copy", {}):
        lim.append(f"torch CUDA d2d copy {num(probes['cuda_copy']['gbps'])} GB/s")
    if "gflops" in probes.get("cuda_fp32_matmul", {}):
        lim.append(f"torch CUDA fp32 matmul (TF32 off) {num(probes['cuda_fp32_matmul']['gflops'])} GFLOP/s")
    es = probes.get("empty_submit", {})
    if "reused_ms" in es:
        lim.append(f"empty kp submit+wait {num(es['reused_ms']['median'] * 1e3)} us "
                   f"(new sequence each time: {num(es['fresh_ms']['median'] * 1e3)} us)")
        if "kp_as_released_ms" in es:
            lim.append(f"the same with kp 0.9 as released (a fence made per submit, no polling) "
                       f"{num(es['kp_as_released_ms']['median'] * 1e3)} us")
    if "us" in probes.get("barrier_level", {}):
        lim.append(f"a barrier level (one-workgroup kernels in a chain) {num(probes['barrier_level']['us'])} us")
    if lim:
        lines.append("limits: " + "; ".join(lim))
    return "\n".join(lines)
