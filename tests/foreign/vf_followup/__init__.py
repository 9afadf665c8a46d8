"""A verifiers (v1) env package that ships its own `vf.Env`, as `vf-eval` pairs it with the taskset's id: a
`SingleAgentEnv` whose `run()` holds the rollout open and plays a scripted user's follow-up turn ("now add K"), and a
`finalize()` that records a metric. The rubric scores the reply to the follow-up, so a run that skips the env's own
`run()` (one segment on the prompt) scores 0 on every row. No harness is exported: verifiers' default (`bash`) runs."""
import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: int = 0
    add: int = 1


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def follows_up(self, trace: vf.Trace) -> float:
        return float(str(self.data.answer + self.data.add) in (trace.last_reply or ""))


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self):
        for i, add in enumerate((1, 2, 1)):
            a, b = 10 + i, 20 + 3 * i
            yield SumTask(SumData(prompt=f"What is {a} + {b}? Reply with the number only.", answer=a + b, add=add,
                                  name=f"sum-{i}"), self.config.task)


class FollowUpEnv(vf.SingleAgentEnv):
    async def run(self, task, agents):
        async with agents.agent.interaction(task) as chat:
            first = await chat.turn()  # the prompted task speaks first
            if not first.terminated:
                await chat.turn(f"Now add {task.data.add} to your answer. Reply with the number only.")

    async def finalize(self, task, episode):
        for trace in episode.traces:
            trace.record_metric("user_turns", 2.0)


__all__ = ["SumTaskset", "FollowUpEnv"]
