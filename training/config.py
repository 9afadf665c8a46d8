"""`sleuth train`'s config: its sections (each section's settings owned by the part that uses them; the research
settings in `branches:`), the checks across sections, the keys that were renamed, and `load_config`.

Every key has a default, so a config names only what it changes; `sleuth train --config X.yaml` with
`--out`, `--max-steps`, `--resume` and `--set key.sub=value` overrides on top (read by `typed_yaml`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sleuth.agents.loop.episodes import EPISODE_TIMEOUT_S
from sleuth.training.cluster.placement import ClusterConfig
from sleuth.training.distill.signal import DistillConfig
from sleuth.training.metrics import WandbConfig
from sleuth.training.rl.losses import LossConfig
from sleuth.training.rl.update import UpdateConfig
from sleuth.training.typed_yaml import load_yaml
from sleuth.training.zero import DeepSpeedConfig


class TrainingWarning(UserWarning):
    """A run that goes on but may not learn (steps with no learning signal); the CLI prints it in one line."""


@dataclass
class RolloutConfig:
    """`rollout:`: the engine that samples, how many episodes a step, and how groups are kept."""

    inference: str = "transformers"  # transformers (in process) | vllm (OpenAI-compatible vLLM servers)
    tasks_per_step: int = 2  # distinct tasks per step, across all ranks
    group_size: int = 4  # episodes per task (the GRPO group)
    max_tokens: int = 48  # per turn
    temperature: float = 1.0
    top_p: float = 1.0
    concurrency: int = 16
    # Threads that step envs while the engine generates (the continuous loop): for envs whose steps wait
    # (sandboxes, SWE tests, env or retrieval servers); 0 steps in-process envs inline, which is faster.
    env_threads: int = 0
    # The transformers engine keeps each episode's KV states (prompt and generation) up to this many MB, so
    # a next turn prefills only the env's reply; dropped at every weight sync. 0 prefills every turn in full.
    kv_keep_mb: int = 1024
    # Asynchronous training: rollouts go on while the trainer updates, at most `max_staleness` versions
    # behind (0: the synchronous loop, sample then train). Staler groups are dropped and counted.
    max_staleness: int = 0
    sync_timeout_s: float = 600.0  # a weight sync waits this long for generate calls in flight, then fails
    # Wall clock per episode, reset to end (env steps, tool calls, sandboxes, a user's agent through the gateway):
    # an episode still running then fails as `timeout` (never scored; its group re-sampled) and its env is closed.
    # null: no limit. Raise it for envs whose episodes legitimately run long (SWE test suites).
    episode_timeout_s: float | None = EPISODE_TIMEOUT_S
    # Infrastructure failures in a row (env, engine, timeout; across steps) after which the run stops in one line
    # naming the last one, to be resumed with --resume once the cause is fixed. 0: never stop for this.
    max_consecutive_failures: int = 64
    # A step whose every episode failed on infrastructure (every env worker or server lost at once, a network blip)
    # is sampled again after outage_backoff_s, doubling each time, up to outage_retries times before the run stops
    # (counted: outage/retries). 0: stop at the first such step.
    outage_retries: int = 3
    outage_backoff_s: float = 30.0
    zero_variance: str = "keep"  # keep | drop | dynamic (DAPO: sample more groups until the batch is full)
    dynamic_max_rounds: int = 3
    vllm_url: str | None = None  # the server's base URL (or several, comma-separated); None starts servers
    vllm_servers: int = 1  # servers started per rank (data-parallel; a task sticks to one, for prefix-cache hits)
    vllm_python: str | None = None  # a Python with vLLM (default: $SLEUTH_VLLM_PYTHON, then .venv-vllm)
    vllm_args: list[str] = field(default_factory=list)  # extra server flags, e.g. [--enforce-eager]

    def __post_init__(self) -> None:
        if self.inference not in ("transformers", "vllm"):
            raise ValueError(f"rollout.inference must be transformers or vllm; got {self.inference!r}")
        if self.zero_variance not in ("keep", "drop", "dynamic"):
            raise ValueError(f"rollout.zero_variance must be keep, drop or dynamic; got {self.zero_variance!r}")
        if self.group_size < 1 or self.tasks_per_step < 1:
            raise ValueError("rollout.group_size and rollout.tasks_per_step must be ≥ 1")
        for key, value, low in (("max_tokens", self.max_tokens, 1), ("concurrency", self.concurrency, 1),
                                ("env_threads", self.env_threads, 0), ("kv_keep_mb", self.kv_keep_mb, 0),
                                ("vllm_servers", self.vllm_servers, 1), ("max_staleness", self.max_staleness, 0),
                                ("sync_timeout_s", self.sync_timeout_s, 0),
                                ("max_consecutive_failures", self.max_consecutive_failures, 0),
                                ("outage_retries", self.outage_retries, 0),
                                ("outage_backoff_s", self.outage_backoff_s, 0),
                                ("dynamic_max_rounds", self.dynamic_max_rounds, 1),
                                ("temperature", self.temperature, 0)):
            if not value >= low:  # also refuses NaN
                raise ValueError(f"rollout.{key} must be ≥ {low}, got {value}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.episode_timeout_s is not None and not self.episode_timeout_s > 0:
            raise ValueError(f"rollout.episode_timeout_s must be > 0 (or null: no limit), got {self.episode_timeout_s}")


    def check(self, cfg: TrainConfig) -> None:
        """What the rest of the config must allow of these settings: where the vLLM engines live, who plays a
        self-play env's other seats, and what each step's groups can give the estimator."""
        if cfg.cluster.backend == "ray" and (self.vllm_url is not None or self.vllm_servers != 1):
            raise ValueError("cluster.backend: ray places its own vLLM engines (cluster.rollout_workers of them): "
                             "leave rollout.vllm_url and rollout.vllm_servers unset")
        if cfg.env_args.get("opponent") == "self" and self.inference != "vllm":
            raise ValueError("env_args opponent: self plays the policy's other seats on its own rollout servers: set "
                             "rollout.inference: vllm (the transformers engine serves no other caller)")
        estimator = cfg.algorithm.estimator
        if estimator == "none" and self.zero_variance != "keep":
            raise ValueError(f"algorithm.estimator: none gives every group a zero advantage, so rollout.zero_variance "
                             f"{self.zero_variance} would leave out every group the teacher scores: set it to keep")
        if self.group_size == 1:
            import sleuth.rewards  # noqa: F401  (registers the shipped estimators)
            from sleuth.rewards.base import declared

            if declared(estimator, "group_relative"):
                raise ValueError(f"rollout.group_size 1 leaves algorithm.estimator {estimator!r} nothing to learn "
                                 "from: it compares each episode with the others of its group, so every advantage is "
                                 "0; set rollout.group_size to 2 or more")
        if self.max_staleness > 0:
            if self.zero_variance == "dynamic":
                raise ValueError("rollout.max_staleness > 0 takes whole steps of groups from a stream; "
                                 "zero_variance: dynamic (sampling more groups in the same step) "
                                 "needs max_staleness: 0")
            if cfg.loss.rollout_is == "none" and cfg.update.old_logprobs == "recompute":
                raise ValueError("rollout.max_staleness > 0 trains on samples from older weights: correct them with "
                                 "the behaviour logprobs, loss.rollout_is: tis | mis (or update.old_logprobs: rollout)")


@dataclass
class BranchesConfig:
    """`branches:`, extra groups a step samples from inside episodes (research machinery; off by default).

    `answer`: answer branches (tree rollouts): every episode that ended on its own after two or more turns is
    continued this many more times from the context before its last turn (the env replayed to that point), and the
    continuations form a group of their own, which trains only their new turns: the final answer gets a
    group-relative signal conditioned on exactly what was read, even where the episodes' group tied. They share the
    episode's prefix KV states and its packed prefix in the update, so each costs about one turn.

    `demo`: demonstration starts (a reverse curriculum: start states taken from demonstrations, nearest the goal
    first): each task of a round is also played by the scripted `demonstrator` (on DocRead `oracle-title` reads the
    supporting documents by title), and the policy samples this many continuations from before the demonstration's
    last turn, a group of their own that trains only their new turns. The demonstration itself never trains.

    Both count apart (`branches/*`, `demos/*`) and need an env whose replies are fixed by its task and the actions
    (replay is checked)."""

    answer: int = 0
    demo: int = 0
    demonstrator: str = "oracle"  # a scripted policy (sleuth.agents.policies.load.SCRIPTED_POLICIES)
    # Tasks a round gives demonstration starts, drawn beside the round's own (an answer group costs about one
    # turn, so many more of them than of episodes fit a step); 0: the round's own tasks.
    demo_tasks: int = 0

    def __post_init__(self) -> None:
        for key, value in (("answer", self.answer), ("demo", self.demo), ("demo_tasks", self.demo_tasks)):
            if not value >= 0:
                raise ValueError(f"branches.{key} must be ≥ 0, got {value}")
        if self.demo_tasks and not self.demo:
            raise ValueError("branches.demo_tasks draws tasks for demonstration starts, and branches.demo is 0: "
                             "set branches.demo (the answers sampled from each start) or leave demo_tasks at 0")

    def check(self, cfg: TrainConfig) -> None:
        """What the rest of the config must allow: an env to replay, and each step's groups sampled at once."""
        for key, n in (("answer", self.answer), ("demo", self.demo)):
            if n and cfg.agent.enabled:
                raise ValueError(f"branches.{key} replays an env to a turn of a recorded episode; an agent run has no "
                                 f"env to replay: set branches.{key}: 0")
            if n and cfg.rollout.max_staleness > 0:
                raise ValueError(f"branches.{key} samples more groups from each round's tasks before the update; "
                                 "under rollout.max_staleness > 0 a step's groups come from a stream: set one to 0")


