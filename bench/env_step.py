"""Per-step overhead of a sleuth env against what a user would otherwise write, measured side by side.

Run: `make bench` (or `.venv/bin/python bench/env_step.py`). Prints medians in µs and ratios.

Contenders, all doing the same work on the same real HotpotQA task (parse a Hermes tool call, read a
document, return its text):
- sleuth DocReadEnv, raw and through `sleuth.make` (gymnasium's order-enforcing wrapper; the passive
  checker is off);
- the same tool written as a skyrl-gym `BaseTextEnv` (if `skyrl-gym` is installed: `pip install .[bench]`);
- a bare gymnasium env that only echoes (the floor: no parsing, no tool).
Plus the agent loop's own cost per turn (chat rendering of the observation, bookkeeping) with the
scripted oracle policy, split from the time spent inside the policy and the env.
"""

from __future__ import annotations

import json
import re
import statistics
import time

import gymnasium
from common import publish

import sleuth
from sleuth.agents.chat import ChatRenderer
from sleuth.envs import DocReadEnv, TextSpace
from sleuth.envs.outcome import reset_info
from sleuth.tasks import load_tasks, qa_docs

ROUNDS, STEPS = 7, 2000
ACTION = '<tool_call>{"name": "read", "arguments": {"doc": 4}}</tool_call>'


class Echo(gymnasium.Env):
    observation_space = action_space = TextSpace(max_length=1 << 20)

    def reset(self, *, seed=None, options=None):
        return "", {}

    def step(self, action):
        return action, 0.0, False, False, {}


def skyrl_env(task):
    try:
        from skyrl_gym.envs.base_text_env import BaseTextEnv
    except ImportError:
        return None

    class SkyDocRead(BaseTextEnv):
        """The DocRead read tool as a skyrl-gym env (Hermes parsing written by hand, as its examples do)."""

        def __init__(self, docs):
            super().__init__()
            self.docs, self.max_turns = docs, 10**9

        def step(self, action):
            self.turns += 1
            m = re.search(r"<tool_call>(.*?)</tool_call>", action, re.S)
            call = json.loads(m.group(1))
            d = self.docs[int(call["arguments"]["doc"])]
            obs = [{"role": "user", "content": f"[{call['arguments']['doc']}] {d.title}\n{d.text}"}]
            return {"observations": obs, "reward": 0.0, "done": False, "metadata": {}}

    return SkyDocRead(qa_docs(task).docs)


def time_steps(step, reset) -> float:
    """Median µs per step over ROUNDS rounds of STEPS steps (reset every 3 steps, outside the clock)."""
    rounds = []
    for _ in range(ROUNDS):
        total = 0.0
        for i in range(STEPS):
            if i % 3 == 0:
                reset()
            t0 = time.perf_counter()
            step(ACTION)
            total += time.perf_counter() - t0
        rounds.append(total / STEPS * 1e6)
    return statistics.median(rounds)


def retokenise_per_turn(tasks, tokenizer) -> float:
    """µs per turn for the common alternative: re-render the whole conversation with the chat template and
    re-tokenise it before every generation (what a messages-in loop without token-in/token-out does)."""
    from sleuth.agents.loop.episodes import run_episodes
    from sleuth.agents.policies.load import load_policy

    trajs = list(run_episodes(lambda: DocReadEnv(), tasks, load_policy("oracle"), concurrency=16))
    convos = []
    for task, traj in zip(tasks, sorted(trajs, key=lambda t: [x.id for x in tasks].index(t.task_id)), strict=True):
        msgs = reset_info(DocReadEnv().reset(options={"task": task})[1]).messages
        for turn in traj.turns:
            convos.append(list(msgs))
            msgs = msgs + [{"role": "assistant", "content": turn.action_text},
                           {"role": "tool", "content": turn.observation}]
    t0 = time.perf_counter()
    for msgs in convos:
        tokenizer.encode(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True),
                         add_special_tokens=False)
    return (time.perf_counter() - t0) / len(convos) * 1e6


