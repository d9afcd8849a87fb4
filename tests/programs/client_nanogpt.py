"""A nanoGPT-style client (karpathy/nanoGPT train.py): torchrun, master-only ``wandb.init``
and ``wandb.log`` with no ``step``, 0-d tensors in the row, and no ``wandb.finish``.

Plain wandb code. ``CLIENT_INSTALL=1`` adds the one line a user adds: ``install()``.
``CLIENT_LOGGING_RANK=N`` logs from rank N instead (Megatron-LM logs from the last rank).
"""

from __future__ import annotations

import os

if os.environ.get("CLIENT_INSTALL") == "1":
    import wandb_funnel

    wandb_funnel.install()

import torch
import torch.distributed as dist
import wandb


def main() -> None:
    ddp = int(os.environ.get("RANK", "-1")) != -1
    if ddp:
        dist.init_process_group("gloo")
    logging_rank = int(os.environ.get("CLIENT_LOGGING_RANK", "0"))
    master = not ddp or dist.get_rank() == logging_rank
    config = {"learning_rate": 6e-4, "n_layer": 2, "batch_size": 4}
    if master:
        wandb.init(project="nanogpt", name="nano-run", config=config)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for it in range(30):
        loss = model(torch.ones(8)).pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        if ddp:
            for parameter in model.parameters():
                assert parameter.grad is not None
                dist.all_reduce(parameter.grad)
        optimizer.step()
        if master and it % 3 == 0:
            wandb.log(
                {
                    "iter": it,
                    "train/loss": loss.detach(),
                    "val/loss": loss.detach() * 1.1,
                    "lr": config["learning_rate"],
                    "mfu": torch.tensor(0.25 * it),
                }
            )
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
