"""wandb/wandb#2233, plain wandb: ``torch.multiprocessing.spawn``, rank 0 logs, no finish.

https://github.com/wandb/wandb/issues/2233 ("When using torch.multiprocessing.spawn(), wandb
will stuck after main code is finished")

What the user did: the main process only calls ``mp.spawn(main_worker, nprocs=N)``. Every
spawned worker joins a process group through ``init_method="tcp://127.0.0.1:<port>"``; rank 0
alone calls ``wandb.init(project=...)`` and ``wandb.log({...})``. Nobody calls
``wandb.finish()``: the worker function simply returns.

What went wrong with plain wandb: the script printed its output and then hung on "wandb: W&B
syncing" instead of exiting (today's wandb exits: see REPORTS.md). A
``torch.multiprocessing.spawn`` child ends through ``sys.exit`` and the interpreter's
exit, so wandb's atexit teardown runs in the process that owns the run.

Run: ``python report_wandb2233_plain.py`` (it spawns its 2 ranks itself; gloo on CPU).
Slot = rank; only rank 0 logs (``r0``).
"""

# mypy: disable-error-code="no-untyped-call"
# (torch's Tensor.backward and mp.spawn are untyped)
from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import wandb
from torch import nn
from torch.nn.parallel import DistributedDataParallel

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
        wandb.init(project="aaa")

    for step in range(steps):
        x = torch.randn(32, 16)
        y = x.sum(dim=1, keepdim=True)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if dist.get_rank() == 0:
            wandb.log({"loss": loss.item(), "r0": step})
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
    # ...and the worker returns: no wandb.finish(), as in the report.


def main() -> None:
    steps = probe.rng().randint(200, 400)  # the same in every rank: DDP needs equal steps
    mp.spawn(main_worker, args=(free_port(), steps), nprocs=WORLD_SIZE)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