@dataclass
class AlgorithmConfig:
    estimator: str = "grpo"  # `none` with `distill`: pure on-policy distillation
    estimator_args: dict[str, Any] = field(default_factory=dict)
    distill: DistillConfig = field(default_factory=DistillConfig)  # a teacher's per-token signal (off: no teacher)

    def __post_init__(self) -> None:
        if self.estimator == "none" and not self.distill.enabled:
            raise ValueError("algorithm.estimator: none leaves nothing to learn from without algorithm.distill: "
                             "name a teacher (algorithm.distill.teacher) or an estimator")


@dataclass
class CheckpointConfig:
    every: int = 1  # steps; 0 = only at the end
    keep: int = 2  # newest checkpoints kept on disk
    export_hf: bool = True  # write a Hugging Face model directory (`hf/`) at the end


@dataclass
class EvalConfig:
    tasks: str | None = None  # held-out tasks, e.g. hotpotqa:test
    limit: int | None = None
    max_tokens: int = 64


@dataclass
class AgentConfig:
    """A user's agent, trained unchanged through the OpenAI-compatible gateway instead of an env: either
    `entrypoint`, `module:function`, `run(task: dict, base_url: str) -> str` (sync or async) imported from
    `path`, or `command`, a program in any language run in `path` per episode (the task's JSON on its stdin, the
    answer on its stdout, `OPENAI_BASE_URL` in its environment; `timeout_s` per episode). Its answer is scored
    by the registered `verifier`."""

    entrypoint: str | None = None
    command: str | None = None
    path: str | None = None
    verifier: str = "qa"
    concurrency: int = 8
    timeout_s: float = 600.0  # a command still running after this fails its episode

    def __post_init__(self) -> None:
        if self.entrypoint is not None and self.command is not None:
            raise ValueError("agent.entrypoint and agent.command: give one (a Python function or a program; over a "
                             "config that names one, --set the other to null)")
        if self.path is not None and not self.enabled:
            raise ValueError("agent.path goes with agent.entrypoint or agent.command")
        if self.concurrency < 1:
            raise ValueError(f"agent.concurrency must be ≥ 1, got {self.concurrency}")
        if not self.timeout_s > 0:
            raise ValueError(f"agent.timeout_s must be > 0, got {self.timeout_s}")

    @property
    def enabled(self) -> bool:
        """Whether the run trains this agent (an entry point or a command is given) instead of an env."""
        return self.entrypoint is not None or self.command is not None

    def check(self, cfg: TrainConfig) -> None:
        """An agent run has no env to replay or stream: its estimator must need no env state, and each step's
        groups are sampled, then trained."""
        if not self.enabled:
            return
        import sleuth.rewards  # noqa: F401  (registers the shipped estimators)
        from sleuth.rewards.base import declared, supporting

        if declared(cfg.algorithm.estimator, "supports_agents") is False:
            able = ", ".join(supporting("supports_agents"))
            raise ValueError(f"an agent run has no env state for algorithm.estimator {cfg.algorithm.estimator!r} (its "
                             f"class leaves supports_agents False): use one of {able}")
        if cfg.rollout.max_staleness > 0:
            raise ValueError("an agent run samples each step's groups, then trains: rollout.max_staleness 0")



