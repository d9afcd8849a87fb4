"""accelerate's ``Accelerator(log_with="wandb")`` under torchrun: ``init_trackers`` with a
run name, ``accelerator.log(values, step=...)`` from the main process, ``end_training``.

Plain accelerate code. ``CLIENT_INSTALL=1`` adds the one line a user adds: ``install()``.
"""

from __future__ import annotations

import os

if os.environ.get("CLIENT_INSTALL") == "1":
    import wandb_funnel

    wandb_funnel.install()

import torch
from _prelude import end_process_group_at_exit
from accelerate import Accelerator

end_process_group_at_exit()


def main() -> None:
    accelerator = Accelerator(log_with="wandb", cpu=True)
    accelerator.init_trackers(
        "accelerate-project",
        config={"lr": 0.05, "epochs": 2, "id2label": {0: "neg", 1: "pos"}},
        init_kwargs={"wandb": {"name": "acc-run", "tags": ["tiny"]}},
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    step = 0
    for epoch in range(2):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            accelerator.log({"train_loss": loss.item(), "epoch": epoch}, step=step)
            step += 1
    accelerator.end_training()


if __name__ == "__main__":
    main()
