"""An OpenAI-compatible HTTP server for a GGUF model (FastAPI and uvicorn).

    python -m dynamo_vulkan.serve MODEL [--host 127.0.0.1] [--port 8000] [--ctx N] [--backend vulkan]

``GET /v1/models``, ``POST /v1/chat/completions`` and ``POST /v1/completions``, streamed
as server-sent events with ``"stream": true``; ``GET /health``. Besides OpenAI's
settings, requests may give ``top_k``, ``min_p``, ``repetition_penalty`` and
``repeat_last_n`` (presence, frequency and repetition penalties count the last
``repeat_last_n`` tokens of the prompt and the reply, as llama.cpp's do:
:mod:`dynamo_vulkan.sampling`). The model has one KV
cache, so one request generates at a time: requests wait in a queue (at most
``--max-queue``, past that a 503) and run in turn on one worker thread, each reusing
the cache for the prefix its prompt shares with the last one's (a chat's next turn
prefills only what is new: :class:`dynamo_vulkan.llm.chat.ChatSession`). A client that
disconnects stops its generation at the next token. A bad request gets a 4xx answer
with an OpenAI-style body: ``{"error": {"message", "type", "param", "code"}}``.

Needs the ``serve`` extra: ``pip install 'dynamo-vulkan[serve]'``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal, Union

import jinja2

try:
    import uvicorn
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, ConfigDict, Field
    from sse_starlette import EventSourceResponse
    from starlette.exceptions import HTTPException
except ImportError as e:    # the serve extra is not installed
    raise ImportError(f"dynamo_vulkan.serve needs the serve extra ({e.name} is missing): "
                      "pip install 'dynamo-vulkan[serve]'") from e

from .chat import ChatSession, HelpWithDefaults
from dynamo_vulkan.gguf.errors import GGUFError
from .sampling import MAX_REPEAT_PENALTY
from .stop_strings import check_stops

log = logging.getLogger("dynamo_vulkan.llm.serve")

__all__ = ["create_app", "APIError", "main"]

MAX_TEMPERATURE = 2.0              # OpenAI's range
COMPLETION_MAX_TOKENS = 16         # /v1/completions' default max_tokens, as OpenAI's
FINISH = {"stop_token": "stop", "stop_string": "stop", "max_new_tokens": "length", "context": "length"}


class APIError(Exception):
    """An error answered as OpenAI's API does: an HTTP status and {"error": {...}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": self.message, "type": self.type, "param": self.param,
                                       "code": self.code}}, status_code=self.status)


# ---------------------------------------------------------------------- requests

def _number(default, **limits):
    return Field(default, allow_inf_nan=False, **limits)


