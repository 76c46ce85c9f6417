"""Bad command-line arguments and settings end in one line that names what was wrong and
what is allowed (exit code 2 for the CLI), before any work; chat templates render within
a budget of steps, size and time; DYNAMO_VULKAN_FALLBACK=error with no Vulkan driver
raises instead of running on the CPU."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import tracemalloc

import pytest
import torch

from dynamo_vulkan import config
from dynamo_vulkan.llm import generate
from dynamo_vulkan.llm.chat_template import ChatTemplateError, render


def argparse_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        generate._parser().parse_args(argv)
    assert e.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error: argument" in last
    return last


@pytest.mark.parametrize("args, allowed", [
    (["-n", "-1"], "from 1 to"), (["-n", "0"], "from 1 to"), (["-n", "many"], "from 1 to"),
    (["--ctx", "1000000000"], "from 1 to"), (["--ctx", "0"], "from 1 to"),
    (["--temperature", "nan"], "from 0 to"), (["--temperature", "-0.5"], "from 0 to"),
    (["--temperature", "inf"], "from 0 to"),
    (["--top-p", "5"], "in (0, 1]"), (["--top-p", "0"], "in (0, 1]"),
    (["--top-k", "-3"], ">= 0"), (["--seed", "-1"], "from 0 to"),
    (["--steps-per-call", "0"], ">= 1"),
    (["--backend", "bogus"], "is not a torch.compile backend"),
])
def test_bad_arguments_are_one_line_usage_errors(args, allowed, capsys):
    last = argparse_error(["m.gguf", "--prompt", "hi", *args], capsys)
    assert repr(args[1]) in last and allowed in last


def test_good_arguments_parse():
    a = generate._parser().parse_args(["m.gguf", "-p", "hi", "-n", "5", "--temp", "0.7", "--top-p", "1",
                                       "--top-k", "0", "--backend", "EAGER", "--ctx", "64"])
    assert (a.max_new_tokens, a.temperature, a.top_p, a.top_k, a.backend, a.ctx) == \
        (5, 0.7, 1.0, 0, "eager", 64)


def test_llama_cpp_flag_names_parse():
    """llama-cli's --temp, -c and -t mean what they mean there (-t: threads, not the
    temperature), in the generate and chat CLIs alike."""
    from dynamo_vulkan.llm import chat
    for parser, given in ((generate._parser(), ["-p", "hi"]), (chat._parser(), [])):
        a = parser.parse_args(["m.gguf", *given, "--temp", "0.5", "-c", "128", "-t", "3"])
        assert (a.temperature, a.ctx, a.threads) == (0.5, 128, 3)


def test_threads_are_set_and_checked(capsys):
    before = torch.get_num_threads()
    try:
        generate.sampling_options(generate._parser().parse_args(["m.gguf", "-p", "hi", "-t", "1"]))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    last = argparse_error(["m.gguf", "--prompt", "hi", "-t", "0.7"], capsys)
    assert "'0.7'" in last and "whole number from 1" in last


def test_the_cli_exits_2_with_one_line():
    r = subprocess.run([sys.executable, "-m", "dynamo_vulkan.generate", "m.gguf", "-p", "hi", "--top-p", "5"],
                       capture_output=True, text=True, cwd=tempfile.gettempdir())
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines()[-1].endswith("argument --top-p: '5' is not a number in (0, 1]")


@pytest.mark.parametrize("kwargs", [dict(max_new_tokens=0), dict(max_new_tokens=-1),
                                    dict(temperature=float("nan")), dict(temperature=-1.0),
                                    dict(top_p=5.0), dict(top_k=-3)])
def test_generate_checks_its_settings_before_any_work(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        generate.generate(object(), "hi", tokenizer=object(), **kwargs)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from gguf_fixtures import write_tiny_model
    return write_tiny_model(tmp_path_factory.mktemp("cli") / "tiny.gguf", context=64)


def test_a_context_above_the_files_is_refused_before_allocation(tiny_model, caplog):
    tracemalloc.start()
    try:
        assert generate.main([str(tiny_model), "--prompt", "hi", "--ctx", "1048576"]) == 2
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "1048576" in errors[0] and "64" in errors[0] and "\n" not in errors[0]
    assert peak < 2 * tiny_model.stat().st_size + (4 << 20), peak


# --- settings ------------------------------------------------------------------------

@pytest.mark.parametrize("var, value, allowed", [
    ("DYNAMO_VULKAN_CACHE", "maybe", "neither on nor off"),
    ("DYNAMO_VULKAN_PROFILE", "banana", "neither on nor off"),
    ("DYNAMO_VULKAN_FENCE_SPIN_US", "99999999999999999999", "whole number from 0 to"),
    ("DYNAMO_VULKAN_FENCE_SPIN_US", "-1", "whole number from 0 to"),
    ("DYNAMO_VULKAN_DEVICE", "first", "whole number from 0 to"),
    ("DYNAMO_VULKAN_DEBUG_DUMP", "/proc/nope", "a directory this process can create"),
    ("DYNAMO_VULKAN_FALLBACK", "sometimes", "is not one of"),
    ("DYNAMO_VULKAN_CPU_MATMUL", "gpu", "is not one of"),
])
def test_a_bad_setting_names_the_variable_its_value_and_what_is_allowed(monkeypatch, var, value, allowed):
    monkeypatch.setenv(var, value)
    with pytest.raises(config.ConfigError) as e:
        config.load().key()
    msg = str(e.value)
    assert msg.startswith(f"{var}={value!r}") and allowed in msg and "\n" not in msg


@pytest.mark.parametrize("value, on", [("1", True), ("yes", True), ("ON", True), ("0", False),
                                       ("off", False), ("False", False), ("", True)])
def test_flags_take_the_usual_spellings(monkeypatch, value, on):
    monkeypatch.setenv("DYNAMO_VULKAN_CACHE", value)
    assert config.load().cache_enabled is on


def test_the_cli_reports_a_bad_setting_with_exit_2(tiny_model, monkeypatch, caplog):
    monkeypatch.setenv("DYNAMO_VULKAN_CACHE", "maybe")
    assert generate.main([str(tiny_model), "--prompt", "hi"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith("DYNAMO_VULKAN_CACHE='maybe'")


def test_fallback_error_without_a_driver_raises_instead_of_running_on_the_cpu(tmp_path):
    code = textwrap.dedent("""
        import torch, dynamo_vulkan
        from dynamo_vulkan.backend import VulkanFallbackError
        try:
            torch.compile(lambda x: x + 1, backend="vulkan")(torch.ones(3))
        except Exception as e:
            chain = [e, getattr(e, "inner_exception", None), e.__cause__]
            err = next((c for c in chain if isinstance(c, VulkanFallbackError)), None)
            print("raised", err)
        else:
            print("ran")
    """)
    env = dict(os.environ, VK_ICD_FILENAMES=str(tmp_path / "none.json"),
               VK_DRIVER_FILES=str(tmp_path / "none.json"), DYNAMO_VULKAN_FALLBACK="error",
               DYNAMO_VULKAN_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=tempfile.gettempdir())
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("raised ") and "DYNAMO_VULKAN_FALLBACK=error" in last, r.stdout + r.stderr[-2000:]


# --- chat templates ------------------------------------------------------------------

MSGS = [{"role": "user", "content": "hi"}]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("template, says", [
    ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", "steps"),
    ("{{ 'x' * 1000000000 }}", "repeated"),
    ("{% set l = [1] * 1000000000 %}{{ l|length }}", "repeated"),
    ("{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}"
     "{{ ns.s|length }}", "joined"),
    ("{{ 'x'.center(1000000000) }}", "passed 1000000000 to center"),
    ("{{ 'x'|center(1000000000) }}", "filter center"),
    ("{{ 2 ** 100000000 }}", "power"),
    ("{% for i in range(99999) %}{{ 'x' * 100 }}{% endfor %}", "output"),
    ("{{ raise_exception('no system role') }}", "no system role"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "SecurityError"),
    ("{% for %}", "TemplateSyntaxError"),
])
def test_a_hostile_chat_template_is_refused_within_bounds(template, says):
    tracemalloc.start()
    try:
        with pytest.raises(ChatTemplateError) as e:
            render(template, messages=MSGS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert says in str(e.value) and "\n" not in str(e.value)
    assert peak < 64 << 20, peak


def test_a_chat_template_renders_and_the_trace_is_restored():
    before = sys.gettrace()
    out = render("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}",
                 messages=MSGS * 3, add_generation_prompt=True)
    assert out == "<|user|>hi" * 3 + "<|assistant|>"
    assert sys.gettrace() is before