def loop_overhead(tasks) -> dict[str, float]:
    from sleuth.agents.loop.episodes import run_episodes
    from sleuth.agents.policies.load import load_policy

    policy = load_policy("oracle")
    spent = {"policy": 0.0, "env": 0.0}
    generate = policy.generate

    def timed_generate(reqs, sampling):
        t0 = time.perf_counter()
        out = generate(reqs, sampling)
        spent["policy"] += time.perf_counter() - t0
        return out

    policy.generate = timed_generate
    spent["tokenise"] = 0.0
    originals = {name: getattr(ChatRenderer, name) for name in ("prompt_ids", "observation_ids")}

    def timed(fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            spent["tokenise"] += time.perf_counter() - t0
            return out

        return wrapper

    for name, fn in originals.items():
        setattr(ChatRenderer, name, timed(fn))

    class TimedEnv(gymnasium.Wrapper):
        def step(self, action):
            t0 = time.perf_counter()
            out = self.env.step(action)
            spent["env"] += time.perf_counter() - t0
            return out

    t0 = time.perf_counter()
    try:
        trajs = list(run_episodes(lambda: TimedEnv(DocReadEnv()), tasks, policy, concurrency=16))
    finally:
        for name, fn in originals.items():
            setattr(ChatRenderer, name, fn)
    total = time.perf_counter() - t0
    turns = sum(len(t.turns) for t in trajs)
    per = {k: v / turns * 1e6 for k, v in spent.items()}
    return {"turns": turns, "total_us": total / turns * 1e6, **{f"{k}_us": v for k, v in per.items()},
            "loop_us": (total - sum(spent.values())) / turns * 1e6}


def main() -> None:
    task = load_tasks("hotpotqa:test", limit=1)[0]
    raw = DocReadEnv(harness="json", budget=10**9)
    made = sleuth.make("DocRead-v0", harness="json", budget=10**9)
    echo = Echo()
    results = {
        "sleuth DocRead (raw)": time_steps(raw.step, lambda: raw.reset(options={"task": task})),
        "sleuth DocRead (sleuth.make)": time_steps(made.step, lambda: made.reset(options={"task": task})),
        "gymnasium echo env (floor)": time_steps(echo.step, echo.reset),
    }
    sky = skyrl_env(task)
    if sky is not None:
        results["skyrl-gym DocRead equivalent"] = time_steps(sky.step, lambda: None)
    base = results["sleuth DocRead (raw)"]
    lines = ["| env | µs/step (median) | ratio to sleuth raw |", "|---|---|---|"]
    lines += [f"| {k} | {v:.2f} | {v / base:.2f} |" for k, v in results.items()]
    if sky is None:
        lines.append("| skyrl-gym | not installed (`pip install .[bench]`) | |")
    distinct = load_tasks("hotpotqa:test", limit=200)
    grouped = [t for t in distinct[:25] for _ in range(8)]  # GRPO-style: 8 samples per task
    lines += ["", "Agent loop per turn (µs), scripted oracle policy, 200 episodes, concurrency 16:", "",
              "| episodes | total | policy | env | render + tokenise (incremental, token-in/token-out) | "
              "loop's own Python | "
              "alternative: re-render + re-tokenise the whole conversation | ratio alternative / ours (tokenising) |",
              "|---|---|---|---|---|---|---|---|"]
    from sleuth.agents.policies.load import load_tokenizer

    tokenizer = load_tokenizer()
    for label, tasks in (("200 distinct tasks", distinct), ("25 tasks x 8 samples", grouped)):
        loop = loop_overhead(tasks)
        alt = retokenise_per_turn(tasks, tokenizer)
        lines.append(f"| {label} | {loop['total_us']:.0f} | {loop['policy_us']:.0f} | {loop['env_us']:.0f} | "
                     f"{loop['tokenise_us']:.0f} | {loop['loop_us']:.0f} | {alt:.0f} | "
                     f"{alt / loop['tokenise_us']:.1f} |")
    report = "\n".join(lines)
    publish("env_step", "Env step overhead", report)


if __name__ == "__main__":
    main()
