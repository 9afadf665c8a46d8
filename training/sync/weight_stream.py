"""Weights over the network (`update.sync_transport: collective`): a torch.distributed process group between the
trainer and its rollout workers — NCCL where both hold GPUs, gloo otherwise — and the full weights broadcast in
buckets of `update.sync_bucket_mb`, so that a sync needs one bucket of extra memory on each side, not a second
copy of the model, and no shared filesystem or object store between the nodes.

The group is built beside the trainer's own (DeepSpeed's default group is untouched): the trainer serves a
`TCPStore` on its node's address, each sync is a new generation of the group under a `PrefixStore` of its own,
and the backend's process group is constructed directly. Rank 0 sends (the trainer, or a worker that passes its
weights to a restarted peer), the others receive. A new generation per sync means a worker that died and came
back simply joins the next one; nothing of a broken group is reused."""

from __future__ import annotations

import datetime
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

BACKENDS = ("gloo", "nccl")


@dataclass(frozen=True)
class Slot:
    """Where one tensor lies in its bucket (elements from the bucket's start)."""

    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Bucket:
    dtype: str  # torch dtype name, e.g. "float32"
    slots: tuple[Slot, ...]

    @property
    def numel(self) -> int:
        return sum(s.numel for s in self.slots)


def bucket_plan(tensors: Mapping[str, torch.Tensor], bucket_bytes: int) -> list[Bucket]:
    """The tensors, in their order, packed into buckets of one dtype each holding at most `bucket_bytes` (a
    tensor larger than that is a bucket of its own)."""
    if bucket_bytes < 1:
        raise ValueError(f"a bucket must hold at least one byte, got {bucket_bytes}")
    out: list[Bucket] = []
    slots: list[Slot] = []
    dtype, used = None, 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        if slots and (t.dtype != dtype or used + size > bucket_bytes):
            out.append(Bucket(str(dtype).removeprefix("torch."), tuple(slots)))
            slots, used = [], 0
        dtype = t.dtype
        slots.append(Slot(name, tuple(t.shape), used // t.element_size()))
        used += size
    if slots:
        out.append(Bucket(str(dtype).removeprefix("torch."), tuple(slots)))
    return out


@dataclass(frozen=True)
class Link:
    """One generation of the group, as its members need it (an argument of the workers' Ray calls)."""

    address: str
    port: int
    prefix: str
    backend: str
    timeout_s: float
    plan: list[Bucket]


def plan_bytes(plan: list[Bucket]) -> int:
    return sum(b.numel * torch.empty(0, dtype=getattr(torch, b.dtype)).element_size() for b in plan)


class Rendezvous:
    """The trainer's store: where each generation of the group meets (`address`, `port`)."""

    def __init__(self, address: str, timeout_s: float):
        from torch.distributed import TCPStore

        self.address, self.timeout = address, datetime.timedelta(seconds=timeout_s)
        self.store = TCPStore(address, 0, None, True, timeout=self.timeout, wait_for_workers=False)
        self.port = self.store.port
        self.generation = 0

    def next_prefix(self) -> str:
        self.generation += 1
        return f"sync{self.generation}"


def join(address: str, port: int, prefix: str, rank: int, world: int, backend: str, timeout_s: float,
         store: object | None = None) -> object:
    """This process's member of generation `prefix` of the group (`store`: the trainer's own store object, on
    rank 0 of the trainer; others connect to `address:port`)."""
    from torch.distributed import PrefixStore, ProcessGroupGloo, TCPStore

    timeout = datetime.timedelta(seconds=timeout_s)
    base = store if store is not None else TCPStore(address, port, None, False, timeout=timeout)
    scoped = PrefixStore(prefix, base)
    if backend == "nccl":
        from torch.distributed import ProcessGroupNCCL

        return ProcessGroupNCCL(scoped, rank, world)
    return ProcessGroupGloo(scoped, rank, world, timeout)


def send(group: object, tensors: Mapping[str, torch.Tensor], plan: list[Bucket], device: torch.device) -> int:
    """Broadcast `tensors` from rank 0, bucket by bucket (each bucket a fresh flat copy of its tensors, on
    `device`); the bytes sent."""
    sent = 0
    for bucket in plan:
        flat = torch.cat([tensors[s.name].detach().reshape(-1).to(device, getattr(torch, bucket.dtype))
                          for s in bucket.slots])
        group.broadcast(flat, 0).wait()
        sent += flat.numel() * flat.element_size()
    return sent


def receive(group: object, into: Mapping[str, torch.Tensor], plan: list[Bucket], device: torch.device) -> None:
    """Receive rank 0's broadcast into `into`'s tensors (copied in place, cast to their dtype)."""
    missing = [s.name for b in plan for s in b.slots if s.name not in into]
    if missing:
        raise KeyError(f"weights the rollout model does not have: {missing[:5]}")
    for bucket in plan:
        flat = torch.empty(bucket.numel, dtype=getattr(torch, bucket.dtype), device=device)
        group.broadcast(flat, 0).wait()
        for s, piece in zip(bucket.slots, _pieces(flat, bucket), strict=True):
            target = into[s.name]
            if tuple(target.shape) != s.shape:
                raise ValueError(f"{s.name}: the sender's shape {s.shape} is not this model's {tuple(target.shape)}")
            target.copy_(piece)


def _pieces(flat: torch.Tensor, bucket: Bucket) -> Iterator[torch.Tensor]:
    for s in bucket.slots:
        yield flat[s.offset:s.offset + s.numel].view(s.shape)
