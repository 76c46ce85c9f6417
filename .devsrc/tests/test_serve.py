"""The OpenAI-compatible server (dynamo_vulkan.llm.serve) end to end: the `openai` client
against a server the test starts on 127.0.0.1 with a tiny random-weight model. Every
answer is checked against generate() on a second copy of the model (greedy)."""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")
uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from dynamo_vulkan.llm.chat import ChatSession  # noqa: E402
from dynamo_vulkan.llm.generate import generate, load  # noqa: E402
from dynamo_vulkan.llm.serve import create_app, main  # noqa: E402

from gguf_fixtures import write_tiny_model  # noqa: E402

CTX = 128


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("serve") / "tiny-serve.gguf", "llama", context=256)


@pytest.fixture(scope="module")
def server(model_path):
    """(base URL, app) of a server on a free port of 127.0.0.1, stopped at the end."""
    session = ChatSession.load(model_path, max_ctx=CTX, backend=None)
    app = create_app(session, "tiny", max_queue=8)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield sock.getsockname()[1], app
    srv.should_exit = True
    thread.join(30)
    sock.close()
    assert not thread.is_alive()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server[0]}/v1", api_key="unused", max_retries=0, timeout=60,
                         http_client=openai.DefaultHttpxClient(trust_env=False))   # no proxy for 127.0.0.1