class _StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    """What both endpoints take. Fields that other servers know and these endpoints do
    not are allowed and ignored (``user``, ...), except those that change the answer
    (checked in :func:`_unsupported`)."""
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = _number(1.0, ge=0.0, le=MAX_TEMPERATURE)
    top_p: float = _number(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, le=1 << 31)               # not OpenAI's; 0: off
    stop: Union[str, list[str], None] = None
    seed: int | None = Field(None, ge=-(1 << 63), le=(1 << 64) - 1)
    stream: bool = False
    stream_options: _StreamOptions | None = None
    n: int = Field(1, ge=1, le=1)                         # one choice per request
    presence_penalty: float = _number(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = _number(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = _number(1.0, gt=0.0, le=MAX_REPEAT_PENALTY)   # these three: not OpenAI's
    repeat_last_n: int = Field(64, ge=-1, le=1 << 20)
    min_p: float = _number(0.0, ge=0.0, le=1.0)
    logit_bias: dict | None = None
    logprobs: Union[bool, int, None] = None


class _Part(BaseModel):
    type: Literal["text"]
    text: str


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[_Part], None] = None


class ChatRequest(_Sampling):
    messages: list[_Message] = Field(min_length=1)


class CompletionRequest(_Sampling):
    prompt: Union[str, list[str], list[int]]
    echo: bool = False
    suffix: str | None = None


def _unsupported(req: _Sampling) -> None:
    """APIError for a setting these endpoints would otherwise ignore, changing the answer."""
    extra = req.model_extra or {}
    fmt = extra.get("response_format")
    checks = [
        ("logit_bias", bool(req.logit_bias)), ("logprobs", bool(req.logprobs)),
        ("top_logprobs", bool(extra.get("top_logprobs"))),
        ("tools", bool(extra.get("tools") or extra.get("functions"))),
        ("response_format", fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text")),
        ("echo", bool(getattr(req, "echo", False))), ("suffix", bool(getattr(req, "suffix", None))),
        ("best_of", extra.get("best_of") not in (None, 1)),
    ]
    for name, used in checks:
        if used:
            raise APIError(400, f"{name} is not supported by this server", param=name, code="unsupported_parameter")


# ---------------------------------------------------------------------- the app

class _Job:
    """One request's generation: its prompt ids and settings, the queue its text goes to,
    and the flag that stops it."""

    def __init__(self, ids: list[int], params: dict, loop: asyncio.AbstractEventLoop):
        self.ids, self.params, self.loop = ids, params, loop
        self.pieces: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.id = uuid.uuid4().hex[:24]

    def emit(self, piece: str) -> None:           # on the worker thread
        self.loop.call_soon_threadsafe(self.pieces.put_nowait, piece)


_END = object()


class _Server:
    """The session, its worker thread and the count of requests waiting for it."""

    def __init__(self, session: ChatSession, model_id: str, aliases, max_queue: int):
        self.session = session
        self.model_id = model_id
        self.names = {model_id, *aliases}
        self.max_queue = max_queue
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="dynamo-vulkan-generate")
        self.pending = 0
        self.lock = threading.Lock()
        self.created = int(time.time())

    def check_model(self, name: str) -> None:
        if name not in self.names:
            raise APIError(404, f"the model {name!r} does not exist; this server has {self.model_id!r}",
                           param="model", code="model_not_found")

    def params(self, req: _Sampling, n_prompt: int, default_max: int | None, prompt_param: str) -> dict:
        """generate()'s settings for a request whose prompt (the field prompt_param) has
        n_prompt tokens; max_tokens past the room left in the context is cut to it."""
        _unsupported(req)
        room = self.session.max_ctx - n_prompt
        if room < 1:
            raise APIError(400, f"the prompt has {n_prompt} tokens, and this model's context holds "
                                f"{self.session.max_ctx}: no room to generate", param=prompt_param,
                           code="context_length_exceeded")
        try:
            stop = check_stops(req.stop)
        except ValueError as e:
            raise APIError(400, str(e), param="stop") from None
        want = req.max_tokens or req.max_completion_tokens or default_max or room
        return dict(max_new_tokens=min(want, room), temperature=req.temperature, top_k=req.top_k,
                    top_p=req.top_p, min_p=req.min_p, seed=req.seed, stop=stop,
                    repeat_penalty=req.repetition_penalty, repeat_last_n=req.repeat_last_n,
                    presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty)

    def _run(self, job: _Job):
        """The generation, on the worker thread; the text's end (or the error) is queued last."""
        try:
            if job.cancelled.is_set():
                return None
            res = self.session.complete(job.ids, stream=job.emit, should_stop=job.cancelled.is_set, **job.params)
            log.info("%s: %d prompt tokens (%d reused), %d generated, stop: %s", job.id, len(job.ids),
                     res.past, len(res.tokens), res.stop_reason)
            return res
        finally:
            job.loop.call_soon_threadsafe(job.pieces.put_nowait, _END)
            with self.lock:
                self.pending -= 1

    def submit(self, job: _Job) -> asyncio.Future:
        with self.lock:
            if self.pending >= self.max_queue:
                raise APIError(503, f"{self.pending} requests are waiting for the model; try again later",
                               type="server_error", code="server_busy")
            self.pending += 1
        return asyncio.wrap_future(self.worker.submit(self._run, job))


async def _until_disconnected(request: Request, job: _Job) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.2)
    job.cancelled.set()


