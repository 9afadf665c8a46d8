"""One tokenisation for every lexical index (both BM25 backends), so their scores are comparable:
lower-case word tokens, English stop words removed, Snowball (Porter 2) stemming — close to the
Lucene English analyzer that BEIR's BM25 baseline used."""

from __future__ import annotations

import re
from functools import lru_cache

_WORD = re.compile(r"\w\w+", re.UNICODE)


@lru_cache(maxsize=1)
def _stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


@lru_cache(maxsize=1)
def _stemmer():
    import Stemmer

    return Stemmer.Stemmer("english")


def tokenize(text: str) -> list[str]:
    stop = _stopwords()
    return _stemmer().stemWords([w for w in _WORD.findall(text.lower()) if w not in stop])


def tokenize_many(texts: list[str]) -> list[list[str]]:
    return [tokenize(t) for t in texts]
