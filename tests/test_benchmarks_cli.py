"""The benchmark harness as a user meets it (issue 32 item 7): installed, it runs from any
directory and writes its results under the current one; a graph placed on the host is a
"host" row, timed and checked, not a failure; the table says which times are wall time
and which device time; a failed row, model or suite fails the run unless --keep-going."""
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from dynamo_vulkan.benchmarks import cli, plots, record, table
from dynamo_vulkan.benchmarks.harness import Bench, Options
from dynamo_vulkan.benchmarks.record import Row
from dynamo_vulkan.benchmarks.timing import Plan, Stat

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "dynamo_vulkan")


def _bench() -> Bench:
    return Bench(Options(quick=True, plan=Plan(reps=2, warmup=1, max_s=0.05), inductor=False), {})


def _saved_run(path: Path, rows: list[Row]) -> Path:
    env = {"date": "2026-11-25 00:00 UTC", "command": "python -m dynamo_vulkan.benchmarks --quick",
           "machine": {"cpu": "cpu", "cpu_count": 2}, "device": {"name": "dev"},
           "versions": {"torch": torch.__version__, "kp": "0.9.0"}, "git": {"commit": "abc"}}
    record.write_json(path, env, {}, rows, [], record.Notes(["run: a note"]), {})
    return path


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel of this tree, built from a copy (the build leaves nothing in the repo) and
    unpacked into a folder of its own: what pip install puts in site-packages."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.spv", "*.egg-info", "build")
    for name in SOURCES:
        p = REPO / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=ignore)
        elif p.exists():
            shutil.copy2(p, src / name)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(src),
                        "-w", str(tmp / "dist")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    wheel = next((tmp / "dist").glob("dynamo_vulkan-*.whl"))
    site = tmp / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return wheel, site


def test_wheel_carries_the_harness_and_its_command(installed):
    wheel, site = installed
    assert (site / "dynamo_vulkan" / "benchmarks" / "__main__.py").is_file()
    assert (site / "dynamo_vulkan" / "benchmarks" / "suites" / "llm.py").is_file()
    assert (site / "dynamo_vulkan" / "benchmarks" / "peers" / "llama_cpp.py").is_file()
    entry = next(site.glob("dynamo_vulkan-*.dist-info")) / "entry_points.txt"
    assert "dynamo-vulkan-bench = dynamo_vulkan.benchmarks.cli:main" in entry.read_text()


def test_wheel_carries_every_subpackage(installed):
    """Every folder of the package (llm/, lowering/, benchmarks/suites/, ...) is in the wheel:
    pyproject finds them, so a new one needs no entry there."""
    _, site = installed
    root = REPO / "dynamo_vulkan"
    packages = [p.parent.relative_to(REPO) for p in root.rglob("__init__.py")]
    assert len(packages) >= 9
    missing = [str(p) for p in packages if not (site / p / "__init__.py").is_file()]
    assert not missing, missing


