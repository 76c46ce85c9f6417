"""A tokenizer built from a GGUF file's own vocabulary (``tokenizer.ggml.*``), via ``tokenizers``.

``tokenizer.ggml.model``:

``gpt2``
    Byte-level BPE from the file's tokens and merges; the pre-tokenizer regexes follow
    llama.cpp's for ``tokenizer.ggml.pre`` (smollm, llama-bpe/llama3, qwen2, gpt2, ...).
``llama``
    SentencePiece BPE (Llama 1/2, Mistral, Gemma): the file has tokens and scores but no
    merges; merges are derived from the vocabulary, ranked by the merged piece's score
    (what llama.cpp's SPM tokenizer merges by), with byte fallback (``<0xNN>`` pieces).
    Spaces become ``▁``; ``tokenizer.ggml.add_space_prefix`` (default true) prepends one.

Control tokens (type 3) are special tokens: matched in text (a chat template's
``<start_of_turn>``) and dropped by ``decode(skip_special=True)``; user-defined ones
(type 4) are matched in text too.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from .errors import GGUFError

__all__ = ["GGUFTokenizer", "StreamDecoder"]

log = logging.getLogger(__name__)

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> (regexes applied in turn, ignore_merges)
_PRE = {
    "default": ([_GPT2], False),
    "gpt2": ([_GPT2], False),
    "gpt-2": ([_GPT2], False),
    "smollm": ([r"\p{N}", _GPT2], False),
    "llama3": ([_LLAMA3], True),
    "llama-v3": ([_LLAMA3], True),
    "llama-bpe": ([_LLAMA3], True),
    "smaug-bpe": ([_LLAMA3], True),
    "qwen2": ([_QWEN2], False),
}

# a Gemma chat template for files that carry none (llama.cpp also has it built in)
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

_STOP_PIECES = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<|eom_id|>")


def _spm_merges(tokens: list[str], types: list[int], scores: list[float]) -> list[tuple[str, str]]:
    """Merges of a SentencePiece BPE vocabulary: every split of a piece into two pieces,
    ranked by the merged piece's score (highest first)."""
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    cand = []
    for i, t in enumerate(tokens):
        if len(t) < 2 or types[i] not in (NORMAL, USER_DEFINED) or vocab.get(t) != i:
            continue
        s = scores[i]
        for k in range(1, len(t)):
            a = vocab.get(t[:k])
            if a is None:
                continue
            b = vocab.get(t[k:])
            if b is None:
                continue
            cand.append((-s, i, a, b))
    cand.sort()
    return [(tokens[a], tokens[b]) for _, _, a, b in cand]


@dataclass
class _Meta:
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    chat_template: str | None


