"""Several processes training together (``accelerate launch``, ``torchrun``; DDP through the `Trainer`, gloo on CPU):
the process state, and the few collective steps the drafters' training adds to what the `Trainer` does."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Sequence

import torch

__all__ = [
    "process_state",
    "num_processes",
    "is_main_process",
    "main_process_first",
    "barrier",
    "end_processes",
    "several_processes",
    "process0_value",
    "average_gradients",
    "weights_agree",
]


def process_state():
    """accelerate's `PartialState` of this process (gloo on CPU, as the Trainer sets it up)."""
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available())


def num_processes() -> int:
    """Processes training together (several under ``accelerate launch`` / ``torchrun``; 1 alone)."""
    return process_state().num_processes


def is_main_process() -> bool:
    """True in a single process, and in process 0 of ``accelerate launch`` / ``torchrun``."""
    return process_state().is_main_process


@contextmanager
def main_process_first():
    """Under several processes the main process runs the block first and the others after it, so that they read the
    caches it wrote (hidden states) instead of racing to write them. In a single process, just the block."""
    with process_state().main_process_first():
        yield


def barrier() -> None:
    """Wait for every process (nothing in a single process)."""
    if several_processes():
        import torch.distributed as dist

        dist.barrier()


def end_processes() -> None:
    """The end of a command run by several processes: every process waits for the others (the main one may still be
    writing the folder), then the process group is taken down, so that no process exits while another still talks to
    it. Nothing in a single process."""
    if several_processes():
        import torch.distributed as dist

        barrier()
        dist.destroy_process_group()


def several_processes() -> bool:
    """Whether a process group of more than one process is running (collectives are needed)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _device():
    import torch.distributed as dist

    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def process0_value(value: float) -> float:
    """``value`` as process 0 has it when several processes train together, so that decisions taken on a clock (stop,
    learning rate) are the same in every process; ``value`` alone else."""
    if not several_processes():
        return value
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=_device())
    dist.broadcast(t, 0)
    return float(t)


def average_gradients(params: Sequence[torch.nn.Parameter]) -> None:
    """Average the gradients of ``params`` across the processes (one all-reduce over a flat buffer): for weights that
    DistributedDataParallel does not see; nothing in a single process."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads or not several_processes():
        return
    import torch.distributed as dist

    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= dist.get_world_size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def weights_agree(params: Sequence[torch.Tensor]) -> bool | None:
    """Under several processes: whether every process holds the same weights (a checksum of ``params`` gathered
    from all of them); None in a single process."""
    if not several_processes():
        return None
    import torch.distributed as dist

    flat = torch.cat([p.detach().reshape(-1).double() for p in params])
    weights = torch.linspace(0.5, 1.5, flat.numel(), dtype=torch.float64, device=flat.device)
    mine = torch.stack([flat.sum(), (flat * weights).sum(), (flat * flat).sum()])
    gathered = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    return all(torch.allclose(g, mine, rtol=1e-9, atol=1e-12) for g in gathered)
