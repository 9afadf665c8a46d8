"""The reader: a frozen causal LM that scores answers given a question and the documents read so far.

Contexts are rendered with the reader's chat template (documents, then the question; the answer is the
assistant's reply) and scored teacher-forced, many rows per padded forward pass. Scores are cached by
(context, answer), so the contexts a group's trajectories share (the question alone, the same first read)
are scored once, and turn t's "after" is turn t+1's "before" by construction."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sleuth.agents.policies.models import load_causal_lm, resolve_model

INSTRUCTION = "Answer the question with a short phrase, using the documents if any."


class Reader:
    def __init__(self, model: str = "smollm2", device: str | None = None, batch_size: int = 8,
                 max_doc_chars: int = 2000):
        from transformers import AutoTokenizer

        path = resolve_model(model)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        # fp32 on GPU too: gains are differences of answer logprobs, and bf16 logits carry ~0.4% relative error.
        self.model = load_causal_lm(path, torch.float32).to(self.device).eval()
        self.model.requires_grad_(False)
        self.batch_size, self.max_doc_chars = batch_size, max_doc_chars
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.calls = 0  # rows actually run through the model (cache hits excluded)
        self._cache: dict[tuple[str, str], tuple[float, int]] = {}

    def prompt(self, question: str, docs: Sequence[str]) -> str:
        body = "".join(f"Document {i + 1}:\n{d[:self.max_doc_chars]}\n\n" for i, d in enumerate(docs))
        messages = [{"role": "system", "content": INSTRUCTION},
                    {"role": "user", "content": f"{body}Question: {question}"}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def clear_cache(self) -> None:
        """Forget every score (after the weights change)."""
        self._cache.clear()

    def score(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, int]]:
        """(sum of answer-token logprobs, number of answer tokens) for each (prompt, answer)."""
        todo = list(dict.fromkeys(p for p in pairs if p not in self._cache))
        for i in range(0, len(todo), self.batch_size):
            chunk = todo[i:i + self.batch_size]
            for pair, result in zip(chunk, self._forward(chunk), strict=True):
                self._cache[pair] = result
        return [self._cache[p] for p in pairs]

    @torch.no_grad()
    def _forward(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, int]]:
        self.calls += len(pairs)
        rows, spans = [], []
        for prompt, answer in pairs:
            p = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            a = self.tokenizer(answer.strip(), add_special_tokens=False)["input_ids"] or [self.pad_id]
            rows.append(p + a)
            spans.append((len(p), len(p) + len(a)))
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for k, r in enumerate(rows):  # right padding: positions stay 0..n-1 as in an unpadded pass
            ids[k, :len(r)] = torch.tensor(r)
            mask[k, :len(r)] = 1
        logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits.float()
        out = []
        for k, (s, e) in enumerate(spans):
            lp = torch.log_softmax(logits[k, s - 1:e - 1], -1).gather(-1, ids[k, s:e, None].to(logits.device))
            out.append((float(lp.sum()), e - s))
        return out
