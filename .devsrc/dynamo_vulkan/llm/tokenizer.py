"""A tokenizer built from a GGUF file's own vocabulary (``tokenizer.ggml.*``), via
``tokenizers``, giving the token ids llama.cpp gives.

``tokenizer.ggml.model``:

``gpt2``
    Byte-level BPE from the file's tokens and merges, the text first cut into words by the
    pre-tokenizer ``tokenizer.ggml.pre`` names (:mod:`.pretokenizers`: llama.cpp's regexes
    for smollm, llama-bpe, qwen2, deepseek-r1-qwen, gpt-2, ...). A name llama.cpp does not
    know raises :class:`GGUFError`; a file without the key gets llama.cpp's "default"
    pre-tokenizer and a warning.
``llama``
    SentencePiece BPE (Llama 1/2, Mistral, Gemma): the file has tokens and scores but no
    merges. llama.cpp merges any two neighbouring pieces whose concatenation is a token,
    the highest-scoring first; the same merges here are every split of a token into two
    tokens, ranked by the token's score, with byte fallback (``<0xNN>`` pieces). Spaces
    become ``▁``; ``tokenizer.ggml.add_space_prefix`` (default true) prepends one to the
    text and after each special token.

Token types follow llama.cpp: control (3) and unknown (2) tokens are special, matched in
text when ``encode(parse_special=True)`` (a chat template's ``<start_of_turn>``) and
dropped by ``decode(skip_special=True)``; user-defined ones (4) are always matched.
llama.cpp also makes control tokens of normal ones with end-of-generation or
fill-in-the-middle texts (``<|im_end|>``, ``</s>``, ``<|fim_prefix|>``...); so does this,
for every such text the vocabulary holds (llama.cpp takes the first it meets of each
fill-in-the-middle kind). In a model named Phi-3 (``general.name``), whitespace after a
special token is dropped, as llama.cpp does.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from dynamo_vulkan.gguf.errors import GGUFError
from .merges import bpe_merges, first_ids, split_merges, spm_merges
from .pretokenizers import pre_tokenizer

__all__ = ["GGUFTokenizer", "StreamDecoder"]

log = logging.getLogger(__name__)

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

# texts llama.cpp treats as end-of-generation tokens (and so as control tokens)
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
))
# fill-in-the-middle texts llama.cpp makes control tokens; the last three kinds also end generation
_FIM_TEXTS = frozenset((
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>", "\u2581<PRE>",
    "<|code_prefix|>", "<|prefix|>",
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>", "\u2581<SUF>",
    "<|code_suffix|>", "<|suffix|>",
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>", "\u2581<MID>",
    "<|code_middle|>", "<|middle|>",
))
_FIM_EOG_TEXTS = frozenset((
    "<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
    "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
    "<|file_sep|>",
))
# special tokens after which llama.cpp keeps the whitespace in a Phi-3 model's text
_PHI3_KEEP_SPACE = frozenset(("<unk>", "<s>", "<|endoftext|>"))
# gpt-oss's channel markers, which llama.cpp always matches in text and never hides
_ALWAYS_SHOWN = frozenset(("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"))


def _llama_cpp_types(tokens: list[str], types: list[int], first: dict[str, int]) -> tuple[list[int], set[int]]:
    """The token types llama.cpp works with (see the module doc) and its end-of-generation
    ids by text (``first``: each text's first id)."""
    types = list(types)
    # a repeated text: its last id, as llama.cpp's text -> id map keeps
    index = first if len(first) == len(tokens) else dict(zip(tokens, range(len(tokens))))
    eog = set()
    for text in _EOG_TEXTS | _FIM_TEXTS | _FIM_EOG_TEXTS:
        i = index.get(text)
        if i is not None:
            if types[i] != CONTROL:
                types[i] = CONTROL
            if text not in _FIM_TEXTS:
                eog.add(i)
    if "</s>" in index and ("<|tool_response>" in index or "<|plamo:eos|>" in index):
        types[index["</s>"]] = NORMAL  # gemma4, plamo: a plain token there
        eog.discard(index["</s>"])
    has = index.__contains__
    if has("<|end|>") and ((has("<|return|>") and has("<|call|>")) or
                           ((has("<|call|>") or has("<|calls|>")) and has("<|flush|>"))):
        types[index["<|end|>"]] = USER_DEFINED  # gpt-oss, solar-open: <|end|> ends a message only
        eog.discard(index["<|end|>"])
    for text in _ALWAYS_SHOWN:
        if text in index:
            types[index[text]] = USER_DEFINED
    return types, eog


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

@dataclass
class _Meta:
    bos_id: int | None
    eos_id: int | None
    add_bos: bool
    add_eos: bool
    chat_template: str | None
    eog_ids: frozenset = frozenset()
    space_prefix: bool = False  # decode drops the space encode put in front


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
        self._space_prefix = meta.space_prefix
        stop = {meta.eos_id} if meta.eos_id is not None else set()
        self.stop_ids = frozenset(stop | set(meta.eog_ids))

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
        vocab = first_ids(tokens)
        types, eog = _llama_cpp_types(tokens, types, vocab)

        def opt_id(key, default=None):
            v = f.get(key, default)
            return int(v) if v is not None and 0 <= int(v) < n else None

        if kind == "gpt2":
            merges = f.get("tokenizer.ggml.merges", None)
            if merges is None:
                raise GGUFError(f"{f.path}: a gpt2 tokenizer without tokenizer.ggml.merges")
            name = f.get("tokenizer.ggml.pre", None)
            if name is None:
                log.warning("%s: no tokenizer.ggml.pre; using llama.cpp's 'default' pre-tokenizer "
                            "(as llama.cpp does; the file's own tokenizer may cut words differently)", f.path)
            pre = pre_tokenizer(name, str(f.path))
            kwargs = dict(vocab=vocab, fuse_unk=False, byte_fallback=False, ignore_merges=pre.ignore_merges)
            pairs = split_merges(merges)
            try:
                model = models.BPE(merges=pairs, **kwargs) if pairs is not None else None
            except Exception:  # tokenizers refuses a merge of a piece or into a text that is no token
                model = None
            if model is None:  # llama.cpp skips such merges (and keeps a repeated one's first rank)
                model = models.BPE(merges=bpe_merges(merges, vocab), **kwargs)
            tok = Tokenizer(model)
            tok.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
                + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
            )
            tok.decoder = decoders.ByteLevel()
            bos = opt_id("tokenizer.ggml.bos_token_id") if pre.has_bos else None
            eos = opt_id("tokenizer.ggml.eos_token_id")
            default_bos = pre.add_bos
            space_prefix = False
        elif kind == "llama":
            scores = f.get("tokenizer.ggml.scores", None) or [0.0] * n
            # llama.cpp's defaults for SentencePiece files that name no special ids
            bos = opt_id("tokenizer.ggml.bos_token_id", 1)
            eos = opt_id("tokenizer.ggml.eos_token_id", 2)
            unk = opt_id("tokenizer.ggml.unknown_token_id", 0)
            model = models.BPE(vocab=vocab, merges=spm_merges(tokens, scores, vocab), fuse_unk=True, byte_fallback=True,
                               unk_token=tokens[unk] if unk is not None else None)
            tok = Tokenizer(model)
            add_prefix = bool(f.get("tokenizer.ggml.add_space_prefix", True))
            norms = [normalizers.Replace(" ", "\u2581")]
            if add_prefix:
                norms.insert(0, normalizers.Prepend("\u2581"))
            tok.normalizer = normalizers.Sequence(norms)
            tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
            default_bos = True
            space_prefix = add_prefix
        else:
            raise GGUFError(f"{f.path}: tokenizer model {kind!r} is not supported (gpt2, llama)")

        # llama.cpp drops the whitespace after Phi-3's special tokens (by the model's name)
        name = str(f.get("general.name", "")).lower()
        phi3 = "phi-3" in name or "phi3" in name

        kinds = np.asarray(types)

        def added(wanted, special):
            return [AddedToken(tokens[i], special=special, normalized=False,
                               rstrip=phi3 and tokens[i] not in _PHI3_KEEP_SPACE)
                    for i in np.flatnonzero(np.isin(kinds, wanted)).tolist()
                    if vocab.get(tokens[i]) == i and tokens[i]]

        special = added((CONTROL, UNKNOWN), True)
        user = added((USER_DEFINED,), False)
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
            eog_ids=frozenset(eog),
            space_prefix=space_prefix,
        )
        return cls(tok, tokens, types, meta, arch=getattr(f, "architecture", None))

    @classmethod
    def from_file(cls, path) -> "GGUFTokenizer":
        from .reader import open_gguf

        with open_gguf(path, check_architecture=False, header_only=True) as f:
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

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``, as llama.cpp's ``llama_tokenize(text, add_special,
        parse_special)``. ``add_special`` adds BOS/EOS as the file asks (BOS not twice when
        the text already starts with it, as a rendered chat template does);
        ``parse_special`` matches control tokens written in the text (user-defined ones are
        matched either way)."""
        tk = self.tokenizer
        if parse_special:
            ids = tk.encode(text, add_special_tokens=False).ids
        else:
            tk.encode_special_tokens = True
            try:
                ids = tk.encode(text, add_special_tokens=False).ids
            finally:
                tk.encode_special_tokens = False
        if add_special:
            if self.add_bos and not (ids and ids[0] == self.bos_id):
                ids = [self.bos_id] + ids
            if self.add_eos:
                ids = ids + [self.eos_id]
        return ids

    def decode(self, ids, skip_special: bool = True) -> str:
        ids = list(ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=skip_special)
        if self._space_prefix and text.startswith(" "):
            # the space encode prepended sits on the first normal piece ("\u2581Hello")
            shown = [i for i in ids if not (skip_special and self.types[i] in (CONTROL, UNKNOWN))]
            if shown and self.types[shown[0]] == NORMAL and self.tokens[shown[0]].startswith("\u2581"):
                text = text[1:]
        return text

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
