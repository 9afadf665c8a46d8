"""IR metrics as BEIR / trec_eval compute them: nDCG@k (graded gains, log2 discount) and Recall@k."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def ndcg_at_k(ranked: Sequence[str], relevant: Mapping[str, int], k: int = 10) -> float:
    dcg = sum(relevant.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked[:k]))
    ideal = sorted(relevant.values(), reverse=True)[:k]
    idcg = sum(g / math.log2(i + 2) for i, g in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k(ranked: Sequence[str], relevant: Mapping[str, int], k: int = 100) -> float:
    rel = {d for d, g in relevant.items() if g > 0}
    return len(rel & set(ranked[:k])) / len(rel) if rel else 0.0


def read_qrels(path: str) -> dict[str, dict[str, int]]:
    """BEIR's TSV (`query-id corpus-id score` with a header) or TREC's 4-column qrels."""
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2].lstrip("-").isdigit():
                q, d, g = parts
            elif len(parts) == 4 and parts[3].lstrip("-").isdigit():
                q, _, d, g = parts
            else:
                continue  # a header
            qrels.setdefault(q, {})[d] = int(g)
    return qrels


def mean_scores(ranked: Mapping[str, Sequence[str]], qrels: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    """nDCG@10 and Recall@100 averaged over the queries of `ranked` that `qrels` judges (BEIR's headline pair),
    with how many were judged; empty when none is."""
    judged = [(q, r) for q, r in ranked.items() if q in qrels]
    if not judged:
        return {}
    return {"judged_queries": len(judged), "ndcg@10": round(sum(ndcg_at_k(r, qrels[q], 10) for q, r in judged) /
                                                            len(judged), 4),
            "recall@100": round(sum(recall_at_k(r, qrels[q], 100) for q, r in judged) / len(judged), 4)}
