"""benchmarks/ab.py, the side-by-side timing of source trees: each tree's process imports
its own tree (a run started inside a checkout imports that checkout, whatever PYTHONPATH
says, and must be refused), rounds alternate the trees, and the summary gives each tree's
throughput a round and its median over the first tree's."""
import shutil
from pathlib import Path

import pytest

from dynamo_vulkan.benchmarks import ab

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """A copy of this checkout's package: a second tree."""
    root = tmp_path_factory.mktemp("tree")
    shutil.copytree(REPO / "dynamo_vulkan", root / "dynamo_vulkan",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return root


def test_a_tree_imports_its_own_package(tree, tmp_path):
    ab.check_tree("B", tree, ab.tree_env(tree, tmp_path / "cache"), tmp_path)
    assert ab.imported_from(ab.tree_env(tree, tmp_path / "cache"), tmp_path) == tree / "dynamo_vulkan"


def test_a_run_inside_a_checkout_is_refused(tree, tmp_path):
    """From the checkout's root, `python -m` and `-c` import the checkout first: the
    tree named on PYTHONPATH would not be the code that runs."""
    env = ab.tree_env(tree, tmp_path / "cache")
    with pytest.raises(ab.TreeError, match="imports dynamo_vulkan from .*not from"):
        ab.check_tree("B", tree, env, REPO)


def test_a_directory_without_the_package_is_refused(tmp_path):
    with pytest.raises(ab.TreeError, match="has no dynamo_vulkan package"):
        ab.check_tree("A", tmp_path, ab.tree_env(tmp_path, tmp_path / "cache"), tmp_path)


def _row(workload: str, tps: float, backend: str = "vulkan") -> dict:
    return {"workload": workload, "backend": backend, "throughput": tps, "unit": "tok/s"}


def test_summary_gives_rounds_and_the_ratio_of_medians():
    runs = {"A": [[_row("m decode 128 after 512", 400), _row("m prefill 512", 9000)],
                  [_row("m decode 128 after 512", 404), _row("m decode 128 after 512", 1, "llama_cpp_vulkan")]],
            "B": [[_row("m decode 128 after 512", 420)], [_row("m decode 128 after 512", 424)]]}
    lines = ab.summary(runs, "decode")
    assert lines == ["m decode 128 after 512 [tok/s]: A 400 / 404; B 420 / 424 (1.050x)"]
    assert ab.summary(runs, "prefill") == ["m prefill 512 [tok/s]: A 9,000; B -"]


def test_main_alternates_the_trees(tree, tmp_path, monkeypatch, capsys):
    order = []

    def fake_run(name, path, models, extra, work, round_):
        order.append((name, round_, extra))
        return [_row("m decode 64 after 128", 100.0 if name == "A" else 110.0)]
    monkeypatch.setattr(ab, "run_tree", fake_run)
    assert ab.main(["--tree", f"A={REPO}", "--tree", f"B={tree}", "--models", "smollm2",
                    "--work", str(tmp_path / "work"), "--", "--prompt-tokens", "128"]) == 0
    assert order == [("A", 1, ["--prompt-tokens", "128"]), ("B", 1, ["--prompt-tokens", "128"]),
                     ("A", 2, ["--prompt-tokens", "128"]), ("B", 2, ["--prompt-tokens", "128"])]
    assert "m decode 64 after 128 [tok/s]: A 100 / 100; B 110 / 110 (1.100x)" in capsys.readouterr().out


def test_main_refuses_a_work_directory_inside_a_tree(tree):
    with pytest.raises(SystemExit):
        ab.main(["--tree", f"A={REPO}", "--tree", f"B={tree}", "--models", "smollm2",
                 "--work", str(tree / "work")])


def test_two_trees_end_to_end(tree, tmp_path, monkeypatch, capsys):
    """A tiny llama's skeleton timed by this checkout and by its copy, one round each: the
    benchmark runs in each tree's process and the summary reads their results."""
    from dynamo_vulkan.benchmarks import synth_model
    from gguf_fixtures import write_tiny_model
    skel = synth_model.save_skeleton(write_tiny_model(tmp_path / "tiny.gguf", "llama", context=64),
                                     tmp_path / "tiny-llama.json.gz")
    monkeypatch.setenv("DYNAMO_VULKAN_BENCH_MODELS", str(tmp_path / "models"))
    work = tmp_path / "work"
    assert ab.main(["--tree", f"A={REPO}", "--tree", f"B={tree}", "--models", str(skel),
                    "--rounds", "1", "--work", str(work), "--",
                    "--quick", "--layers", "1", "--prompt-tokens", "8", "--gen-tokens", "4"]) == 0
    out = capsys.readouterr().out
    line = next(l for l in out.splitlines() if l.startswith("tiny-llama 1-layer decode 4 after 8 [tok/s]: A "))
    assert "; B " in line and line.endswith("x)"), out
    assert (work / "A-1" / "results.json").is_file() and (work / "B-1" / "results.json").is_file()


def test_two_trees_of_one_name_are_refused(tree):
    with pytest.raises(SystemExit):
        ab.main(["--tree", f"A={REPO}", "--tree", f"A={tree}", "--models", "smollm2"])
