"""Multi-turn chat with a GGUF model, its KV cache kept across turns.

    python -m dynamo_vulkan.chat MODEL [--system TEXT] [--ctx N] [--backend vulkan]
    python -m dynamo_vulkan.generate MODEL -i ...        (the same)

:class:`ChatSession` holds a decoder, its tokenizer and the token ids whose keys and
values its KV cache holds (positions 0..n-1). Each call prefills only the tokens after
the longest prefix it shares with them, at the position where that prefix ends, and
decodes from there (through :func:`dynamo_vulkan.llm.generate.generate`): a chat's next
turn prefills the new turn, and an OpenAI-style request that repeats a conversation
(:mod:`dynamo_vulkan.serve`) reuses what an earlier one computed.

A turn (:meth:`ChatSession.send`) renders the whole conversation with the file's chat
template (``tokenizer.chat_template``). When the rendered text begins with the last
turn's prompt and reply, the conversation's tokens are those the model saw and
generated, followed by the new text's tokens; otherwise (a template that rewrites
earlier turns, a reply cut at a stop string) the rendered text is tokenized anew and
the cache is reused up to the first token that differs.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from dynamo_vulkan import read_back
from dynamo_vulkan.gguf.errors import GGUFError
from .models.decoder import ContextOverflowError

log = logging.getLogger("dynamo_vulkan.llm.chat")

__all__ = ["ChatSession", "NoChatTemplateError", "ContextFullError", "chat_template", "common_prefix",
           "interact", "chat_at_terminal", "main"]


class NoChatTemplateError(GGUFError):
    """The model's file has no chat template (a base model): it has no chat format to follow."""


class ContextFullError(ContextOverflowError):
    """The conversation no longer fits the KV cache."""


def chat_template(tokenizer, source: str = "the GGUF file") -> str:
    """The template a chat with this tokenizer is rendered with: the file's own
    ``tokenizer.chat_template``; where the file has none, the tokenizer's built-in
    Gemma template for Gemma files, with a warning that names it; else
    :class:`NoChatTemplateError` (a base model is not given another family's format)."""
    from .tokenizer import GEMMA_TEMPLATE

    template = tokenizer.chat_template
    if template is None:
        raise NoChatTemplateError(
            f"{source} has no chat template (tokenizer.chat_template): it is likely a base model, "
            "which has no chat format; use plain completion instead (python -m dynamo_vulkan.generate "
            "MODEL --prompt TEXT without --chat, or the server's /v1/completions)")
    if template is GEMMA_TEMPLATE:
        log.warning("%s has no chat template (tokenizer.chat_template); using the built-in Gemma template "
                    "(its architecture is %s)", source, tokenizer.arch)
    return template


