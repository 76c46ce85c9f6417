"""llama.cpp's BPE pre-tokenizers, by the name a GGUF file gives in ``tokenizer.ggml.pre``.

A byte-level BPE vocabulary cuts text into words before it merges bytes; how it cuts is
the pre-tokenizer, a list of regexes applied in turn (each match and each stretch between
matches becomes a word). The regexes are those of llama.cpp's ``llm_tokenizer_bpe``
(``src/llama-vocab.cpp``), themselves the upstream ``tokenizer.json`` patterns with
``(?i:...)`` spelled out. llama.cpp runs a pattern that uses Unicode categories on a
"collapsed" copy of the text in which every non-ASCII code point stands for its category
(letter, number, punctuation, mark, symbol), so ``\\p{Lu}``, ``\\p{Ll}``... all mean
``\\p{L}`` there; the patterns here are written for that meaning.

Names llama.cpp splits with hand-written code (kimi-k2, afmoe, superbpe), runs on a
``std::wregex`` whose ``\\s`` is ASCII-only (deepseek-llm, youtu), or that are not
byte-level BPE (gemma4, sarvam-moe, whitespace, the add-SEP embedding vocabularies) are
not here: :func:`pre_tokenizer` raises for them and for names llama.cpp does not know.
"""

from __future__ import annotations

from dataclasses import dataclass

from dynamo_vulkan.gguf.errors import GGUFError

__all__ = ["PreTokenizer", "pre_tokenizer", "PRE_TOKENIZERS"]

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
# upper-/lower-case runs of letters without \p{Lu}/\p{Ll}: "a letter that is not a-z"
_UPPER = r"((?=[\p{L}])([^a-z]))"
_LOWER = r"((?=[\p{L}])([^A-Z]))"
_CJK_KANA = r"[一-龥぀-ゟ゠-ヿ]+"
_ASCII_PUNCT_WORD = r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+"

_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    "gpt2": (_GPT2,),
    "smollm": (r"\p{N}", _GPT2),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "llama3": (_LLAMA3,),
    "jais2": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)"
              r"|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",),
    "qwen2": (_QWEN2,),
    "qwen35": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "minicpm5": (r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+"),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"),
    "deepseek3": (r"\p{N}{1,3}", _CJK_KANA,
                  _ASCII_PUNCT_WORD + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+"
                  r"|\s+(?!\S)|\s+"),
    "spark2_5": (r"\p{N}{1,3}", _CJK_KANA,
                 _ASCII_PUNCT_WORD + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+",
                 r"\p{N}"),
    "bloom": (r" ?[^(\s|.,!?…。，、।۔،)]+",),
    "viking": (r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"),
    "tekken": (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*|\p{{N}}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "gpt4o": (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
              rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
              r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "chameleon": (r"<sentinel:[0-9]+>", r"(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", r"([\t\n]|    |  )", r"\p{N}",
                  r"[\p{P}!-/:-@\[-`{-~]", _GPT2),
    "bailingmoe": (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",),
    "seed-coder": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                   r"|\s+(?!\S)|\s+",),
    "ufakzeka": (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "laguna": (r"[^\n]+|[\n]+", _QWEN2),
    "exaone-moe": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",),
}


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp tokenizes for one ``tokenizer.ggml.pre`` name."""

    name: str
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word that is itself a token is taken whole (Llama 3)
    add_bos: bool = False  # BOS is added when the file has no tokenizer.ggml.add_bos_token
    has_bos: bool = True  # False: llama.cpp drops the BOS token (ChatGLM)


def _names(family: str, names: str, **flags) -> dict[str, PreTokenizer]:
    return {n: PreTokenizer(n, _REGEXES[family], **flags) for n in names.split()}


# name -> PreTokenizer; the grouping of names and their flags follow llama_vocab::load
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    **_names("default", "default"),
    **_names("llama3", "llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano",
             ignore_merges=True, add_bos=True),
    **_names("llama3", "dbrx smaug-bpe"),
    **_names("llama3", "chatglm-bpe", has_bos=False),
    **_names("llama3", "glm4 glm5", has_bos=False, ignore_merges=True),
    **_names("jais2", "jais-2"),
    **_names("gpt2", "gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert "
                     "exaone4 mpt olmo jais trillion granite-docling"),
    **_names("smollm", "smollm starcoder refact command-r codeshell exaone minerva-7b mellum2"),
    **_names("falcon", "falcon"),
    **_names("qwen2", "qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open"),
    **_names("qwen35", "qwen35"),
    **_names("minicpm5", "minicpm5", ignore_merges=True),
    **_names("deepseek-coder", "deepseek-coder"),
    **_names("deepseek3", "deepseek-v3 hunyuan-dense hy_v4 joyai-llm"),
    **_names("spark2_5", "spark2_5"),
    **_names("bloom", "poro-chat bloom gpt3-finnish"),
    **_names("viking", "viking"),
    **_names("tekken", "tekken", ignore_merges=True, add_bos=True),
    **_names("gpt4o", "gpt-4o llama4 kanana2 talkie minimax-m2"),
    **_names("chameleon", "chameleon", add_bos=True),
    **_names("bailingmoe", "bailingmoe bailingmoe2 llada-moe"),
    **_names("seed-coder", "seed-coder"),
    **_names("ufakzeka", "ufakzeka"),
    **_names("qwen2", "grok-2"),
    **_names("laguna", "laguna"),
    **_names("exaone-moe", "exaone-moe"),
}


def pre_tokenizer(name: str | None, where: str = "") -> PreTokenizer:
    """The pre-tokenizer of a ``tokenizer.ggml.pre`` value; ``None`` (no key) is llama.cpp's
    "default", which the caller should warn about. An unknown name raises, as in llama.cpp."""
    if name is None:
        return PRE_TOKENIZERS["default"]
    pre = PRE_TOKENIZERS.get(name)
    if pre is None:
        raise GGUFError(
            f"{where}: pre-tokenizer {name!r} (tokenizer.ggml.pre) is not supported; its token ids would "
            f"differ from llama.cpp's. Supported: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    return pre
