"""The ranked merges a ``tokenizers`` BPE model needs, from a GGUF vocabulary.

A SentencePiece vocabulary (``tokenizer.ggml.model == "llama"``) has no merges: they are
every split of a token into two tokens (262k tokens hold ~1.2M splits). Splits are
checked a token length at a time with numpy (the tokens of one length as rows of code
points, each cut compared with the sorted tokens of its length); the few long tokens go
through plain Python.
"""

from __future__ import annotations

import operator
from itertools import repeat

import numpy as np

__all__ = ["first_ids", "spm_merges", "split_merges", "bpe_merges"]

# tokens of more characters than this, or of a length fewer tokens share, are split in Python
_VECTOR_MAX_LEN = 24
_VECTOR_MIN_ROWS = 64


def first_ids(tokens: list[str]) -> dict[str, int]:
    """Each distinct token text and its lowest id (llama.cpp keeps the first)."""
    return dict(zip(reversed(tokens), range(len(tokens) - 1, -1, -1)))


def _pick(items: list, index: np.ndarray) -> list:
    """``[items[i] for i in index]``, at C speed."""
    if len(index) == 0:
        return []
    if len(index) == 1:
        return [items[int(index[0])]]
    return list(operator.itemgetter(*index.tolist())(items))


class _SameLength:
    """The distinct tokens of one length as rows of code points, with a membership test
    for other rows of that length: a hash of each row finds the one candidate, and the
    candidate's code points are compared, so the answer is exact. Where two tokens share
    a hash, the unicode texts themselves are compared instead."""

    def __init__(self, texts: np.ndarray):
        self.texts = texts
        self.cps = texts.view(np.uint32).reshape(len(texts), -1)
        keys = _row_keys(self.cps)
        self.perm = np.argsort(keys)
        self.keys = keys[self.perm]
        self.unique = not bool(np.any(self.keys[1:] == self.keys[:-1]))
        self.sorted_texts = None if self.unique else np.sort(texts)

    def contains(self, rows: np.ndarray) -> np.ndarray:
        """Which of ``rows`` (code points, one row per text of this length) are tokens."""
        if not self.unique:  # numpy compares fixed-width texts of one true length exactly
            queries = np.ascontiguousarray(rows).view(self.texts.dtype).ravel()
            pos = np.searchsorted(self.sorted_texts, queries)
            pos[pos == len(self.sorted_texts)] = 0
            return self.sorted_texts[pos] == queries
        keys = _row_keys(rows)
        pos = np.searchsorted(self.keys, keys)
        pos[pos == len(self.keys)] = 0
        hit = self.keys[pos] == keys
        at = np.flatnonzero(hit)
        hit[at] = np.all(self.cps[self.perm[pos[at]]] == rows[at], axis=1)
        return hit


# odd 64-bit multipliers of a row's code points (a linear hash, wrapping at 2^64)
_MULTIPLIERS = np.random.default_rng(0x9E3779B9).integers(1, 1 << 63, _VECTOR_MAX_LEN, np.uint64) * 2 + 1


def _row_keys(rows: np.ndarray) -> np.ndarray:
    return (rows.astype(np.uint64) * _MULTIPLIERS[:rows.shape[1]]).sum(axis=1, dtype=np.uint64)


def spm_merges(tokens: list[str], scores: list[float], vocab: dict[str, int] | None = None) -> list[tuple[str, str]]:
    """Merges of a SentencePiece vocabulary, as llama.cpp's SPM tokenizer merges: every
    split of a token (of any type) into two tokens, ranked by the token's score, highest
    first (ties: the lower token id, then the shorter left part). ``vocab``: first_ids(tokens),
    where the caller has it."""
    vocab = first_ids(tokens) if vocab is None else vocab
    texts = list(vocab)
    lens = np.fromiter(map(len, texts), np.int64, len(texts))

    by_len: dict[int, np.ndarray] = {}     # length -> indices into texts
    order = np.argsort(lens, kind="stable")
    bounds = np.searchsorted(lens[order], np.arange(lens.max(initial=0) + 2))
    for m in range(1, len(bounds) - 1):
        if bounds[m + 1] > bounds[m]:
            by_len[m] = order[bounds[m]:bounds[m + 1]]
    groups = {m: _SameLength(np.array(_pick(texts, idx), dtype=f"<U{m}"))
              for m, idx in by_len.items() if m <= _VECTOR_MAX_LEN}

    cand_rows, cand_k = [], []             # a split: the text's index and the left part's length
    python_rows = []
    for m, idx in by_len.items():
        if m < 2:
            continue
        if m not in groups or len(idx) < _VECTOR_MIN_ROWS:
            python_rows.extend(idx.tolist())
            continue
        cps = groups[m].cps
        for k in range(1, m):
            if k not in groups or m - k not in groups:
                continue
            rows = np.flatnonzero(groups[k].contains(cps[:, :k]))
            if len(rows):
                rows = rows[groups[m - k].contains(cps[rows, k:])]
                cand_rows.append(idx[rows])
                cand_k.append(np.full(len(rows), k, np.int64))
    py_rows, py_k = [], []
    for j in python_rows:
        t = texts[j]
        for k in range(1, len(t)):
            if t[:k] in vocab and t[k:] in vocab:
                py_rows.append(j)
                py_k.append(k)
    cand_rows.append(np.array(py_rows, np.int64))
    cand_k.append(np.array(py_k, np.int64))
    rows, ks = np.concatenate(cand_rows), np.concatenate(cand_k)
    ids = np.fromiter(vocab.values(), np.int64, len(vocab))[rows]
    rank = np.lexsort((ks, ids, -np.asarray(scores, np.float64)[ids]))
    # the pieces are cut in rank order, the order tokenizers reads them in: strings made
    # one after another lie together in memory, which it reads faster
    ordered, ks = _pick(texts, rows[rank]), ks[rank].tolist()
    left = list(map(operator.getitem, ordered, map(slice, ks)))
    right = list(map(operator.getitem, ordered, map(slice, ks, repeat(None))))
    return list(zip(left, right))


def split_merges(merges: list[str]) -> list[tuple[str, str]] | None:
    """``tokenizer.ggml.merges`` as pairs where cutting each at its first space is llama.cpp's
    cut and no merge repeats (so the ranks are llama.cpp's), else None. The pieces are not
    checked: ``tokenizers`` refuses a merge whose pieces or result are not tokens, and
    bpe_merges then drops those as llama.cpp does."""
    if not merges:
        return []
    if len(set(merges)) != len(merges) or set(map(str.count, merges, repeat(" "))) != {1}:
        return None
    pieces = " ".join(merges).split(" ")     # one space in each: left, right, left, right, ...
    lefts = pieces[0::2]
    if not all(lefts):                        # a merge that starts with its space
        return None
    return list(zip(lefts, pieces[1::2]))


def bpe_merges(merges: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """``tokenizer.ggml.merges`` as pairs, split as llama.cpp does (at the first space after
    the first character); a repeated pair keeps its first rank, and pairs whose pieces or
    result are not tokens (which could never merge) are left out."""
    seen = set()
    pairs = []
    for m in merges:
        k = m.find(" ", 1)
        if k < 0:
            continue
        pair = (m[:k], m[k + 1:])
        if pair in seen or pair[0] not in vocab or pair[1] not in vocab or pair[0] + pair[1] not in vocab:
            continue
        seen.add(pair)
        pairs.append(pair)
    return pairs