class GGUFTokenizer:
    """``encode``/``decode``/``apply_chat_template`` over a ``tokenizers.Tokenizer``."""

    def __init__(self, tokenizer, tokens: list[str], types: list[int], meta: _Meta, arch: str | None = None):
        self.tokenizer = tokenizer
        self.tokens = tokens
        self.types = types
        self.bos_id = meta.bos_id
        self.eos_id = meta.eos_id
        self.add_bos = meta.add_bos
        self.add_eos = meta.add_eos
        self.arch = arch
        self._chat_template = meta.chat_template
        stop = {meta.eos_id} if meta.eos_id is not None else set()
        for i, t in enumerate(tokens):
            if t in _STOP_PIECES and types[i] == CONTROL:
                stop.add(i)
        self.stop_ids = frozenset(stop)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_gguf(cls, f) -> "GGUFTokenizer":
        try:
            from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
        except ImportError as e:  # a dependency of the package; say so plainly
            raise ImportError("the GGUF tokenizer needs the 'tokenizers' package: pip install tokenizers") from e

        kind = f.get("tokenizer.ggml.model", None)
        if kind is None:
            raise GGUFError(f"{f.path}: no tokenizer in the file (tokenizer.ggml.model missing)")
        tokens = f.get("tokenizer.ggml.tokens")
        n = len(tokens)
        types = f.get("tokenizer.ggml.token_type", None) or [NORMAL] * n
        if len(types) != n:
            raise GGUFError(f"{f.path}: {len(types)} token types for {n} tokens")
        vocab: dict[str, int] = {}
        for i, t in enumerate(tokens):
            vocab.setdefault(t, i)

        def opt_id(key):
            v = f.get(key, None)
            return int(v) if v is not None and 0 <= int(v) < n else None

        bos, eos, unk = opt_id("tokenizer.ggml.bos_token_id"), opt_id("tokenizer.ggml.eos_token_id"), opt_id("tokenizer.ggml.unknown_token_id")

        if kind == "gpt2":
            merges = f.get("tokenizer.ggml.merges", None)
            if merges is None:
                raise GGUFError(f"{f.path}: a gpt2 tokenizer without tokenizer.ggml.merges")
            pre = f.get("tokenizer.ggml.pre", "default")
            if pre not in _PRE:
                log.warning("%s: pre-tokenizer %r not known here; using GPT-2's", f.path, pre)
            regexes, ignore_merges = _PRE.get(pre, _PRE["default"])
            pairs = [tuple(m.split(" ", 1)) for m in merges]
            kwargs = dict(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
            try:
                model = models.BPE(ignore_merges=ignore_merges, **kwargs)
            except TypeError:  # older tokenizers
                model = models.BPE(**kwargs)
            tok = Tokenizer(model)
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
                + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
            )
            tok.decoder = decoders.ByteLevel()
            default_bos = False
        elif kind == "llama":
            scores = f.get("tokenizer.ggml.scores", None) or [0.0] * n
            merges = _spm_merges(tokens, types, scores)
            unk_piece = tokens[unk] if unk is not None else None
            model = models.BPE(vocab=vocab, merges=merges, unk_token=unk_piece, fuse_unk=True, byte_fallback=True)
            tok = Tokenizer(model)
            add_prefix = bool(f.get("tokenizer.ggml.add_space_prefix", True))
            norms = [normalizers.Replace(" ", "\u2581")]
            if add_prefix:
                norms.insert(0, normalizers.Prepend("\u2581"))
            tok.normalizer = normalizers.Sequence(norms)
            dec = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
            if add_prefix:
                dec.append(decoders.Strip(" ", 1, 0))
            tok.decoder = decoders.Sequence(dec)
            default_bos = True
        else:
            raise GGUFError(f"{f.path}: tokenizer model {kind!r} is not supported (gpt2, llama)")

        special = [AddedToken(tokens[i], special=True, normalized=False)
                   for i in range(n) if types[i] == CONTROL and vocab.get(tokens[i]) == i and tokens[i]]
        user = [AddedToken(tokens[i], special=False, normalized=False)
                for i in range(n) if types[i] == USER_DEFINED and vocab.get(tokens[i]) == i and tokens[i]]
        if special:
            tok.add_special_tokens(special)
        if user:
            tok.add_tokens(user)

        meta = _Meta(
            bos_id=bos,
            eos_id=eos,
            add_bos=bool(f.get("tokenizer.ggml.add_bos_token", default_bos)) and bos is not None,
            add_eos=bool(f.get("tokenizer.ggml.add_eos_token", False)) and eos is not None,
            chat_template=f.get("tokenizer.chat_template", None),
        )
        return cls(tok, tokens, types, meta, arch=getattr(f, "architecture", None))

    @classmethod
    def from_file(cls, path) -> "GGUFTokenizer":
        from .reader import open_gguf

        with open_gguf(path, check_architecture=False) as f:
            return cls.from_gguf(f)

    # ------------------------------------------------------------------ use
    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def bos_token(self) -> str:
        return self.tokens[self.bos_id] if self.bos_id is not None else ""

    @property
    def eos_token(self) -> str:
        return self.tokens[self.eos_id] if self.eos_id is not None else ""

    def token_to_id(self, piece: str) -> int | None:
        return self.tokenizer.token_to_id(piece)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special`` adds BOS/EOS as the file asks (BOS not
        twice when the text already starts with it, as a rendered chat template does)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if add_special:
            if self.add_bos and not (ids and ids[0] == self.bos_id):
                ids = [self.bos_id] + ids
            if self.add_eos:
                ids = ids + [self.eos_id]
        return ids

    def decode(self, ids, skip_special: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special)

    @property
    def chat_template(self) -> str | None:
        if self._chat_template:
            return self._chat_template
        if self.arch in ("gemma3", "gemma2", "gemma") or self.token_to_id("<start_of_turn>") is not None:
            return GEMMA_TEMPLATE
        return None

    def apply_chat_template(self, messages, add_generation_prompt: bool = True) -> str:
        """Render the file's ``tokenizer.chat_template`` (jinja2) for ``messages``
        (a list of ``{"role", "content"}``, or one user prompt as a string)."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        template = self.chat_template
        if template is None:
            raise GGUFError("this GGUF file has no chat template (tokenizer.chat_template)")
        from .chat_template import render   # jinja2's sandbox, with bounded time and memory

        return render(template, messages=messages, add_generation_prompt=add_generation_prompt,
                      bos_token=self.bos_token, eos_token=self.eos_token)


class StreamDecoder:
    """Incremental detokenization: ``push(id)`` returns the new text (possibly empty while
    a multi-byte character is incomplete)."""

    def __init__(self, tokenizer: GGUFTokenizer, skip_special: bool = True):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.text = ""
        self.skip_special = skip_special

    def push(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        text = self.tok.decode(self.ids, self.skip_special)
        if text.endswith("\ufffd"):
            return ""
        new = text[len(self.text):] if text.startswith(self.text) else text
        self.text = text
        return new

    def flush(self) -> str:
        text = self.tok.decode(self.ids, self.skip_special)
        new = text[len(self.text):] if text.startswith(self.text) else ""
        self.text = text
        return new
