"""A plain wandb DDP script: nothing of wandb_funnel in it. Put the funnel in front of the command:

    wandb-funnel run -- torchrun --nproc-per-node 2 examples/unmodified/train.py

Every rank calls ``wandb.init`` and logs its own loss, as wandb's DDP guide's "log from every
process" does. Plain wandb (``torchrun ... train.py`` alone) makes one run per rank. Under
``wandb-funnel run --`` the job makes **one run**: each step is one row with every rank's
values, ``loss`` and ``samples`` reduced across the ranks (mean by default, with no
``all_gather``), and each rank's own ``rank{r}/loss`` kept beside them. The funnel's options
go before the ``--``: ``wandb-funnel run --reduce samples=sum -- torchrun ...`` sums
``samples`` (64 per step with 2 ranks), as do ``WANDB_FUNNEL_*`` variables
(``WANDB_FUNNEL_REDUCE``).

A linear model learns ``y = sum(x)`` on random data (no download), with DDP on CPU (gloo).
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import wandb
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--project", default="wandb-funnel-unmodified")
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank
    model = DistributedDataParallel(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(rank)  # each rank its own batches

    wandb.init(project=args.project, group="ddp", config={"world_size": world, **vars(args)})
    for _ in range(args.steps):
        x = torch.randn(args.batch_size, 8, generator=data)
        loss = nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()  # DDP's gradient all_reduce: the ranks step together
        optimizer.step()
        wandb.log({"loss": loss.item(), f"rank{rank}/loss": loss.item(), "samples": len(x)})
    wandb.finish()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
