"""A DDP training script of the common kind: every rank trains, only rank 0 calls wandb
(``wandb.init``, ``log``, ``summary``, ``save``, ``finish``). Plain wandb code, with no line
of the funnel's: tests/online/test_parity_online.py runs it under torchrun as it is, and
under ``wandb-funnel run -- torchrun ...``, online against OpenWandb, and compares what the
server holds.

    torchrun --standalone --nproc-per-node 2 rank0_online.py [--steps N] [--stride K]

``--stride K``: every ``log`` passes ``step=K * step`` (as accelerate's tracker passes its
``step``); without it (0), no ``log`` passes ``step=`` (as nanoGPT and HF's Trainer log).

The project comes from ``WANDB_PROJECT`` (the test's), as a user's environment gives it.
Every value it logs is deterministic (seeded data, gloo on CPU), so two runs log the same
numbers, images and files. Rank 0 REPORTs the run's id.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib

import numpy as np
import torch
import torch.distributed as dist
import wandb
from _prelude import report
from torch.nn.parallel import DistributedDataParallel

EVAL_EVERY = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--stride", type=int, default=0)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own shard

    run = None
    if rank == 0:
        run = wandb.init(
            name="parity-online",
            group="parity",
            job_type="train",
            tags=["ddp", "rank0"],
            notes="rank 0 logs, the other ranks train",
            config={
                "lr": 0.05,
                "optimizer": {"name": "sgd", "momentum": 0.9},
                "layers": [8, 2],
                "id2label": {0: "neg", 1: "pos"},  # int keys: wandb stores them as str
            },
        )
        wandb.config.update({"world_size": world, "steps": args.steps})  # type: ignore[no-untyped-call]
        run.define_metric("val/loss", summary="min")
        report(run_id=run.id)
        print(f"training {args.steps} steps on {world} ranks", flush=True)

    best = float("inf")
    for step in range(args.steps):
        x = torch.randn(16, 8, generator=data)
        y = torch.randint(0, 2, (16,), generator=data)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # DDP: every rank in lockstep
        optimizer.step()
        if run is None:
            continue
        at = args.stride * step if args.stride else None  # step=None: wandb's own count
        row: dict[str, object] = {
            "train/loss": loss.detach(),  # a 0-d tensor, as training code logs it
            "train/lr": optimizer.param_groups[0]["lr"],
            "train/epoch": step / args.steps,
        }
        if step % EVAL_EVERY == EVAL_EVERY - 1:
            with torch.no_grad():
                val = torch.nn.functional.cross_entropy(
                    model(torch.ones(4, 8)), torch.tensor([0, 1, 0, 1])
                ).item()
            best = min(best, val)
            wandb.log({"val/loss": val}, step=at, commit=False)  # merges into the row below
        if step == args.steps - 1:
            weights = model.module.weight.detach().numpy()
            pixels = (np.arange(8 * 8 * 3, dtype=np.uint8).reshape(8, 8, 3) * 3) % 251
            row["samples"] = wandb.Image(pixels, caption="the last batch")
            row["weights"] = wandb.Histogram(weights.ravel(), num_bins=8)
        wandb.log(row, step=at)
        print(f"step {step} loss {loss.item():.4f}", flush=True)

    if run is not None:
        run.summary["best_val"] = best
        notes = pathlib.Path(run.dir) / "notes.json"
        notes.write_text(json.dumps({"steps": args.steps, "world": world}, sort_keys=True))
        wandb.save(str(notes), base_path=run.dir, policy="now")
        run.finish()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} of pid {os.getpid()} done", flush=True)


if __name__ == "__main__":
    main()