def _http(port, method, path, body=None):
    """(status, JSON body) of one request; ``body``: bytes as they are, else JSON."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"content-type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


@pytest.fixture(scope="module")
def reference(model_path):
    """generate() on a copy of the model of its own: (text or ids, chat, max_new_tokens) -> result."""
    model, tok = load(model_path, max_ctx=CTX)

    def run(prompt, chat=False, n=5, **kw):
        if chat:
            prompt = tok.apply_chat_template(prompt)
        return generate(model, prompt, tok, max_new_tokens=n, backend=None, warmup=False, **kw)
    run.tokenizer = tok
    return run


def _user(text):
    return [{"role": "user", "content": text}]


def test_models(client):
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_chat(client, reference):
    want = reference(_user("hello"), chat=True)
    r = client.chat.completions.create(model="tiny", messages=_user("hello"), max_tokens=5, temperature=0)
    assert r.choices[0].message.content == want.text and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length" and r.object == "chat.completion"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(want.prompt_tokens), 5)
    chunks = list(client.chat.completions.create(model="tiny", messages=_user("hello"), max_tokens=5,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 5 and not chunks[-1].choices
    # a second turn: the first turn's prompt is not prefilled again
    convo = _user("hello") + [{"role": "assistant", "content": r.choices[0].message.content}] + _user("the world")
    want2 = reference(convo, chat=True, n=4)
    r2 = client.chat.completions.create(model="tiny", messages=convo, max_tokens=4, temperature=0)
    assert r2.choices[0].message.content == want2.text


def test_completions(client, reference):
    want = reference("hello the world", n=6)
    r = client.completions.create(model="tiny", prompt="hello the world", max_tokens=6, temperature=0)
    assert r.choices[0].text == want.text and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(want.prompt_tokens)
    ids = reference.tokenizer.encode("hello the world")
    streamed = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == want.text
    # OpenAI's default max_tokens for completions: 16
    assert client.completions.create(model="tiny", prompt="hello", temperature=0).usage.completion_tokens == 16


def test_stop_and_seed(client, reference):
    full = reference("hello", n=8)
    stop = full.text[2:4]
    r = client.completions.create(model="tiny", prompt="hello", max_tokens=8, temperature=0, stop=[stop])
    assert r.choices[0].text == full.text[:full.text.index(stop)] and r.choices[0].finish_reason == "stop"
    sampled = [client.completions.create(model="tiny", prompt="hello", max_tokens=6, temperature=1.0, seed=7,
                                         top_p=0.9).choices[0].text for _ in range(2)]
    assert sampled[0] == sampled[1] == reference("hello", n=6, temperature=1.0, seed=7, top_p=0.9).text
    penalised = dict(presence_penalty=1.5, frequency_penalty=0.5)
    r = client.completions.create(model="tiny", prompt="hello", max_tokens=6, temperature=0, **penalised,
                                  extra_body={"repetition_penalty": 1.2, "repeat_last_n": 8})
    want = reference("hello", n=6, repeat_penalty=1.2, repeat_last_n=8, **penalised)
    assert r.choices[0].text == want.text != reference("hello", n=6).text


def test_concurrent_requests_equal_each_alone(client, reference):
    prompts = ["hello", "the world", "hello the", "world hello"]
    alone = [reference(_user(p), chat=True).text if i % 2 else reference(p).text for i, p in enumerate(prompts)]

    def ask(i):
        p = prompts[i]
        if i % 2:
            if i == 3:
                return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                    model="tiny", messages=_user(p), max_tokens=5, temperature=0, stream=True))
            return client.chat.completions.create(model="tiny", messages=_user(p), max_tokens=5,
                                                  temperature=0).choices[0].message.content
        return client.completions.create(model="tiny", prompt=p, max_tokens=5, temperature=0).choices[0].text

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(ask, [0, 1, 2, 3, 1, 0]))
    assert got == [alone[i] for i in [0, 1, 2, 3, 1, 0]]


def _error(e) -> dict:
    return e.value.response.json()["error"]


@pytest.mark.parametrize("kwargs, param", [
    (dict(max_tokens=-1), "max_tokens"), (dict(temperature=2.5), "temperature"), (dict(top_p=0), "top_p"),
    (dict(n=2), "n"), (dict(presence_penalty=2.5), "presence_penalty"), (dict(stop=["x"] * 17), "stop"),
    (dict(extra_body={"logit_bias": {"5": 1}}), "logit_bias"), (dict(extra_body={"min_p": 1.5}), "min_p"),
    (dict(messages=[]), "messages"), (dict(messages=[{"role": "tool", "content": "x"}]), "messages.0.role"),
    (dict(messages=_user("hello " * 80)), "messages"),
])
def test_bad_chat_requests(client, kwargs, param):
    args = dict(model="tiny", messages=_user("hello"), max_tokens=2) | kwargs
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**args)
    err = _error(e)
    assert err["param"] == param and err["message"] and err["type"] == "invalid_request_error"
    if "hello " * 80 in str(kwargs):
        assert err["code"] == "context_length_exceeded" and str(CTX) in err["message"]


def test_other_bad_requests(client, server, reference):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="hello", max_tokens=2)
    assert _error(e)["code"] == "model_not_found" and "tiny" in _error(e)["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=[5, reference.tokenizer.vocab_size], max_tokens=2)
    assert "vocabulary" in _error(e)["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=["a", "b"], max_tokens=2)
    assert "one prompt" in _error(e)["message"]
    port = server[0]
    status, body = _http(port, "POST", "/v1/chat/completions", b'{"model": "tiny", "messages": [')
    assert status == 400 and "JSON" in body["error"]["message"]
    status, body = _http(port, "GET", "/v1/nothing")
    assert status == 404 and body["error"]["message"]
    srv = server[1].state.server
    srv.pending += srv.max_queue            # as if the queue were full
    try:
        status, body = _http(port, "POST", "/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1})
    finally:
        srv.pending -= srv.max_queue
    assert status == 503 and body["error"]["code"] == "server_busy"
    assert _http(port, "GET", "/health") == (200, {"status": "ok"})


def test_disconnect_stops_the_generation(server, client, caplog):
    n = 100
    with caplog.at_level(logging.INFO, logger="dynamo_vulkan.llm.serve"):
        conn = http.client.HTTPConnection("127.0.0.1", server[0], timeout=60)
        body = {"model": "tiny", "prompt": "hello", "max_tokens": n, "temperature": 0, "stream": True}
        conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"content-type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200
        while not ((line := r.readline().decode()).startswith("data:") and json.loads(line[5:])["choices"][0]["text"]):
            assert line, "the stream ended before any text"
        conn.close()                        # the first text came: the generation is under way
        # the next request runs once the worker is free
        client.completions.create(model="tiny", prompt="hello", max_tokens=1, temperature=0)
    done = [r.getMessage() for r in caplog.records if "generated" in r.getMessage()]
    assert len(done) == 2 and done[0].endswith("stop: cancelled"), done
    generated = int(done[0].split(" generated")[0].rsplit(" ", 1)[1])
    assert generated < n


def test_cli(model_path, tmp_path):
    """python -m dynamo_vulkan.serve: arguments checked; a server that answers, stopped."""
    with pytest.raises(SystemExit) as e:
        main([str(model_path), "--port", "70000"])
    assert e.value.code == 2
    assert main([str(tmp_path / "missing.gguf")]) == 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    proc = subprocess.Popen([sys.executable, "-m", "dynamo_vulkan.serve", str(model_path), "--backend", "none",
                             "--port", str(port), "--ctx", "64", "--model-name", "t"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 50
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited with {proc.returncode}: {proc.stdout.read()}")
            assert time.monotonic() < deadline, "the server did not answer"
            try:
                status, models = _http(port, "GET", "/v1/models")
                break
            except ConnectionError:
                time.sleep(0.2)
        assert [m["id"] for m in models["data"]] == ["t"]
        # greedy: with the default temperature (1, unseeded) a sampled first token can be the
        # end of text, and the answer empty
        status, body = _http(port, "POST", "/v1/completions",
                             {"model": "t", "prompt": "hello", "max_tokens": 2, "temperature": 0})
        assert status == 200 and body["usage"]["completion_tokens"] == 2
    finally:
        proc.terminate()
        proc.wait(30)
