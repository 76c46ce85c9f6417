"""Multi-turn chat (dynamo_vulkan.llm.chat): a turn's tokens equal one generate() call over
the whole conversation, only the new tokens are prefilled, the context's end, the chat
template's absence; stop strings (dynamo_vulkan.llm.stop_strings) in generate()."""

from __future__ import annotations

import io
import logging
import types

import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from dynamo_vulkan.llm.chat import (ChatSession, ContextFullError, NoChatTemplateError, chat_template,  # noqa: E402
                                common_prefix, interact, main)
from dynamo_vulkan.llm.generate import generate  # noqa: E402
from dynamo_vulkan.llm.stop_strings import StopStrings, check_stops  # noqa: E402

from gguf_fixtures import write_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("chat") / "tiny-chat.gguf", "llama", context=256)


@pytest.fixture(scope="module")
def session(llama_path):
    """An uncompiled session (the compiled path: test_turns_on_vulkan)."""
    return ChatSession.load(llama_path, max_ctx=64, backend=None)


def _conversation(*turns):
    """[user, assistant, user, ...] messages of alternating texts."""
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


@pytest.mark.parametrize("prompts_on", ["host", "vulkan"])
def test_turns_on_vulkan(llama_path, prompts_on, monkeypatch):
    """On the vulkan backend, a turn without decode steps, then two turns that each
    continue the cache where the last one ended. The prompt's graph runs on Vulkan, or
    (a CPU device's default, DYNAMO_VULKAN_CPU_MATMUL=host) on the host, whose copy of
    the KV cache then lags the one the decode steps wrote on the device."""
    monkeypatch.setenv("DYNAMO_VULKAN_CPU_MATMUL", prompts_on)
    s = ChatSession.load(llama_path, max_ctx=128, backend="vulkan")
    tok = s.tokenizer
    r1 = s.send("hello", max_new_tokens=1)
    assert r1.decode_steps == 0 and r1.past == 0
    turns, texts = [r1], ["hello", r1.text]
    for text in ("the world", "more"):
        prev = turns[-1]
        r = s.send(text, max_new_tokens=4)
        texts.append(text)
        # the conversation's tokens: the last prompt, the reply as generated, the new turn
        assert r.prompt_tokens[:len(prev.prompt_tokens) + len(prev.tokens)] == prev.prompt_tokens + prev.tokens
        assert tok.decode(r.prompt_tokens, skip_special=False) == tok.apply_chat_template(_conversation(*texts))
        # only what follows the last prompt and the reply's fed tokens is prefilled
        fed = len(prev.tokens) - (prev.stop_reason != "stop_token")
        assert r.past == len(prev.prompt_tokens) + fed
        turns.append(r)
        texts.append(r.text)
    for r in turns[:0:-1]:      # one generate() over the whole conversation (greedy), from position 0
        alone = generate(s.model, r.prompt_tokens, tok, max_new_tokens=4, backend="vulkan", warmup=False)
        assert alone.tokens == r.tokens


def test_stop_string_ends_the_reply_and_the_next_turn_reuses_the_cache(session):
    s = session
    s.reset()
    full = s.send("hello", max_new_tokens=6)
    assert len(full.text) >= 3 and full.stop_reason == "max_new_tokens"
    stop = full.text[1:3]
    s.reset()
    chunks = []
    r1 = s.send("hello", max_new_tokens=6, stop=[stop, "never there"], stream=chunks.append)
    assert r1.stop_reason == "stop_string"
    assert r1.text == "".join(chunks) == full.text[:full.text.index(stop)]
    assert r1.tokens == full.tokens[:len(r1.tokens)]
    assert r1.past == len(r1.prompt_tokens) - 1        # the same prompt: all but its last token reused
    # the reply's text no longer ends where its tokens do: the conversation is tokenized
    # anew and the cache reused up to the first token that differs
    r2 = s.send("the world", max_new_tokens=4)
    convo = _conversation("hello", r1.text, "the world")
    assert r2.prompt_tokens == s.tokenizer.encode(s.tokenizer.apply_chat_template(convo))
    assert r2.past == common_prefix(r1.prompt_tokens + r1.tokens[:-1], r2.prompt_tokens)
    assert r2.past >= len(r1.prompt_tokens)
    alone = generate(s.model, r2.prompt_tokens, s.tokenizer, max_new_tokens=4, backend=None)
    assert alone.tokens == r2.tokens


def test_context_full_and_reset(llama_path):
    s = ChatSession.load(llama_path, max_ctx=40, backend=None)
    r = s.send("hello")                       # max_new_tokens: the room left
    assert r.stop_reason in ("context", "stop_token")
    if r.stop_reason == "context":
        assert len(r.prompt_tokens) + len(r.tokens) == 40
    with pytest.raises(ContextFullError, match=r"context holds 40.*/reset"):
        s.send("the world " * 3)
    s.reset()
    again = s.send("hello", max_new_tokens=3)
    assert again.past == len(again.prompt_tokens) - 1 and again.tokens == r.tokens[:3]


def test_chat_template_missing_or_built_in(caplog):
    from dynamo_vulkan.llm.tokenizer import GEMMA_TEMPLATE

    with pytest.raises(NoChatTemplateError, match="base model.*completion"):
        chat_template(types.SimpleNamespace(chat_template=None, arch="llama"), "base.gguf")
    with caplog.at_level(logging.WARNING, logger="dynamo_vulkan.llm.chat"):
        assert chat_template(types.SimpleNamespace(chat_template=GEMMA_TEMPLATE, arch="gemma3"),
                             "g.gguf") is GEMMA_TEMPLATE
    assert "built-in Gemma template" in caplog.text and "g.gguf" in caplog.text
    own = "{{ messages[0]['content'] }}"
    assert chat_template(types.SimpleNamespace(chat_template=own, arch="llama")) == own
    s = ChatSession(None, types.SimpleNamespace(chat_template=None, arch="llama"), backend=None, name="b.gguf")
    with pytest.raises(NoChatTemplateError, match="b.gguf"):
        s.send("hi")


