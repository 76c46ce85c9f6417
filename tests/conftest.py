"""Test set-up: a private on-disk cache per test session, fresh Dynamo state per
test, and the helper that runs a function compiled for Vulkan against eager."""
import os
import tempfile

import pytest
import torch

os.environ.setdefault("DYNAMO_VULKAN_CACHE_DIR", tempfile.mkdtemp(prefix="dvk-test-cache-"))
os.environ.setdefault("DYNAMO_VULKAN_FALLBACK", "silent")


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running test (real models, benchmarks)")
