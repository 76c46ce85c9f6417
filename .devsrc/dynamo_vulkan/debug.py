"""DYNAMO_VULKAN_DEBUG_DUMP=DIR: what was compiled, where it ran, and why."""
from __future__ import annotations

from pathlib import Path

from .runtime import shaders


def dump_graph(root: Path, graph_id: int, code: str, report) -> Path:
    d = Path(root) / f"graph_{graph_id:03d}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "fx_graph.py").write_text(code)
    (d / "partition_report.txt").write_text(str(report) + "\n")
    return d


def dump_program(d: Path, name: str, index: int, plan) -> None:
    (d / f"{name}_program{index}.txt").write_text(plan.describe() + "\n")
    sd = d / "shaders"
    sd.mkdir(exist_ok=True)
    for key, src in plan.sources.items():
        (sd / f"{key}.comp").write_text(src)
        (sd / f"{key}.spv").write_bytes(shaders.compile_source(src, key))
