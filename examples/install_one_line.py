"""``wandb_funnel.install()``: one line at the top of a plain wandb script that starts its own
processes, and every ``wandb.init`` in them joins one run.

    python examples/install_one_line.py --ranks 2

The script spawns its DDP ranks itself (``torch.multiprocessing.spawn``, no launcher), and
each rank calls ``wandb.init`` and ``wandb.log`` as plain wandb code does. Without the
``install()`` line (comment it out) plain wandb makes one run per rank. With it, the job makes
**one run**: ``loss`` and ``accuracy`` averaged across the ranks at each step, ``samples``
summed (the ``reduce=`` option given to ``install``), each rank's ``rank{r}/accuracy`` beside
them, and rank 0's summary. The spawned ranks need no line of their own: ``install()`` holds
in every process started from this one.

A linear classifier separates two clouds of random points (no download), with DDP on CPU (gloo).
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import wandb
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import wandb_funnel

wandb_funnel.install(reduce={"samples": "sum"})  # the one line; the options are optional


def train(rank: int, world: int, args: argparse.Namespace) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = DistributedDataParallel(nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    data = torch.Generator().manual_seed(rank)  # each rank its own batches

    wandb.init(project=args.project, name="install-one-line", config=vars(args))
    for _ in range(args.steps):
        # Two classes: points around (-1, -1) and (1, 1).
        labels = torch.randint(0, 2, (args.batch_size,), generator=data)
        points = torch.randn(args.batch_size, 2, generator=data) + (2.0 * labels - 1).unsqueeze(1)
        logits = model(points)
        loss = nn.functional.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()  # DDP's gradient all_reduce: the ranks step together
        optimizer.step()
        accuracy = (logits.argmax(dim=1) == labels).float().mean().item()
        wandb.log(
            {
                "loss": loss.item(),
                "accuracy": accuracy,
                f"rank{rank}/accuracy": accuracy,
                "samples": len(labels),
            }
        )
    if rank == 0:
        wandb.summary["final_accuracy"] = accuracy
    wandb.finish()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--project", default="wandb-funnel-install")
    args = parser.parse_args(argv)
    with socket.socket() as probe:  # a free port for the process group's rendezvous
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    mp.spawn(train, args=(args.ranks, args), nprocs=args.ranks, join=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
