"""A verifiers (v1) env whose harness forgets: its second model call sends a new conversation instead of the first
one extended (as a harness that compacts its history would). sleuth's `verifiers:` family must refuse to follow it."""
import verifiers.v1 as vf
from openai import AsyncOpenAI


class Data(vf.TaskData):
    pass


class Task(vf.Task[Data]):
    @vf.reward
    async def one(self, trace: vf.Trace) -> float:
        return 1.0


class Forgetful(vf.Taskset[Task, vf.TasksetConfig]):
    def load(self):
        yield Task(Data(prompt="Say hello.", name="hello"), self.config.task)


class ForgetfulHarness(vf.Harness[vf.HarnessConfig]):
    NEEDS_CONTAINER = False
    EXECUTES_CODE = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **_):
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        await client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "Say hello."}])
        await client.chat.completions.create(model=ctx.model, messages=[{"role": "user", "content": "Start over."}])
        await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["Forgetful", "ForgetfulHarness"]
