"""Real DDP training on CPU (gloo) where every rank logs, into the runs you ask for.

    torchrun --nproc-per-node 4 examples/ddp_train.py --run-mode auto

A small MLP learns scikit-learn's digits (shipped inside the package: no download). Every
step, every rank logs its loss (reduced across ranks with the default mean, so ``loss`` is
the global mean with no all_gather) and its throughput (reduced with ``sum``, so
``throughput`` is the job's). Every epoch, every rank evaluates its shard of the test set and
logs ``eval/acc`` (mean). ``--run-mode shared`` keeps each rank's value as ``loss/rank{r}``;
``--run-mode new`` makes one run per rank, grouped. Training never waits on W&B.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import wandb_funnel as wf


def datasets() -> tuple[TensorDataset, TensorDataset]:
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    generator = torch.Generator().manual_seed(0)
    order = torch.randperm(len(x), generator=generator)
    split = int(0.8 * len(x))
    train, test = order[:split], order[split:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-mode", default="auto", choices=["auto", "shared", "new"])
    parser.add_argument("--rank-scope", default="global", choices=["global", "worker"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--project", default="wandb-funnel-ddp")
    parser.add_argument("--id", default=None, help="base run id (default: generated)")
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    run = wf.init(
        project=args.project,
        id=args.id,
        run_mode=args.run_mode,
        rank_scope=args.rank_scope,
        reduce={"throughput": "sum"},
        config={"world_size": world, **vars(args)},
    )
    train, test = datasets()
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    test_loader = DataLoader(
        test, batch_size=256, sampler=DistributedSampler(test, world, rank, shuffle=False)
    )
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        for x, y in loader:
            started = time.perf_counter()
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            elapsed = time.perf_counter() - started
            # A 0-d tensor is fine: it is read with .item() where it is logged.
            run.log({"loss": loss.detach(), "throughput": len(x) / elapsed}, step=step)
            step += 1
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in test_loader:
                correct += int((model(x).argmax(dim=1) == y).sum())
                total += len(y)
        run.log({"eval/acc": correct / max(total, 1), "epoch": epoch}, step=step)

    run.finish()  # the hosting rank waits (bounded) for the others' last records
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"rank 0: {step} steps, run id {run.id}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