@dataclass
class TrainConfig:
    model: str = "smollm2"
    env: str = "DocRead-v0"
    env_args: dict[str, Any] = field(default_factory=dict)
    # None: the env's own verdict is the outcome. A registered verifier or `judge:FILE` scores each round's
    # episodes again once they are over (a group judge: each group in one call); a judge's `env` weight keeps the
    # env's verdict as a term beside it
    verifier: str | None = None
    # None: the env's own default, written into the run's config: hotpotqa:train, or seeds:train for an env that
    # makes its own episodes (reasoning_gym:, gem:, textarena:), a seed range disjoint from evaluation's seeds:test
    tasks: str | None = None
    task_limit: int | None = None
    seed: int = 0
    out: str = "runs/train"
    max_steps: int = 2
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    update: UpdateConfig = field(default_factory=UpdateConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    tensorboard: bool = True
    wandb: WandbConfig = field(default_factory=WandbConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)  # agent.entrypoint or agent.command: an agent, not `env`
    cluster: ClusterConfig = field(default_factory=ClusterConfig)  # local, or rollout workers as Ray actors
    branches: BranchesConfig = field(default_factory=BranchesConfig)  # extra groups from inside episodes (research)

    def __post_init__(self) -> None:
        if self.tasks is None:
            from sleuth.envs.families import family_of

            family = family_of(self.env)
            if family is not None and family.rows:
                raise ValueError(f"tasks: name the rows of {self.env}'s task set it trains on (e.g. tasks: "
                                 "seeds:100-499), disjoint from the rows it is evaluated on")
            self.tasks = "seeds:train" if family is not None and family.seeded else "hotpotqa:train"
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be ≥ 1, got {self.max_steps}")
        if self.task_limit is not None and self.task_limit < 1:
            raise ValueError(f"task_limit must be ≥ 1 (or null for all), got {self.task_limit}")
        self.agent.check(self)
        self.branches.check(self)
        self.rollout.check(self)
        if self.update.sync_transport == "collective" and self.cluster.backend != "ray":
            raise ValueError("update.sync_transport: collective syncs Ray rollout workers: set cluster.backend: ray "
                             "(the local engine shares the trainer's process; vLLM servers load a file)")
        if self.loss.rollout_is != "none" and self.update.old_logprobs == "rollout":
            raise ValueError("loss.rollout_is corrects π_old (the recomputed trainer policy) towards π_rollout; with "
                             "update.old_logprobs: rollout they are the same policy: set old_logprobs: recompute "
                             "or rollout_is: none")


# Keys that moved (2026-12: one name per thing, research settings in a section of their own), old → new path; a
# config that still names one is refused in one line that names the new key.
RENAMED = {
    "engine": "deepspeed",
    "rollout.engine": "rollout.inference",
    "rollout.env_workers": "rollout.env_threads",
    "cluster.env_workers": "cluster.env_actors",
    "cluster.env_worker_cpus": "cluster.env_actor_cpus",
    "rollout.branches": "branches.answer",
    "rollout.demo_branches": "branches.demo",
    "rollout.demonstrator": "branches.demonstrator",
    "rollout.demo_tasks": "branches.demo_tasks",
}


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read a YAML config (or start from defaults) and apply dotted overrides ({"rollout.group_size": 8})."""
    return load_yaml(TrainConfig, path, overrides, RENAMED)