def common_prefix(a: list[int], b: list[int]) -> int:
    """The number of leading items a and b share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


@dataclass
class _Turn:
    """The last turn: its prompt's text and ids, and the reply's text and ids."""
    prompt_text: str
    prompt_ids: list[int]
    reply_text: str
    reply_ids: list[int]


class ChatSession:
    """A conversation with one decoder, whose KV cache it owns: the cache is reused
    across calls for the tokens it already holds. One call at a time (a lock).

    ``backend``: torch.compile's backend ("vulkan", "eager", ...) or None (uncompiled).
    ``system``: a system message that begins every conversation."""

    def __init__(self, model, tokenizer, *, backend: str | None = "vulkan", system: str | None = None,
                 name: str = "the GGUF file"):
        self.model = model
        self.tokenizer = tokenizer
        self.backend = backend
        self.system = system
        self.name = name
        self.lock = threading.Lock()
        self.cached: list[int] = []        # ids whose K/V the cache holds, at positions 0..n-1
        self.messages: list[dict] = []
        self._last: _Turn | None = None
        self._warm = False
        self._device_newer = False         # the GPU's copy of the KV cache is newer than the host's
        try:
            self.template: str | None = chat_template(tokenizer, name)
            self.template_error: NoChatTemplateError | None = None
        except NoChatTemplateError as e:
            self.template, self.template_error = None, e
        self.reset()

    @classmethod
    def load(cls, model, *, max_ctx: int | None = None, backend: str | None = "vulkan",
             system: str | None = None, progress: bool = False) -> "ChatSession":
        """A session over a GGUF path or a model name (see generate.find_model)."""
        from .generate import find_model, load

        decoder, tok = load(model, max_ctx=max_ctx, progress=progress)
        return cls(decoder, tok, backend=backend, system=system, name=Path(find_model(model)).name)

    @property
    def max_ctx(self) -> int:
        return self.model.max_ctx

    def reset(self) -> None:
        """Start a new conversation (the cache is reused for any prefix the next one shares)."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self._last = None

    def render(self, messages, add_generation_prompt: bool = True) -> str:
        if self.template is None:
            raise self.template_error
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)

    def complete(self, ids, *, max_new_tokens: int | None = None, **kwargs):
        """generate() for the prompt ``ids`` (a list of token ids), prefilling only those
        after the prefix the KV cache already holds. ``max_new_tokens`` defaults to the
        room left in the context (the stop reason then says "context"); other keyword
        arguments go to generate(), whose result's ``past`` is the number of tokens reused
        and ``prefilled`` the number prefilled."""
        from .generate import generate

        ids = [int(i) for i in ids]
        if not ids:
            raise ValueError("the prompt has no tokens")
        to_the_end = max_new_tokens is None
        if to_the_end:
            max_new_tokens = max(1, self.max_ctx - len(ids))
        with self.lock:
            past = min(common_prefix(self.cached, ids), len(ids) - 1)   # one token at least is prefilled
            if past and self._device_newer:
                # decode steps ran on the GPU, whose copy of the cache the host's is not
                # (keep_on_device); a prefill placed on the host reads the host's
                for cache in self.model.kv_caches():
                    read_back(cache)
            self.cached = []               # unknown until generate() returns
            self._device_newer = self.backend == "vulkan"
            res = generate(self.model, ids, self.tokenizer, backend=self.backend, past=past,
                           max_new_tokens=max_new_tokens, warmup=not self._warm, **kwargs)
            self._warm = True
            # the last write to the cache: a decode step (on the GPU), or the prefill
            # (on the host or the GPU; a GPU prefill's copy stays current there)
            self._device_newer = self.backend == "vulkan" and res.decode_steps > 0
            # generated tokens are fed back one step behind: the last is not in the cache,
            # except after a stop token (which itself is not)
            fed = res.tokens if res.stop_reason == "stop_token" else res.tokens[:-1]
            self.cached = ids + fed
        if to_the_end and res.stop_reason == "max_new_tokens":
            res.stop_reason = "context"    # what max_new_tokens stood for
        return res

    def conversation_ids(self, messages) -> tuple[str, list[int]]:
        """The rendered text of ``messages`` (with the assistant's prompt) and its token
        ids: the last turn's ids and then the new text's where the text extends the last
        turn's prompt and reply, else the text tokenized anew."""
        text = self.render(messages, add_generation_prompt=True)
        last = self._last
        if last is not None:
            head = last.prompt_text + last.reply_text
            if text.startswith(head) and \
                    self.tokenizer.decode(last.reply_ids, skip_special=False) == last.reply_text:
                new = self.tokenizer.encode(text[len(head):], add_special=False)
                return text, last.prompt_ids + last.reply_ids + new
        return text, self.tokenizer.encode(text)

    def send(self, content: str, **kwargs):
        """The assistant's reply to a user message, the conversation's earlier turns in
        context: generate()'s GenerationResult. :class:`ContextFullError` when the
        conversation with this message does not fit (then :meth:`reset`)."""
        messages = self.messages + [{"role": "user", "content": content}]
        text, ids = self.conversation_ids(messages)
        if len(ids) >= self.max_ctx:
            raise ContextFullError(
                f"the conversation with this message has {len(ids)} tokens, and the context holds "
                f"{self.max_ctx}: start a new conversation (/reset), or load the model with a larger "
                f"context (--ctx; the file's is {self.model.config.context_length})")
        res = self.complete(ids, **kwargs)
        self.messages = messages + [{"role": "assistant", "content": res.text}]
        self._last = _Turn(text, ids, res.text, list(res.tokens))
        return res


HELP = """commands: /reset starts a new conversation, /exit (or end of input) quits, /help shows this"""


