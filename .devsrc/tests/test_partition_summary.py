"""The partition report as a reader sees it: counts per op grouped by where and why, one
line when the whole graph went to the host, the per-node list only at debug level."""
import logging

import torch

import dynamo_vulkan
from dynamo_vulkan.partition import HostPlacement


def _compiled_report(f, *args):
    n = len(dynamo_vulkan.reports())
    torch.testing.assert_close(torch.compile(f, backend="vulkan")(*args), f(*args), rtol=1e-4, atol=1e-4)
    reps = dynamo_vulkan.reports()[n:]
    assert len(reps) == 1
    return reps[0]


def test_summary_counts_ops_per_reason(caplog):
    def f(x):      # det has no Vulkan lowering; the rest runs on Vulkan
        y = torch.relu(x) + torch.relu(x * 2) + torch.relu(x * 3)
        return torch.linalg.det(y) + y.sum()
    with caplog.at_level(logging.DEBUG, logger="dynamo_vulkan.backend"):
        rep = _compiled_report(f, torch.randn(3, 3))
    groups = rep.groups()
    vk = groups[("vulkan", "")]
    assert vk["aten.relu.default"] == 3 and sum(vk.values()) == len(rep.vulkan_nodes)
    cpu = {reason: ops for (where, reason), ops in groups.items() if where == "cpu"}
    assert sum(sum(ops.values()) for ops in cpu.values()) == len(rep.cpu_nodes) > 0
    assert any("no Vulkan lowering" in r for r in cpu)
    summary = rep.summary()
    assert rep.host_reason is None and "placed on the host" not in summary
    assert f"{len(rep.vulkan_nodes)} on Vulkan: " in summary and "aten.relu.default x3" in summary
    assert len(summary.splitlines()) == 1 + len(groups)            # one line per group
    assert str(rep).splitlines() == summary.splitlines() + ["  nodes:"] + [     # then every node
        f"  {n.where:6s} {n.name:24s} {n.op}" + (f"  ({n.reason})" if n.reason else "") for n in rep.nodes]
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert summary in info and str(rep) in debug


def test_whole_graph_on_the_host_is_one_line(as_cpu, monkeypatch):
    """A CPU device's prompt-sized product sends its graph to the host: the summary says
    so once, with the setting that keeps it on Vulkan, and groups the rest."""
    from dynamo_vulkan.lowering.core import HOST_MATMUL_MIN_ROWS
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "host")
    rep = _compiled_report(lambda a, b: torch.relu(a @ b) * 2, torch.randn(HOST_MATMUL_MIN_ROWS, 8),
                           torch.randn(8, 4))
    assert not rep.vulkan_nodes and isinstance(rep.host_reason, HostPlacement)
    lines = rep.summary().splitlines()
    placed = [l for l in lines if "graph placed on the host" in l]
    assert len(placed) == 1 and "DYNAMO_VULKAN_CPU_MATMUL=vulkan" in placed[0]
    assert any("placed on the host with the rest of the graph" in l and "aten.relu.default x1" in l
               for l in lines)
    assert any("(what placed the graph there): aten.mm.default x1" in l for l in lines)
    assert sum(sum(ops.values()) for ops in rep.groups().values()) == len(rep.nodes)
