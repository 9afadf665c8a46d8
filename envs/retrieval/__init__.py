"""Retrieval: BM25 (bm25s, rank-bm25), dense (faiss + MiniLM), hybrid (RRF); persisted indexes."""