def _usage(job: _Job, res) -> dict:
    return {"prompt_tokens": len(job.ids), "completion_tokens": len(res.tokens),
            "total_tokens": len(job.ids) + len(res.tokens)}


def create_app(session: ChatSession, model_id: str, *, aliases=(), max_queue: int = 64) -> FastAPI:
    """The FastAPI app that serves ``session``'s model under the name ``model_id`` (and
    ``aliases``), with at most ``max_queue`` requests running or waiting."""
    srv = _Server(session, model_id, aliases, max_queue)
    app = FastAPI(title="dynamo-vulkan", docs_url=None, redoc_url=None)
    app.state.server = srv
    tok = session.tokenizer

    @app.exception_handler(APIError)
    async def _api_error(request, e: APIError):
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, e: RequestValidationError):
        err = e.errors()[0]
        where = [str(p) for p in err.get("loc", ()) if p != "body"]
        if err.get("type") == "json_invalid":
            return APIError(400, f"the request body is not valid JSON: {err.get('msg')}").response()
        param = ".".join(where) or None
        return APIError(400, f"{param or 'the request'}: {err.get('msg')}", param=param).response()

    @app.exception_handler(HTTPException)
    async def _http_error(request, e: HTTPException):
        return APIError(e.status_code, str(e.detail), type="invalid_request_error").response()

    @app.exception_handler(Exception)
    async def _failed(request, e: Exception):
        log.error("%s %s failed", request.method, request.url.path, exc_info=e)
        return APIError(500, f"{type(e).__name__}: {e}", type="server_error").response()

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": srv.model_id, "object": "model", "created": srv.created,
                                             "owned_by": "dynamo-vulkan"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest, request: Request):
        srv.check_model(req.model)
        messages = []
        for m in req.messages:
            content = m.content if isinstance(m.content, str) else "".join(p.text for p in m.content or [])
            messages.append({"role": "system" if m.role == "developer" else m.role, "content": content})
        try:
            ids = tok.encode(session.render(messages, add_generation_prompt=True))
        except (GGUFError, ValueError) as e:      # no template, or one that refused these messages
            raise APIError(400, str(e), param="messages") from None
        except jinja2.TemplateError as e:
            raise APIError(400, f"the chat template refused these messages: {e}", param="messages") from None
        return await _answer(request, req, ids, srv.params(req, len(ids), None, "messages"), chat=True)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        srv.check_model(req.model)
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            if len(prompt) != 1:
                raise APIError(400, f"one prompt per request, got {len(prompt)}", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            ids = tok.encode(prompt)
        else:
            ids = list(prompt)
            bad = [i for i in ids if not 0 <= i < tok.vocab_size]
            if bad:
                raise APIError(400, f"token id {bad[0]} is not in the vocabulary (0..{tok.vocab_size - 1})",
                               param="prompt")
        if not ids:
            raise APIError(400, "the prompt has no tokens", param="prompt")
        return await _answer(request, req, ids, srv.params(req, len(ids), COMPLETION_MAX_TOKENS, "prompt"),
                             chat=False)

    async def _answer(request: Request, req: _Sampling, ids: list[int], params: dict, chat: bool):
        job = _Job(ids, params, asyncio.get_running_loop())
        done = srv.submit(job)
        kind = "chat.completion" if chat else "text_completion"
        rid = ("chatcmpl-" if chat else "cmpl-") + job.id
        created = int(time.time())

        def choice(text, finish):
            if chat:
                return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

        def chunk(text=None, finish=None, role=False):
            if chat:
                delta = ({"role": "assistant", "content": ""} if role else {}) | \
                    ({"content": text} if text is not None else {})
                c = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                c = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
            return {"id": rid, "object": kind + ".chunk" if chat else kind, "created": created,
                    "model": srv.model_id, "choices": [c]}

        if not req.stream:
            watch = asyncio.ensure_future(_until_disconnected(request, job))
            try:
                res = await done
            finally:
                watch.cancel()
                job.cancelled.set()
            if res is None or res.stop_reason == "cancelled":
                raise APIError(499, "the client closed the request", type="cancelled")
            return {"id": rid, "object": kind, "created": created, "model": srv.model_id,
                    "choices": [choice(res.text, FINISH[res.stop_reason])], "usage": _usage(job, res)}

        async def events():
            try:
                if chat:
                    yield json.dumps(chunk(role=True))
                while (piece := await job.pieces.get()) is not _END:
                    yield json.dumps(chunk(piece))
                try:
                    res = await done
                except Exception as e:      # reported in the stream: its status is already sent
                    log.exception("%s failed", rid)
                    yield json.dumps({"error": {"message": f"{type(e).__name__}: {e}", "type": "server_error",
                                                "param": None, "code": None}})
                    return
                if res is None:
                    return
                yield json.dumps(chunk(finish=FINISH.get(res.stop_reason, "stop")))
                if req.stream_options is not None and req.stream_options.include_usage:
                    yield json.dumps({"id": rid, "object": kind + ".chunk" if chat else kind, "created": created,
                                      "model": srv.model_id, "choices": [], "usage": _usage(job, res)})
                yield "[DONE]"
            finally:                        # the client gone (the task is cancelled) or the end
                job.cancelled.set()

        return EventSourceResponse(events(), ping=15)

    return app


# ---------------------------------------------------------------------- the command line

def _parser() -> argparse.ArgumentParser:
    from .generate import KNOWN_MODELS, MAX_CTX, _backend_name, _ranged

    p = argparse.ArgumentParser(prog="python -m dynamo_vulkan.serve", description=__doc__.split("\n\n")[0],
                                formatter_class=HelpWithDefaults)
    p.add_argument("model", help="a .gguf file, or a model name: " + ", ".join(KNOWN_MODELS))
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    p.add_argument("--port", default=8000, type=_ranged(int, 0, 65535, "a port number from 0 to 65535"),
                   help="the port to listen on")
    p.add_argument("--ctx", "-c", default=None, help="KV cache size in tokens (default: min(the file's, 2048))",
                   type=_ranged(int, 1, MAX_CTX, f"a whole number from 1 to {MAX_CTX} (and the file's context)"))
    p.add_argument("--backend", default="vulkan", type=_backend_name,
                   help="torch.compile backend: vulkan, eager, ...; 'none': no compile")
    p.add_argument("--model-name", default=None,
                   help="the model's id in the API (default: the file's name without .gguf)")
    p.add_argument("--max-queue", default=64, type=_ranged(int, 1, 1 << 16, "a whole number >= 1"),
                   help="requests running or waiting at once; more are answered 503")
    p.add_argument("--no-warmup", action="store_true",
                   help="compile on the first request instead of before listening")
    p.add_argument("-v", "--verbose", action="count", default=0)
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO - 10 * min(args.verbose, 1), format="%(levelname)s %(name)s: %(message)s")
    from dynamo_vulkan import VulkanFallbackError
    from .generate import ModelNotInstalledError, find_model
    from .models.decoder import ContextOverflowError

    backend = None if args.backend == "none" else args.backend
    try:
        session = ChatSession.load(args.model, max_ctx=args.ctx, backend=backend, progress=sys.stderr.isatty())
        name = args.model_name or Path(find_model(args.model)).name.removesuffix(".gguf")
        if not args.no_warmup:
            log.info("compiling the model for backend %s (--no-warmup: on the first request instead)", backend)
            t0 = time.perf_counter()
            session.complete(session.tokenizer.encode("Hello"), max_new_tokens=2, temperature=0.0)
            log.info("compiled in %.1f s", time.perf_counter() - t0)
    except (GGUFError, ModelNotInstalledError, ContextOverflowError, ValueError, VulkanFallbackError) as e:
        log.error("%s", e)
        return 2
    if session.template_error is not None:
        log.warning("%s; /v1/chat/completions answers 400, /v1/completions works", session.template_error)
    app = create_app(session, name, aliases=[args.model], max_queue=args.max_queue)
    log.info("serving %s as %r on http://%s:%d/v1", session.name, name, args.host, args.port)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning" if args.verbose == 0 else "info")
    return 0


if __name__ == "__main__":
    sys.exit(main())
