"""Benchmarks: vulkan against eager CPU, measured side by side in one run."""
