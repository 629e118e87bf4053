"""Several processes, one run: what `torchrun` sets up, and the few collectives training needs.

Without torchrun the same code runs as a world of one and no collective is ever called. How to
launch it on one machine or several, and what each rank does: docs/across-machines.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from buildllm.device.device import Device


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    tensors: str = "cpu"  # where collectives' tensors live (NCCL moves only CUDA tensors, gloo only CPU ones)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def start(device: Device) -> tuple[World, Device]:
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:  # not launched by torchrun
        return World(), device
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    size = int(os.environ["WORLD_SIZE"])
    device = device.for_rank(local_rank, rank, size, os.environ.get("LOCAL_WORLD_SIZE", "?"))
    if not dist.is_initialized():
        dist.init_process_group(backend=device.collective_backend)
    return World(rank, size, device.collective_device), device


def stop(world: World, clean: bool = True) -> None:
    """Leave the process group. After a clean run, a barrier first: gloo's worker threads release the
    tensors of the last collectives (which needs the GIL) before teardown joins those threads while
    holding it; without it, exit can deadlock. After an error another rank may never reach a barrier."""
    if world.distributed and dist.is_initialized():
        if clean:
            dist.barrier()
        dist.destroy_process_group()


def all_sum(world: World, values: list[float]) -> list[float]:
    """Element-wise sum over ranks (float64, so token counts stay exact)."""
    if not world.distributed:
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=world.tensors)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor.tolist()


def mean_and_any(world: World, values: torch.Tensor, flag: bool) -> tuple[list[float], bool]:
    """`values` averaged over ranks, and whether `flag` is true on any rank, as Python values: one
    all_reduce and one host sync for both (the run loop calls it only where it reads losses)."""
    if not world.distributed:
        return values.tolist(), flag
    packed = torch.cat(
        [values.detach().float().reshape(-1).to(world.tensors), torch.tensor([float(flag)], device=world.tensors)]
    )
    dist.all_reduce(packed, op=dist.ReduceOp.SUM)
    *sums, flags = packed.tolist()
    return [total / world.size for total in sums], flags > 0


def from_main(world: World, value):
    """Rank 0's `value` on every rank (a checkpoint read on rank 0 reaches nodes that lack the file)."""
    if not world.distributed:
        return value
    box = [value if world.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]
