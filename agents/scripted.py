"""Scripted DocRead baselines. They act through the env's own tool-call format (so every harness is
exercised the same way) and return canonical token ids with logprob 0.

Answers of the non-oracle readers: they cannot read, so they answer with the title of a document they
read (random reader: a random one of its reads; first-k: the first). HotpotQA answers are often the
title of a paragraph (comparison questions above all), so this is the cheapest non-trivial guess; it
makes these baselines a floor for both reading (support recall) and answering."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from typing import Any

from sleuth.agents.policy import Generation, Request, SamplingParams
from sleuth.envs.parsers import ToolCall, get_parser


class ScriptedReader(ABC):
    name = "scripted"
    version = 0

    def __init__(self, tokenizer: Any, seed: int = 0):
        self.tokenizer = tokenizer
        self.seed = seed
        eos = tokenizer.eos_token_id
        self.eos = eos if isinstance(eos, int) else eos[0]

    @abstractmethod
    def plan(self, req: Request) -> list[int]:
        """Which documents to read, in order."""

    def final_answer(self, req: Request, plan: list[int]) -> str:
        docs = req.task.payload["docs"]
        return docs[plan[0]]["title"] if plan else ""

    def act(self, req: Request) -> ToolCall:
        plan = self.plan(req)
        if req.turn < len(plan):
            return ToolCall("read", {"doc": plan[req.turn]})
        return ToolCall("answer", {"text": self.final_answer(req, plan)})

    def generate(self, requests: list[Request], sampling: SamplingParams) -> list[Generation]:
        out = []
        for req in requests:
            text = get_parser(req.env_info.get("format", "json")).render(self.act(req))
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos]
            out.append(Generation(ids=ids, logprobs=[0.0] * len(ids), text=text, finish_reason="stop"))
        return out


class RandomReader(ScriptedReader):
    """Reads `budget` distinct documents chosen at random (seeded per task), answers a random read title."""

    name = "random"

    def plan(self, req: Request) -> list[int]:
        rng = random.Random(f"{self.seed}:{req.task.id}")
        n = len(req.task.payload["docs"])
        return rng.sample(range(n), min(n, req.env_info.get("budget", 3)))

    def final_answer(self, req: Request, plan: list[int]) -> str:
        rng = random.Random(f"{self.seed}:{req.task.id}:answer")
        return req.task.payload["docs"][rng.choice(plan)]["title"] if plan else ""


class FirstKReader(ScriptedReader):
    """Reads the first k documents in list order (k = the read budget), answers the first title."""

    name = "first-k"

    def plan(self, req: Request) -> list[int]:
        return list(range(min(len(req.task.payload["docs"]), req.env_info.get("budget", 3))))


class OracleReader(ScriptedReader):
    """Reads exactly the gold supporting documents, then answers the gold answer: EM must be 1.0, which
    tests the env, the harness round-trip and the verifier together."""

    name = "oracle"

    def plan(self, req: Request) -> list[int]:
        gold = set(req.task.payload.get("supporting", []))
        return [i for i, d in enumerate(req.task.payload["docs"]) if d["title"] in gold]

    def final_answer(self, req: Request, plan: list[int]) -> str:
        return req.task.answer
