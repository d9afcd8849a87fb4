"""The job that ``rank0_only.py`` times: a nanoGPT-style loop under torchrun, rank 0 calling
``wandb.init`` and ``wandb.log`` (no step, a 0-d tensor in the row, no ``finish``). With
``--install`` the script's first line is ``wandb_funnel.install()``; nothing else changes.

    torchrun --nproc-per-node 2 rank0_train.py --steps N [--install]
"""

from __future__ import annotations

import sys
import time

if "--install" in sys.argv:
    import wandb_funnel

    wandb_funnel.install()

import torch
import torch.distributed as dist
import wandb


def main() -> None:
    steps = int(sys.argv[sys.argv.index("--steps") + 1])
    dist.init_process_group("gloo")
    master = dist.get_rank() == 0
    if master:
        wandb.init(project="bench", name="rank0-only", config={"steps": steps})
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    for it in range(steps):
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for parameter in model.parameters():
            assert parameter.grad is not None
            dist.all_reduce(parameter.grad)
        optimizer.step()
        if master:
            wandb.log({"iter": it, "train/loss": loss.detach(), "lr": 0.01})
    if master:
        print(f"TRAINED {time.time()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
