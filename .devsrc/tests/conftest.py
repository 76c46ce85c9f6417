"""Test set-up: a private on-disk cache per test session, fresh Dynamo state per
test, and the helper that runs a function compiled for Vulkan against eager."""
import os
import tempfile

import pytest
import torch

os.environ.setdefault("DYNAMO_VULKAN_CACHE_DIR", tempfile.mkdtemp(prefix="dvk-test-cache-"))
os.environ.setdefault("DYNAMO_VULKAN_FALLBACK", "silent")
# a bug in a lowering rule raises (not a quiet CPU fallback): lowering/planner.call_rule
os.environ.setdefault("DYNAMO_VULKAN_STRICT", "1")
# our matmul kernels, not torch, even on lavapipe (Config.cpu_matmul), so the tests check them
os.environ.setdefault("DYNAMO_VULKAN_CPU_MATMUL", "vulkan")


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running test (real models, benchmarks)")


@pytest.fixture
def plans(monkeypatch):
    """The Plans of every program built while the test runs (kernels and their order)."""
    from dynamo_vulkan.runtime import program
    seen = []
    init = program.Program.__init__

    def spy(self, plan, *a, **k):
        seen.append(plan)
        init(self, plan, *a, **k)
    monkeypatch.setattr(program.Program, "__init__", spy)
    return seen


def _plan_as(monkeypatch, device_type: str, label: str) -> None:
    from dynamo_vulkan import device
    info = device.device_info()
    monkeypatch.setitem(info, "device_type", device_type)
    monkeypatch.setitem(info, "name", f"{info['name']} ({label})")


@pytest.fixture
def as_cpu(monkeypatch):
    """Plan as for a CPU device (lavapipe's choices), on whatever device runs the tests
    (a GPU machine too); its name keeps those plans cached apart."""
    _plan_as(monkeypatch, "PHYSICAL_DEVICE_TYPE_CPU", "as a CPU")


@pytest.fixture
def as_gpu(monkeypatch):
    """Plan as for a discrete GPU (lavapipe is a CPU device, for which some fusions and
    splits are off): the device's type says GPU, and its name keeps those plans cached
    apart from lavapipe's."""
    _plan_as(monkeypatch, "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU", "as a GPU")