def interact(session: ChatSession, lines, out, err, *, prompt: str = "> ", stats: bool = False, **kwargs) -> int:
    """The interactive loop: each line of ``lines`` (an iterator of str) is a user
    message, or a command (HELP); replies stream to ``out``, prompts and notes go to
    ``err``. Keyword arguments go to ChatSession.send. Returns the exit code."""
    def note(text):
        err.write(text + "\n")
        err.flush()

    while True:
        if prompt:
            err.write(prompt)
            err.flush()
        line = next(lines, None)
        if line is None:
            if prompt:
                err.write("\n")
            return 0
        line = line.rstrip("\n")
        cmd = line.strip()
        if not cmd:
            continue
        if cmd in ("/exit", "/quit"):
            return 0
        if cmd == "/help":
            note(HELP)
            continue
        if cmd == "/reset":
            session.reset()
            note("[a new conversation]")
            continue
        try:
            res = session.send(line, stream=out, **kwargs)
        except ContextFullError as e:
            note(f"[context full] {e}")
            continue
        except KeyboardInterrupt:
            session.reset()
            note("\n[interrupted: a new conversation]")
            continue
        out.write("\n")
        out.flush()
        if res.stop_reason == "context":
            note(f"[the context of {session.max_ctx} tokens is full: /reset starts a new conversation]")
        if stats:
            note(res.stats_line())


def _lines(stream, prompt: str | None):
    """The user's lines: input(prompt) at a terminal (prompt not None; readline's line
    editing, which must know the prompt to redraw it), else the stream's lines."""
    if prompt is None:
        yield from stream
        return
    try:
        import readline  # noqa: F401  (line editing and history for input())
    except ImportError:
        pass
    while True:
        try:
            yield input(prompt)
        except EOFError:
            return


def chat_at_terminal(model, tokenizer, name: str, *, backend: str | None, system: str | None = None,
                     stats: bool = False, **settings) -> int:
    """The interactive chat over standard input and output (``python -m
    dynamo_vulkan.chat``, ``python -m dynamo_vulkan.generate -i``): a prompt and line
    editing at a terminal, else each line read is a turn. ``settings`` go to generate()."""
    session = ChatSession(model, tokenizer, backend=backend, system=system, name=name)
    if session.template_error is not None:
        raise session.template_error
    tty = sys.stdin.isatty()
    if tty:
        sys.stderr.write(f"{name}: a context of {session.max_ctx} tokens. {HELP}\n")
    return interact(session, _lines(sys.stdin, "> " if tty else None), sys.stdout, sys.stderr, prompt="",
                    stats=stats, **settings)


class HelpWithDefaults(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each option's default, where it has one (not None or off)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def _parser() -> argparse.ArgumentParser:
    from .generate import (KNOWN_MODELS, MAX_CTX, MAX_NEW_TOKENS, _backend_name, _ranged,
                           add_sampling_arguments)

    p = argparse.ArgumentParser(prog="python -m dynamo_vulkan.chat", description=__doc__.split("\n\n")[0],
                                epilog=HELP, formatter_class=HelpWithDefaults)
    p.add_argument("model", help="a .gguf file, or a model name: " + ", ".join(KNOWN_MODELS))
    p.add_argument("--system", default=None, help="a system message that begins each conversation")
    p.add_argument("--ctx", "-c", default=None, help="KV cache size in tokens (default: min(the file's, 2048))",
                   type=_ranged(int, 1, MAX_CTX, f"a whole number from 1 to {MAX_CTX} (and the file's context)"))
    p.add_argument("--backend", default="vulkan", type=_backend_name,
                   help="torch.compile backend: vulkan, eager, ...; 'none': no compile")
    p.add_argument("--max-new-tokens", "-n", default=None,
                   type=_ranged(int, 1, MAX_NEW_TOKENS, f"a whole number from 1 to {MAX_NEW_TOKENS}"),
                   help="at most this many tokens a reply (default: until the context is full)")
    add_sampling_arguments(p)
    p.add_argument("-v", "--verbose", action="count", default=0, help="a stats line after each reply")
    return p


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from .generate import find_model, load, run_cli, sampling_options

    def run() -> int:
        model, tok = load(args.model, max_ctx=args.ctx, progress=sys.stderr.isatty())
        return chat_at_terminal(model, tok, Path(find_model(args.model)).name,
                                backend=None if args.backend == "none" else args.backend,
                                system=args.system, stats=args.verbose > 0, max_new_tokens=args.max_new_tokens,
                                temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                seed=args.seed, **sampling_options(args))
    return run_cli(args.verbose, run)


if __name__ == "__main__":
    sys.exit(main())
