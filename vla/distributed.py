"""One training run over several processes (``accelerate launch`` / ``torchrun``), or the plain single process.

``vla train`` keeps one loop for both. ``start_processes()`` returns a :class:`Processes`: in a plain
``vla train`` it is the single CPU process the loop always ran in (accelerate is not even imported);
started by a launcher it wraps a Hugging Face ``Accelerator`` (DDP over gloo on CPUs, NCCL on GPUs),
as LeRobot's ``lerobot-train`` does. The loop asks it only this: which process am I and how many are
we, where do tensors go, which rows of the global batch are mine, wrap the model so DDP averages the
gradients, backward / clip, the mean of a scalar over the processes, one process's decision for all,
and a barrier.

Why accelerate's ``--cpu`` launcher is not the way to several CPU processes: ``accelerate launch
--cpu --num_processes 2`` starts *one* process (its simple launcher; several CPU processes need
mpirun). ``accelerate launch --multi_gpu --num_processes 2`` starts them through torchrun, and on a
machine without a GPU ``start_processes`` puts them on the CPU (gloo).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
from typing import Any

import torch

LAUNCHER_ENV = ("LOCAL_RANK", "ACCELERATE_MIXED_PRECISION")
"""Set in every process that ``torchrun`` (LOCAL_RANK) or ``accelerate launch`` (both) starts."""

BARRIER_TIMEOUT = datetime.timedelta(minutes=60)
"""How long a process waits at a collective: the main process caches the frozen trunk's features alone
while the others wait (NCCL's default, 10 minutes, is short for a large dataset)."""


def launched() -> bool:
    """Whether this process was started by ``accelerate launch`` or ``torchrun``."""
    return any(k in os.environ for k in LAUNCHER_ENV)


def is_main_process() -> bool:
    """Rank 0, or no launcher (usable before the process group exists: the launchers set ``RANK``)."""
    return int(os.environ.get("RANK", "0")) == 0


@dataclasses.dataclass
class Processes:
    """The processes of one training run. ``accelerator`` is None in a plain single process."""

    rank: int = 0
    world: int = 1
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    accelerator: Any = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def part(self, batch_size: int) -> slice:
        """This process's rows of a global batch: rank r takes rows ``r * b .. (r + 1) * b - 1``,
        ``b = batch_size / world``. Every process draws the whole global batch from the same seeded
        generators, so the union of the parts is the batch one process would train on."""
        if batch_size % self.world:
            raise ValueError(f"--batch-size {batch_size} does not split evenly over {self.world} processes: give a "
                             f"multiple of {self.world} (it is the global batch, shared out among the processes)")
        b = batch_size // self.world
        return slice(self.rank * b, (self.rank + 1) * b)

    def prepare(self, module: torch.nn.Module, opt: torch.optim.Optimizer):
        """``(module, opt)`` on this process's device; with several processes ``module`` is wrapped in DDP
        (its gradients are averaged over the processes in backward). The scheduler is not prepared: it
        steps once per optimiser step whatever the number of processes."""
        if self.accelerator is None:
            return module, opt
        return self.accelerator.prepare(module, opt)

    def backward(self, loss: torch.Tensor) -> None:
        if self.accelerator is None:
            loss.backward()
        else:
            self.accelerator.backward(loss)

    def clip_grad_norm_(self, params, max_norm: float) -> torch.Tensor:
        """After backward the gradients are the processes' mean, the same in every process: so is the clip."""
        if self.accelerator is None:
            return torch.nn.utils.clip_grad_norm_(params, max_norm)
        return self.accelerator.clip_grad_norm_(params, max_norm)

    def mean(self, x: torch.Tensor) -> float:
        """The mean of a scalar over the processes (a collective: every process calls it at the same step).
        With equal parts, the mean of the parts' mean losses is the global batch's mean loss."""
        x = x.detach().float().reshape(1)
        if self.world > 1:
            x = self.accelerator.reduce(x.to(self.device), reduction="mean")
        return float(x)

    def main_says(self, flag: bool) -> bool:
        """The main process's ``flag`` in every process (a collective): a decision taken on one clock,
        such as ``--max-minutes``, must stop every process at the same step."""
        if self.world == 1:
            return flag
        from accelerate.utils import broadcast

        return bool(broadcast(torch.tensor([int(flag)], device=self.device), from_process=0).item())

    def wait(self) -> None:
        """Barrier: every process reaches this line before any goes on."""
        if self.world > 1:
            self.accelerator.wait_for_everyone()



def start_processes() -> Processes:
    """The single process, or under a launcher an ``Accelerator`` for this process (its rank, the number
    of processes and its device: the GPU of its local rank, or the CPU when no GPU is visible)."""
    if not launched():
        return Processes()
    if (os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true") and "MASTER_ADDR" in os.environ
            and "WORLD_SIZE" not in os.environ):
        print("warning: `accelerate launch --cpu --num_processes N` started one process (accelerate's --cpu launcher "
              "does not spawn several); for N CPU processes run `accelerate launch --multi_gpu --num_processes N` "
              "(torchrun: vla train puts them on the CPU when no GPU is visible). Training on one process: the same "
              "updates, only slower.", file=sys.stderr)
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    acc = Accelerator(cpu=not torch.cuda.is_available(), step_scheduler_with_optimizer=False,
                      kwargs_handlers=[InitProcessGroupKwargs(timeout=BARRIER_TIMEOUT)])
    return Processes(rank=acc.process_index, world=acc.num_processes, device=acc.device, accelerator=acc)


def finish() -> None:
    """Take down the process group a launcher's processes formed, if any (at the end of ``vla train``)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
