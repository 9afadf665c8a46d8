"""`python sleuth_die_with_parent.py CMD...`: runs CMD in this process's group and kills the whole group when the
process that started this one dies, however it dies (SIGKILL included).

A vLLM server is several processes (the API server, its engine core, workers, a resource tracker); Linux's
PR_SET_PDEATHSIG reaches only the direct child, and the engine core outlives a killed API server holding its
memory. Here the parent's death arrives as SIGTERM, and the handler kills the group; should this process itself
be SIGKILLed, the API server gets SIGKILL (its own PR_SET_PDEATHSIG). The caller starts this process in a new
session (its own group). Standard library only: it runs with vLLM's Python. (Ray rollout workers do not use it:
their server stays in the actor's process group, which Ray kills whole; training/cluster/vllm_workers.py.)"""

import ctypes
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def main() -> int:
    parent = os.getppid()
    signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the request took effect
        os.killpg(0, signal.SIGKILL)
    return subprocess.Popen(sys.argv[1:], preexec_fn=_die_with_this).wait()


def _die_with_this() -> None:  # in the server's process, before exec
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
