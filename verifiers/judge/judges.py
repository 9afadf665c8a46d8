"""The two judges. `PointwiseJudge` is a verifier like any other: `(task, response, **context) -> Verdict`.
`GroupJudge` scores the members of one group together, in one call: `score_group(task, responses, contexts)`.
Either can weigh its score with other verifiers' (`weights`); the verdict records what the judge was shown and
what it replied, so a score can always be traced to the words that gave it."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sleuth.verifiers.base import CannotScore, Verdict
from sleuth.verifiers.judge.client import JudgeClient, JudgeStats, Reply
from sleuth.verifiers.judge.config import JudgeConfig, JudgeConfigError
from sleuth.verifiers.judge.prompts import (
    Shown,
    group_messages,
    pointwise_messages,
    rank_rewards,
    ranks,
    read_group,
    read_pointwise,
)

ENV_TERM = "env"  # the weight name of the env's own verdict, where episodes are rescored (`env_verdict` context)


def shown(task: Any, cfg: JudgeConfig) -> Shown:
    """The question and the gold answer of a `Task` or of a task record in its data set's layout."""
    if isinstance(task, Mapping):
        question, answer = task.get("question") or task.get("prompt") or "", task.get("answer")
    else:
        question, answer = task.question, task.answer
    reference = answer if cfg.reference and isinstance(answer, str) and answer else None
    return Shown(str(question), reference)


def _what(cfg: JudgeConfig, response: str, context: Mapping[str, Any]) -> str:
    """What the judge grades: the response, or the episode's transcript where the settings ask and one is given."""
    transcript = context.get("transcript")
    return transcript if cfg.show == "transcript" and isinstance(transcript, str) else response


# how a judge scores the other verifiers its weights name: `rules(name, task, response, **context)` (the registry's
# `verdict`, passed in by the registry, which knows every verifier)
Rules = Callable[..., Verdict]


class _Weighed:
    """The judge's score beside the other verifiers its `weights` name, as their weighted mean."""

    def __init__(self, cfg: JudgeConfig, rules: Rules | None = None):
        self.cfg, self.client, self.rules = cfg, JudgeClient(cfg), rules

    def _combined(self, task: Any, response: str, judged: float, said: dict[str, Any],
                  context: Mapping[str, Any]) -> Verdict:
        terms = self.cfg.rule_terms
        if not terms:
            return Verdict(judged, {"judge": said}, response=response)
        scores, details = {"judge": judged}, {"judge": said}
        for name in terms:
            if name == ENV_TERM:
                env = context.get("env_verdict")
                if not isinstance(env, Verdict):
                    raise JudgeConfigError(f"judge {self.cfg.source}: weights name {ENV_TERM!r} (the env's own "
                                           f"verdict), which exists only where an env's episodes are rescored")
                scores[name], details[name] = env.score, env.details
            else:
                if self.rules is None:
                    raise JudgeConfigError(f"judge {self.cfg.source}: weights name {name!r}: load the judge through "
                                           f"the registry (judge:FILE) to score the verifiers beside it")
                rule_context = {k: v for k, v in context.items() if k == "evidence"}
                v = self.rules(name, task, response, **rule_context)
                scores[name], details[name] = v.score, v.details
        w = self.cfg.weights
        total = sum(w[k] * s for k, s in scores.items()) / sum(w.values())
        return Verdict(total, {**details, "terms": scores, "weights": dict(w)}, response=response)

    def take_stats(self) -> JudgeStats:
        return self.client.take_stats()


def _said(cfg: JudgeConfig, messages: list[dict[str, str]], reply: Reply, **more: Any) -> dict[str, Any]:
    return {"mode": cfg.mode, "model": cfg.model, "prompt": messages[-1]["content"], "reply": reply.text,
            "cached": reply.cached, "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens,
            **more}


class PointwiseJudge(_Weighed):
    def __call__(self, task: Any, response: str, **context: Any) -> Verdict:
        messages = pointwise_messages(self.cfg, shown(task, self.cfg), _what(self.cfg, response, context))
        score, reply = self.client.ask(messages, lambda text: read_pointwise(self.cfg, text))
        return self._combined(task, response, score, _said(self.cfg, messages, reply, score=score), context)

    def score_many(self, task: Any, responses: Sequence[str],
                   contexts: Sequence[Mapping[str, Any]]) -> list[Verdict | Exception]:
        """Each response on its own, `concurrency` calls at a time."""
        return self.client.map(lambda i: self(task, responses[i], **contexts[i]), range(len(responses)))


class GroupJudge(_Weighed):
    def __call__(self, task: Any, response: str, **context: Any) -> Verdict:
        raise CannotScore(f"judge {self.cfg.source} is a group judge: it scores the members of a group together "
                          f"(sleuth train, sleuth eval --samples K, TRL's adapter); set mode: pointwise to score "
                          f"one response at a time")

    def order(self, shown_task: Shown, responses: Sequence[str]) -> list[int]:
        """The order the members are shown in: drawn from the question and the responses (so a re-score asks the
        same prompt and hits the cache), or as given without `shuffle`."""
        idx = list(range(len(responses)))
        if self.cfg.shuffle:
            random.Random(repr((self.cfg.seed, shown_task.question, list(responses)))).shuffle(idx)
        return idx

    def score_group(self, task: Any, responses: Sequence[str],
                    contexts: Sequence[Mapping[str, Any]]) -> list[Verdict]:
        """A verdict per member, from one call that shows them all; `JudgeUnavailable` fails the whole group."""
        s = shown(task, self.cfg)
        order = self.order(s, responses)  # order[k]: the member shown k-th
        what = [_what(self.cfg, responses[i], contexts[i]) for i in order]
        messages = group_messages(self.cfg, s, what)
        shown_scores, reply = self.client.ask(messages, lambda text: read_group(self.cfg, text, len(what)))
        raw = [0.0] * len(responses)
        for k, i in enumerate(order):
            raw[i] = shown_scores[k]
        rewards = rank_rewards(raw) if self.cfg.group_reward == "rank" else raw
        place = ranks(raw)
        out = []
        for i, response in enumerate(responses):
            said = _said(self.cfg, messages, reply, score=raw[i], rank=place[i], shown_as=order.index(i) + 1,
                         group_size=len(responses), group_reward=self.cfg.group_reward)
            out.append(self._combined(task, response, rewards[i], said, contexts[i]))
        return out


def load_judge(path: str, rules: Rules | None = None) -> PointwiseJudge | GroupJudge:
    """The judge whose settings are in `path`; `rules` scores the verifiers its weights name beside it."""
    cfg = JudgeConfig.load(path)
    return GroupJudge(cfg, rules) if cfg.mode == "group" else PointwiseJudge(cfg, rules)
