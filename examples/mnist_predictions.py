"""DDP training that logs its test predictions as one table built from every rank's shard.

    torchrun --nproc-per-node 2 examples/mnist_predictions.py

Seed 004 (Flyte's DDP MNIST example) logs a ``wandb.Table`` of test images with guesses,
truths and scores from rank 0 only. Here every rank evaluates its own shard of the test set
and logs its rows; ``reduce={"predictions": "concat"}`` makes the run hold **one table with
every rank's rows** (rank order, plus a ``rank`` column), without a gather. Each rank also
logs a few sample images of its own (``samples/rank{r}``) and a histogram of its confidence
scores, merged into one (``reduce="merge"``: the bins are fixed, so the counts add up).

The data is scikit-learn's 8x8 digits (shipped inside the package: no download), shown
upscaled to 32x32. The ranks use only ``wf.Image``, ``wf.Table`` and ``wf.Histogram``: the
PNGs are encoded and the bins counted in the rank that has the data.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import wandb_funnel as wf

CONFIDENCE_BINS = np.linspace(0.0, 1.0, 21)  # the same edges on every rank, so "merge" adds


def datasets() -> tuple[TensorDataset, TensorDataset]:
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    split = int(0.8 * len(x))
    train, test = order[:split], order[split:]
    return TensorDataset(x[train], y[train]), TensorDataset(x[test], y[test])


def picture(pixels: torch.Tensor) -> np.ndarray:
    """An 8x8 digit (0-1) as a 32x32 grayscale image (0-255)."""
    image = (pixels.reshape(8, 8).numpy() * 255).astype(np.uint8)
    return np.kron(image, np.ones((4, 4), dtype=np.uint8))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=40, help="table rows per rank")
    parser.add_argument("--project", default="wandb-funnel-mnist")
    args = parser.parse_args(argv)

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    run = wf.init(
        project=args.project,
        reduce={"predictions": "concat", "confidence": "merge"},
        config={"world_size": world, **vars(args)},
    )
    train, test = datasets()
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=32, sampler=sampler)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            run.log({"loss": loss.detach(), "epoch": epoch}, step=step)
            step += 1

    # Every rank evaluates its own shard of the test set: no gather, one table in the run.
    shard = DataLoader(
        test, batch_size=len(test), sampler=DistributedSampler(test, world, rank, shuffle=False)
    )
    x, y = next(iter(shard))
    with torch.no_grad():
        scores = torch.softmax(model(x), dim=1)
    guesses = scores.argmax(dim=1)
    table = wf.Table(columns=["image", "guess", "truth"] + [f"score_{d}" for d in range(10)])
    for i in range(min(args.rows, len(x))):
        table.add_data(
            wf.Image(picture(x[i])),
            int(guesses[i]),
            int(y[i]),
            *[round(float(s), 4) for s in scores[i]],
        )
    confidence = scores.max(dim=1).values.numpy()
    run.log(
        {
            "predictions": table,
            f"samples/rank{rank}": [
                wf.Image(picture(x[i]), caption=f"guess {int(guesses[i])}") for i in range(4)
            ],
            "confidence": wf.Histogram(np_histogram=np.histogram(confidence, CONFIDENCE_BINS)),
            "eval/acc": float((guesses == y).float().mean()),
        },
        step=step,
    )

    run.finish()  # the hosting rank waits (bounded) for the others' last records
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        print(f"rank 0: {step} steps, run id {run.id}, {world} ranks' predictions in one table")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
