"""Envs that get stuck, for the stuck-work tests (importable as `stuck_envs:HangingDocRead` by a `sleuth train`
subprocess with tests/ on its path): DocRead whose step or reset blocks until the env is closed, as an env
waiting on a sandbox or a server that stopped answering does."""

import threading

import gymnasium

import sleuth

CLOSED_WHILE_STUCK: list[str] = []  # task ids whose stuck call was released by close (this process)


class HangingDocRead(gymnasium.Wrapper):
    """`hang`: "step" or "reset"; `hang_ids`: the task ids it hangs on (None: every task). Closing the env
    releases the stuck call, which then raises."""

    def __init__(self, hang: str = "step", hang_ids: list[str] | None = None, **env_args):
        super().__init__(sleuth.make("DocRead-v0", **env_args))
        self.hang, self.hang_ids = hang, None if hang_ids is None else set(hang_ids)
        self.closed = threading.Event()
        self.task_id = ""

    def _stuck(self, where: str) -> bool:
        return self.hang == where and (self.hang_ids is None or self.task_id in self.hang_ids)

    def _block(self) -> None:
        self.closed.wait()
        CLOSED_WHILE_STUCK.append(self.task_id)
        raise ConnectionError("the env was closed while stuck")

    def reset(self, **kw):
        self.task_id = kw["options"]["task"].id
        if self._stuck("reset"):
            self._block()
        return self.env.reset(**kw)

    def step(self, action):
        if self._stuck("step"):
            self._block()
        return self.env.step(action)

    def close(self):
        self.closed.set()
        self.env.close()