def test_installed_harness_runs_from_any_directory(installed, tmp_path):
    """From a directory outside the repo, with the installed package first on the path:
    --list names the suites, and --replot writes its table under the current directory."""
    _, site = installed
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    run = tmp_path / "elsewhere"
    run.mkdir()
    r = subprocess.run([sys.executable, "-m", "dynamo_vulkan.benchmarks", "--list"], cwd=run, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "elementwise" in r.stdout and "llm" in r.stdout
    saved = _saved_run(tmp_path / "results.json", [Row("mlp", "w", "eager_cpu", Stat.of([1.0, 2.0]))])
    code = ("import dynamo_vulkan.benchmarks.cli as c, sys; print(c.__file__); "
            "sys.exit(c.main(['--replot', sys.argv[1], '--out', 'mine']))")
    r = subprocess.run([sys.executable, "-c", code, str(saved)], cwd=run, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith(str(site)), r.stdout[:300]          # the installed copy ran, not the repo's
    assert (run / "mine" / "table.md").is_file()
    assert not (REPO / "mine").exists()


def test_cli_default_out_is_relative_to_the_current_directory():
    args = cli.parser().parse_args([])
    assert args.out == "bench-out" and not Path(args.out).is_absolute()
    assert not args.keep_going


@pytest.fixture
def host_matmuls(monkeypatch):
    """The backend's placement as on a CPU Vulkan device (lavapipe), on any device:
    products of 3 rows or more, with the rest of their graph, go to the host."""
    from dynamo_vulkan import device
    monkeypatch.setattr(device, "is_cpu", lambda *a, **k: True)
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", "host")
    monkeypatch.setenv("DYNAMO_VULKAN_CACHE", "0")


def test_host_placed_graph_is_a_host_row(host_matmuls):
    bench = _bench()
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.GELU(), torch.nn.Linear(24, 8))
    rows = bench.compare("mlp", "prompt", model, (torch.randn(8, 16),), inductor=False)
    r = rows["vulkan"]
    assert not r.failed and r.ms is not None and r.ms.median > 0
    assert r.placement == "host" and r.gpu_ms is None and r.kernels is None and r.limit is None
    assert "graph placed on the host: a product of 8 rows" in r.note
    assert r.err is not None and r.ok is True
    # one row: decode-sized products stay on Vulkan, with device time
    rows = bench.compare("mlp", "one row", model, (torch.randn(1, 16),), inductor=False)
    r = rows["vulkan"]
    assert r.placement == "vulkan" and r.gpu_ms is not None and r.kernels and r.ok is True
    text = table.rows_table(bench.rows)
    host_line = next(line for line in text.splitlines() if "| prompt | vulkan |" in line)
    assert "| host |" in host_line and "failed" not in host_line
    assert cli.exit_status(bench, []) == 0


def test_table_labels_wall_and_device_time():
    rows = [Row("mm", "a", "vulkan", Stat.of([2.0]), gpu_ms=Stat.of([1.0]), work=1e9, unit="GFLOP/s",
                placement="vulkan"),
            Row("mm", "a", "torch_cuda", Stat.of([0.5]), gpu_ms=Stat.of([0.5]), work=1e9, unit="GFLOP/s",
                ms_basis="device"),
            Row("mm", "a", "eager_cpu", Stat.of([4.0]), work=1e9, unit="GFLOP/s")]
    lines = table.rows_table(rows).splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert {"ms is", "device ms", "ran on", "throughput (from)"} <= set(head)
    cells = [dict(zip(head, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]
    assert [c["ms is"] for c in cells] == ["wall", "device", "wall"]
    assert cells[0]["throughput (from)"].endswith("(device)") and cells[2]["throughput (from)"].endswith("(wall)")
    assert cells[0]["device ms"] == "1" and cells[2]["device ms"] == "-"


def test_host_rows_stay_in_the_plots(tmp_path):
    pytest.importorskip("matplotlib")
    rows = [Row("block", "prompt", "eager_cpu", Stat.of([2.0]), speedup=1.0),
            Row("block", "prompt", "vulkan", Stat.of([1.0]), speedup=2.0, placement="host")]
    made = plots.draw_all(rows, tmp_path, "t")
    assert (tmp_path / "speedup.png") in made and (tmp_path / "latency.png") in made


def test_a_failed_row_fails_the_run_unless_keep_going(capsys):
    bench = _bench()
    bench.add(Row("mlp", "w", "vulkan", None, note="failed: RuntimeError: boom"))
    assert bench.rows[0].failed
    assert cli.exit_status(bench, []) == 1
    assert "boom" in capsys.readouterr().err
    assert cli.exit_status(bench, [], keep_going=True) == 0
    assert "kept going past" in capsys.readouterr().err


def test_failed_model_or_suite_fails_the_run_unless_keep_going():
    bench = _bench()
    bench.fail("llm", "model.gguf failed: GGUFError: bad")
    assert any("model.gguf failed" in n for n in bench.notes.items)
    assert cli.exit_status(bench, []) == 1 and cli.exit_status(bench, [], keep_going=True) == 0
    bench = _bench()
    assert cli.exit_status(bench, ["llm"]) == 1 and cli.exit_status(bench, ["llm"], keep_going=True) == 0


def test_results_off_eager_fail_even_with_keep_going():
    bench = _bench()
    bench.add(Row("mlp", "w", "vulkan", Stat.of([1.0]), err=1.0, tol=1e-3))
    assert cli.exit_status(bench, [], keep_going=True) == 1


def test_saved_rows_keep_placement_and_basis(tmp_path):
    rows = [Row("mm", "a", "torch_cuda", Stat.of([0.5]), ms_basis="device"),
            Row("mm", "a", "vulkan", Stat.of([1.0]), placement="host")]
    doc = record.load_json(_saved_run(tmp_path / "r.json", rows))
    assert [(r.ms_basis, r.placement) for r in doc["rows"]] == [("device", ""), ("wall", "host")]
    assert json.loads((tmp_path / "r.json").read_text())["rows"][1]["placement"] == "host"


def test_barrier_level_probe_in_the_limits():
    """The barrier-level probe times a chain of dependent one-workgroup kernels (a positive
    time per kernel) and the table's header names it among the limits."""
    from dynamo_vulkan.benchmarks import probes
    got = probes.barrier_level_us(links=4, rounds=1, calls=3)
    assert got["us"] > 0 and got["links"] == 4
    env = {"date": "d", "command": "c", "device": {"name": "dev"},
           "machine": {"cpu": "cpu", "cpu_count": 2}, "versions": {"torch": "t", "kp": "k"}, "git": {}}
    head = table.header(env, {"barrier_level": got})
    assert "a barrier level (one-workgroup kernels in a chain)" in head
    assert probes.barrier_level({"barrier_level": got}) == got["us"]
    assert probes.barrier_level({"barrier_level": {"error": "x"}}) is None
