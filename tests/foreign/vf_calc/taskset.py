import verifiers.v1 as vf

from vf_calc.tools import CalcToolset


class CalcData(vf.TaskData):
    answer: str = ""


class CalcTask(vf.Task[CalcData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(self.data.answer in (trace.last_reply or ""))

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class CalcConfig(vf.TasksetConfig):
    num_tasks: int = 4
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    @classmethod
    def toolsets(cls, config: CalcConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]  # one server for every rollout of the taskset

    def load(self):
        for i in range(self.config.num_tasks):
            a, b = 17 + 3 * i, 25 + 7 * i
            yield CalcTask(CalcData(prompt=f"What is {a} + {b}? Use the add tool, then give the number.",
                                    system_prompt="You are a careful calculator.", answer=str(a + b),
                                    name=f"sum-{i}"), self.config.task)