def test_generate_chat_needs_a_template(session, monkeypatch):
    monkeypatch.setattr(type(session.tokenizer), "chat_template", property(lambda self: None))
    with pytest.raises(NoChatTemplateError, match="no chat template"):
        generate(session.model, "hi", session.tokenizer, chat=True, max_new_tokens=1, backend=None)


def test_interact(session):
    session.reset()
    lines = iter(["hello\n", "\n", "/help\n", "/reset\n", "hello\n", "/exit\n", "never read\n"])
    out, err = io.StringIO(), io.StringIO()
    assert interact(session, lines, out, err, max_new_tokens=3, stats=True) == 0
    v = out.getvalue()
    reply = v[:len(v) // 2]
    assert v == reply * 2 and len(reply) > 1 and reply.endswith("\n")   # the same reply after /reset
    assert "/reset" in err.getvalue() and "[a new conversation]" in err.getvalue()
    assert err.getvalue().count("tok/s") == 4 and "cached" in err.getvalue()   # two stats lines
    assert next(lines) == "never read\n"


def test_cli(llama_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nthe world\n"))
    assert main([str(llama_path), "--backend", "none", "-n", "2", "--ctx", "96"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert out.count("\n") >= 2 and out.endswith("\n") and "context full" not in captured.err
    assert main([str(llama_path) + ".missing.gguf"]) == 2


def test_stop_strings():
    s = StopStrings(["END", "xy"])
    shown = [s.push(p) for p in ["ab", "cE", "N", "x", "EN", "D", "tail"]]
    # "E" and "EN" may begin "END": held until they cannot; "x" until "xE" shows it is not "xy"
    assert shown == ["ab", "c", "", "EN", "x", "", ""]
    assert s.hit == "END" and s.text == "abcENx" and s.flush() == ""
    s = StopStrings(["abc"])
    assert [s.push(p) for p in ["xa", "b"]] == ["x", ""] and s.flush() == "ab" and s.text == "xab"
    s = StopStrings(["b", "abc"])                   # the first to complete, at its start
    assert s.push("xab") == "xa" and s.hit == "b"
    s = StopStrings([])
    assert s.push("abc") == "abc" and s.hit is None
    assert check_stops("x") == ["x"] and check_stops(None) == [] and check_stops(["", "y"]) == ["y"]
    for bad in (3, ["a", 1], ["a"] * 17, ["x" * 1001]):
        with pytest.raises(ValueError):
            check_stops(bad)


def test_generate_cli_prompt_file_stdin_and_interactive(llama_path, tmp_path, monkeypatch, capsys, caplog):
    from dynamo_vulkan.llm.generate import main as generate_main

    common = [str(llama_path), "--backend", "none", "-n", "4", "--ctx", "96"]
    assert generate_main(common + ["--prompt", "hello the world"]) == 0
    want = capsys.readouterr()
    assert "first token" in want.err and "load" in want.err
    f = tmp_path / "prompt.txt"
    f.write_text("hello the world", encoding="utf-8")
    assert generate_main(common + ["-f", str(f)]) == 0
    assert capsys.readouterr().out == want.out
    monkeypatch.setattr("sys.stdin", io.StringIO("hello the world"))
    assert generate_main(common + ["-f", "-"]) == 0
    assert capsys.readouterr().out == want.out
    assert generate_main(common + ["-f", str(tmp_path / "none.txt")]) == 2
    assert "cannot read the prompt" in caplog.text
    with pytest.raises(SystemExit) as e:                   # no prompt given
        generate_main(common)
    assert e.value.code == 2
    # -i: the chat over standard input, as python -m dynamo_vulkan.chat
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nthe world\n"))
    assert generate_main(common + ["-i"]) == 0
    chatted = capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("hello\nthe world\n"))
    assert main(common[:1] + common[3:] + ["--backend", "none"]) == 0
    assert capsys.readouterr().out == chatted and chatted.count("\n") >= 2


def test_generate_cli_stop_and_ignore_eos(llama_path, capsys):
    from dynamo_vulkan.llm.generate import main as generate_main

    common = [str(llama_path), "--backend", "none", "--ctx", "96", "--prompt", "hello"]
    assert generate_main(common + ["-n", "8"]) == 0
    full = capsys.readouterr().out.rstrip("\n")
    assert generate_main(common + ["-n", "8", "--stop", full[2:4], "--ignore-eos", "--min-p", "0.1"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == full[:full.index(full[2:4])]
    for bad in (["--min-p", "2"], ["--repeat-penalty", "0"], ["--repeat-last-n", "-2"], ["--stop", "x" * 1001]):
        with pytest.raises(SystemExit) as e:
            generate_main(common + bad)
        assert e.value.code == 2


def test_the_loader_keeps_the_kv_caches_on_the_gpu(llama_path):
    """The decoder is plain PyTorch: the loader marks its KV caches keep_on_device (a K and
    a V cache per layer, the tensors chat reads back before a host prefill), nothing else."""
    from dynamo_vulkan.llm.models import load_model
    from dynamo_vulkan.runtime.program import is_kept_on_device
    model = load_model(llama_path, max_ctx=32)
    caches = model.kv_caches()
    assert len(caches) == 2 * len(model.layers) and all(is_kept_on_device(t) for t in caches)
    cache_ids = {id(t) for t in caches}
    others = [t for t in [*model.parameters(), *model.buffers()] if id(t) not in cache_ids]
    assert others and not any(is_kept_on_device(t) for t in others)
