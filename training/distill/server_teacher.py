"""A distillation teacher behind an OpenAI-compatible server that returns prompt logprobs: the teacher off the
student's machine (`algorithm.distill.teacher: http://host:port`).

Each trajectory is sent as token ids (the privileged prefix, then the ids as sampled: nothing is re-tokenised)
to `/v1/completions` with `prompt_logprobs` (vLLM's extension: per prompt position, the logprob of the token
there and of the server's top k), one request per trajectory, several in flight. Before the first rollout the
server is checked: it lists a model, it tokenises a probe text as the student does (vLLM's `/tokenize`; a
server without it cannot be checked and is refused), and it answers prompt logprobs. A request that fails is
retried with backoff (counted under "teacher" in `net.retry_counts()`); one that still fails stops the run
(`TeacherServerError`, one line with `--resume` advice): a step is never trained without its teacher signal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import torch

from sleuth.agents.trajectory import Trajectory
from sleuth.core.errors import ConfigError, InfraFailure
from sleuth.core.net import send_with_retries
from sleuth.tasks.base import Task
from sleuth.training.distill.signal import DistillConfig, TeacherTokens
from sleuth.training.distill.teacher import context_ids, turn_index, unscored

RETRIES, BACKOFF_S = 4, 1.0  # about 15 s of waiting before a teacher server is called dead
CONCURRENCY = 8
# Text whose ids a server must give as the student's tokenizer does: words, digits, whitespace runs, accents
PROBE_TEXT = "Which city hosted the 1908 Olympics?  Ça va, naïve café — 42 tokens\n\tend."


class TeacherServerError(InfraFailure):
    """The teacher server failed after its retries while scoring a step: nothing of that step trained."""


class ServerTeacher:
    """Scores trajectories with the prompt logprobs of the server at `cfg.teacher`."""

    def __init__(self, cfg: DistillConfig, tokenizer: Any, student_name: str):
        self.cfg, self.tokenizer = cfg, tokenizer
        self.url = cfg.teacher.rstrip("/").removesuffix("/v1")
        self.k = cfg.top_k if cfg.needs_topk else 0
        self.http = httpx.Client(timeout=600)
        self.model, self.max_length = self._served_model()
        self._check_tokenizer(student_name)
        probe = tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
        try:
            self._prompt_logprobs(probe)
        except TeacherServerError as e:
            raise ConfigError(f"algorithm.distill.teacher {cfg.teacher}: {e}") from None  # before any rollout

    def context_ids(self, task: Task | None) -> list[int]:
        return context_ids(self.cfg, self.tokenizer, task)

    def score(self, trajs: Sequence[Trajectory], tasks: Mapping[str, Task]) -> list[TeacherTokens]:
        try:
            with ThreadPoolExecutor(CONCURRENCY) as pool:
                return list(pool.map(lambda t: self._score_one(t, self.context_ids(tasks.get(t.task_id))), trajs))
        except TeacherServerError as e:
            raise TeacherServerError(f"{e}; nothing of this step was trained: bring the teacher server back, then "
                                     "rerun with --resume to continue from the last checkpoint") from None

    def _score_one(self, traj: Trajectory, prefix: list[int]) -> TeacherTokens:
        ids = prefix + traj.token_ids()
        if self.max_length is not None and len(ids) > self.max_length:
            return unscored(traj, self.k)
        entries = self._prompt_logprobs(ids)
        mask = traj.loss_mask()
        n = len(mask)
        lp, top_ids, top_lp = torch.zeros(n), torch.zeros((n, self.k), dtype=torch.long), torch.zeros((n, self.k))
        for i in (i for i in range(1, n) if mask[i]):
            entry = entries[len(prefix) + i]
            lp[i] = float(entry[str(ids[len(prefix) + i])]["logprob"])
            if self.k:
                ranked = sorted(((v["rank"], int(t), float(v["logprob"])) for t, v in entry.items()))[:self.k]
                if len(ranked) < self.k:
                    raise TeacherServerError(f"the teacher server at {self.url} gave {len(ranked)} top logprobs for "
                                             f"a position, {self.k} asked (algorithm.distill.top_k)")
                top_ids[i] = torch.tensor([t for _, t, _ in ranked])
                top_lp[i] = torch.tensor([v for _, _, v in ranked])
        return TeacherTokens(lp, torch.tensor(mask, dtype=torch.float32), torch.from_numpy(turn_index(traj)),
                             top_ids if self.k else None, top_lp if self.k else None)

    def _prompt_logprobs(self, ids: list[int]) -> list[dict[str, Any]]:
        """Per position of `ids`, {token id: {"logprob", "rank"}} for the token there and the server's top k."""
        body = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 1.0,
                "prompt_logprobs": self.k}
        what = f"POST {self.url}/v1/completions"
        try:
            resp = send_with_retries(lambda: self.http.post(f"{self.url}/v1/completions", json=body), kind="teacher",
                                     what=what, retries=RETRIES, backoff_s=BACKOFF_S)
        except httpx.TransportError as e:
            raise TeacherServerError(f"the teacher server at {self.url} failed ({e})") from None
        if resp.status_code != 200:
            raise TeacherServerError(f"the teacher server at {self.url} answered {resp.status_code} to {what} "
                                     f"({resp.text[:200]!r})")
        try:
            entries = resp.json()["choices"][0]["prompt_logprobs"]
        except (KeyError, IndexError, TypeError, ValueError):
            entries = None
        if not isinstance(entries, list) or len(entries) != len(ids):
            raise TeacherServerError(f"the teacher server at {self.url} returns no prompt logprobs (its answer to "
                                     f"{what} with prompt_logprobs has none for the {len(ids)} prompt tokens): serve "
                                     "the teacher with vLLM or another server that returns them")
        return entries

    def _get(self, path: str) -> httpx.Response:
        try:
            resp = send_with_retries(lambda: self.http.get(f"{self.url}{path}"), kind="teacher",
                                     what=f"GET {self.url}{path}", retries=RETRIES, backoff_s=BACKOFF_S)
        except httpx.TransportError as e:
            raise ConfigError(f"algorithm.distill.teacher {self.cfg.teacher}: cannot reach the server ({e})") from None
        return resp

    def _served_model(self) -> tuple[str, int | None]:
        resp = self._get("/v1/models")
        try:
            model = resp.json()["data"][0]
            return str(model["id"]), model.get("max_model_len")
        except (KeyError, IndexError, TypeError, ValueError):
            raise ConfigError(f"algorithm.distill.teacher {self.cfg.teacher}: /v1/models lists no served model "
                              f"(answered {resp.status_code}): is it an OpenAI-compatible server?") from None

    def _check_tokenizer(self, student_name: str) -> None:
        """The server's ids for PROBE_TEXT must be the student's: the sampled ids must mean the same strings."""
        ours = self.tokenizer.encode(PROBE_TEXT, add_special_tokens=False)
        try:
            resp = send_with_retries(
                lambda: self.http.post(f"{self.url}/tokenize", json={"model": self.model, "prompt": PROBE_TEXT,
                                                                      "add_special_tokens": False}),
                kind="teacher", what=f"POST {self.url}/tokenize", retries=RETRIES, backoff_s=BACKOFF_S)
            theirs = resp.json()["tokens"]
        except (httpx.TransportError, KeyError, TypeError, ValueError):
            raise ConfigError(f"algorithm.distill.teacher {self.cfg.teacher}: the server has no /tokenize, so its "
                              f"vocabulary cannot be checked against the student's ({student_name}); serve the "
                              "teacher with vLLM, or load it in the trainer (a model directory)") from None
        if theirs != ours:
            raise ConfigError(f"algorithm.distill.teacher {self.cfg.teacher} (serving {self.model}) tokenises text "
                              f"otherwise than the student {student_name} ({len(theirs)} ids against {len(ours)}): "
                              "cross-tokenizer distillation is not supported; serve a teacher with the student's "
                              "tokenizer")
