"""The one Config: read from the environment and torch.compile's options (options win),
unknown options and bad values rejected with what is allowed, the compile's settings
reaching the partitioner's checks and the rules, the cache key holding every setting
that changes a program, and the README's table equal to Config's."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

import dynamo_vulkan
from dynamo_vulkan import config, device
from dynamo_vulkan.gguf import GGUFLinear
from dynamo_vulkan.gguf.quants import quant_info
from gguf_fixtures import blocks_of
from vk import require_int_dot

ROOT = Path(__file__).resolve().parents[1]


def test_readme_table_is_the_configs():
    readme = (ROOT / "README.md").read_text()
    assert config.settings_table() in readme
    rows = [l for l in readme.splitlines() if l.startswith("| `DYNAMO_VULKAN_")]
    assert len(rows) == len(dataclasses.fields(config.Config))


def test_options_override_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "silent")
    monkeypatch.setenv("DYNAMO_VULKAN_FENCE_SPIN_US", "7")
    cfg = config.load({"fallback": "ERROR", "profile": True, "cache_dir": tmp_path / "c",
                       "debug_dump": str(tmp_path / "d"), "device_index": 0})
    assert (cfg.fallback, cfg.profile, cfg.cache_dir, cfg.device_index) == ("error", True, tmp_path / "c", 0)
    assert cfg.debug_dump == tmp_path / "d" and cfg.debug_dump.is_dir()
    assert cfg.fence_spin_us == 7                           # not an option here: the environment's
    assert config.load().fallback == "silent"
    assert cfg.replace(fallback="warn").fallback == "warn" and cfg.replace().fence_spin_us == 7


def test_unknown_option_lists_the_valid_ones():
    with pytest.raises(config.ConfigError) as e:
        config.load({"fallbak": "error"})
    msg = str(e.value)
    assert "'fallbak'" in msg and all(name in msg for name in config.option_names())


@pytest.mark.parametrize("name, value, allowed", [
    ("fallback", "sometimes", "is not one of"),
    ("profile", "maybe", "neither on nor off"),
    ("fence_spin_us", -1, "whole number from 0 to"),
    ("device_index", True, "whole number from 0 to"),
    ("cpu_matmul", 1, "must be a string"),
])
def test_a_bad_option_names_the_option_and_what_is_allowed(name, value, allowed):
    with pytest.raises(config.ConfigError) as e:
        config.load({name: value})
    assert str(e.value).startswith(f"options[{name!r}]=") and allowed in str(e.value)


def test_key_holds_exactly_the_settings_marked_as_changing_a_program():
    base = config.load({"cpu_matmul": "host", "int_dot": "auto"})
    changed = {"device_index": 3, "cpu_matmul": "vulkan", "int_dot": "off", "fallback": "error",
               "profile": True, "cache_enabled": False, "fence_spin_us": 5, "matmul_precision": "medium",
               "tensor_cores": "off", "strict": True}
    assert set(changed) | {"cache_dir", "model_dir", "debug_dump", "glslc_coopmat"} == set(config.option_names())
    for name, value in changed.items():
        differs = base.replace(**{name: value}).key() != base.key()
        assert differs == dataclasses.fields(config.Config)[config.option_names().index(name)].metadata["key"]
        assert differs == (name in ("device_index", "cpu_matmul", "int_dot", "matmul_precision",
                                    "tensor_cores")), name


def test_no_setting_is_read_from_the_environment_outside_config():
    """Every DYNAMO_VULKAN_* setting of the package is a Config field, read in config.py.
    The benchmark harness is left out: it has variables of its own (DYNAMO_VULKAN_BENCH_MODELS)
    and saves and restores settings around the runs it measures."""
    reads = re.compile(r"(environ\.get\(|getenv\()\s*[\"']DYNAMO_VULKAN_|"
                       r"environ\[[\"']DYNAMO_VULKAN_\w+[\"']\](?!\s*=)")   # a read, not a write
    harness = ROOT / "dynamo_vulkan" / "benchmarks"
    found = [f"{p.relative_to(ROOT)}:{i}" for d in ("dynamo_vulkan",)
             for p in (ROOT / d).rglob("*.py") if p.name != "config.py" and harness not in p.parents
             for i, line in enumerate(p.read_text().splitlines(), 1) if reads.search(line)]
    assert not found


def test_options_reach_the_partitioner_and_the_rules(monkeypatch, plans):
    """cpu_matmul (read by the checks while partitioning) and int_dot (read by the GGUF
    rule through ctx.cfg) from options, against the environment's opposite values."""
    require_int_dot()
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "vulkan")
    monkeypatch.setenv("DYNAMO_VULKAN_INT_DOT", "off")
    monkeypatch.setenv("DYNAMO_VULKAN_FALLBACK", "error")
    lin = GGUFLinear(blocks_of("Q8_0", 8, 256, 8), quant_info("Q8_0").ggml_type, 8, 256)
    x = torch.randn(1, 256)
    with torch.no_grad():
        expected = lin(x)
        for options, kernels in (({}, ["gguf_matvec"]), ({"int_dot": "on"}, ["gguf_xplanes", "gguf_matvec_idot"])):
            torch._dynamo.reset()
            n = len(plans)
            got = torch.compile(lin, backend="vulkan", options=options)(x)
            torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5 * float(expected.abs().max()))
            assert [d.name.split(":")[0] for p in plans[n:] for d in p.dispatches] == kernels

    def f(a, b):
        return torch.relu(a @ b)
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    for options, on_host in (({}, False), ({"cpu_matmul": "host"}, device.is_cpu())):
        torch._dynamo.reset()
        n = len(dynamo_vulkan.reports())
        torch.testing.assert_close(torch.compile(f, backend="vulkan", options=options)(a, b), f(a, b))
        rep = dynamo_vulkan.reports()[n]
        assert (rep.host_reason is not None) == on_host and bool(rep.vulkan_nodes) != on_host


def test_an_unknown_option_fails_the_compile():
    with pytest.raises(Exception, match="unknown dynamo_vulkan option"):
        torch.compile(lambda x: x * 2, backend="vulkan", options={"fallbak": "error"})(torch.ones(3))
