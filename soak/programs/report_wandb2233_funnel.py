"""wandb/wandb#2233 through wandb-funnel: ``torch.multiprocessing.spawn``, rank 0 logs, no finish.

https://github.com/wandb/wandb/issues/2233 ("When using torch.multiprocessing.spawn(), wandb
will stuck after main code is finished")

The reporter's script with ``import wandb`` replaced by ``import wandb_funnel as wf``: the main
process only calls ``mp.spawn``; every spawned worker joins a gloo process group through a
``tcp://`` init method; rank 0 alone calls ``wf.init(project=...)`` and ``wf.log({...})``; nobody
finishes the run. With no funnel around, ``wf.init`` in the spawned rank 0 starts a private
one owned by that rank (it warns that it found none); the rank returns from its function,
and multiprocessing's finalizers (then the interpreter's exit: ``torch.multiprocessing.spawn``
children end through ``sys.exit``) must close the funnel and finish the run.

With plain wandb the job hung after training (see ``report_wandb2233_plain.py``). Here the
job must exit soon after training, with every ``r0`` record in the run and exit code 0.

Run: ``python report_wandb2233_funnel.py`` (it spawns its 2 ranks itself; gloo on CPU).
Slot = rank; only rank 0 logs (``r0``).
"""

# mypy: disable-error-code="no-untyped-call"
# (torch's Tensor.backward and mp.spawn are untyped)
from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import wandb_funnel as wf
from wandb_funnel.soak import probe

WORLD_SIZE = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main_worker(gpu: int, port: int, steps: int) -> None:
    probe.event("worker", slot=gpu, rank=gpu)
    dist.init_process_group(
        backend="gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        world_size=WORLD_SIZE,
        rank=gpu,
    )
    torch.manual_seed(0)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    if dist.get_rank() == 0:
        wf.init(project="aaa")

    for step in range(steps):
        x = torch.randn(32, 16)
        y = x.sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if dist.get_rank() == 0:
            wf.log({"loss": loss.item(), "r0": step})
            probe.count(0)
            if step == 10:
                probe.event("ready")
    if dist.get_rank() == 0:
        probe.event("train_end")
    # Torch's own teardown (the DDP tutorial's cleanup()). Without it, a gloo worker thread
    # can still hold the last allreduce's work when the interpreter finalizes; freeing it
    # needs the GIL, CPython 3.11 ends such a thread with pthread_exit, and the forced unwind
    # through a noexcept destructor aborts ("terminate called without an active exception").
    # Measured with no wandb at all: 7 aborts in 35 runs; with this line 0 in 35 (issue 10).
    dist.destroy_process_group()
    # ...and the worker returns: no finish(), as in the report.


def main() -> None:
    steps = probe.rng().randint(200, 400)  # the same in every rank: DDP needs equal steps
    mp.spawn(main_worker, args=(free_port(), steps), nprocs=WORLD_SIZE)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
