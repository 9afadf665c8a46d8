import verifiers.v1 as vf

from vf_calc.tools import CalcToolset


class CalcData(vf.TaskData):
    answer: str = ""


class CalcTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class CalcTask(vf.Task[CalcData, vf.State, CalcTaskConfig]):
    @classmethod
    def toolsets(cls, config: CalcTaskConfig) -> list[vf.Toolset]:
        return [CalcToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        return float(self.data.answer in (trace.last_reply or ""))

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class CalcConfig(vf.TasksetConfig):
    num_tasks: int = 4
    task: CalcTaskConfig = CalcTaskConfig()


class CalcTaskset(vf.Taskset[CalcTask, CalcConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            a, b = 17 + 3 * i, 25 + 7 * i
            yield CalcTask(CalcData(prompt=f"What is {a} + {b}? Use the add tool, then give the number.",
                                    system_prompt="You are a careful calculator.", answer=str(a + b),
                                    name=f"sum-{i}"), self.config.task)
