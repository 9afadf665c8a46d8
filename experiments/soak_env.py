"""The soak's env (experiments/soak.py): DocRead, served by `sleuth serve env`, that can be made to hang from outside.

A file named `hang` in `fault_dir` makes the next step of some session block until that session is closed (as
an env waiting on a sandbox that stopped answering); whoever claims the file (an atomic rename) hangs, so one
file is one stuck step."""

import os
import threading
from pathlib import Path

import gymnasium

import sleuth


class FaultyDocRead(gymnasium.Wrapper):
    def __init__(self, fault_dir: str, **env_args):
        super().__init__(sleuth.make("DocRead-v0", **env_args))
        self.fault_dir = Path(fault_dir)
        self.closed = threading.Event()

    def step(self, action):
        claimed = self.fault_dir / f"hung.{os.getpid()}.{threading.get_ident()}"
        try:
            os.rename(self.fault_dir / "hang", claimed)
        except FileNotFoundError:
            return self.env.step(action)
        self.closed.wait()
        raise ConnectionError("the env was closed while its step hung")

    def close(self):
        self.closed.set()
        self.env.close()
