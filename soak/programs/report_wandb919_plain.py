"""wandb/wandb#919, plain wandb: offline ("dryrun") mode on a SLURM cluster, the job never ends.

https://github.com/wandb/wandb/issues/919 ("[slurm] wandb hangs at the end of jobs in dryrun
mode")

What the user did: a GPU training script submitted to a SLURM cluster without network
access, with ``WANDB_MODE=dryrun`` (today: ``offline``, which the harness sets). The script
calls ``wandb.init(...)``, trains (``DataLoader`` workers, evaluation every epoch, a saved
checkpoint), logs with ``wandb.log`` and simply ends: wandb's exit hook finishes the run.

What went wrong with plain wandb (0.8.21): the script printed "wandb: Program ended
successfully." but the SLURM job did not end and kept the GPU node: a wandb process stayed
alive after the script (it seemed to keep trying to reach the server).

The harness checks exactly that: the program must exit, and no process of the job (the
wandb-core service included) may outlive it.

Run: ``python report_wandb919_plain.py``. Slot 0 (the script) logs ``r0``.
"""

# mypy: disable-error-code="no-untyped-call"
# (torch's Tensor.backward and mp.spawn are untyped)
from __future__ import annotations

import torch
import wandb
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from wandb_funnel.soak import probe


def main() -> None:
    rng = probe.rng()
    epochs = rng.randint(4, 8)
    run = wandb.init(project="cluster-offline", config={"epochs": epochs, "lr": 0.1})
    torch.manual_seed(0)
    x = torch.randn(1024, 20)
    y = (x[:, 0] > 0).long()
    train = DataLoader(TensorDataset(x[:896], y[:896]), batch_size=16, shuffle=True, num_workers=2)
    val = DataLoader(TensorDataset(x[896:], y[896:]), batch_size=128, num_workers=2)
    model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = 0
    for epoch in range(epochs):
        model.train()
        for xb, yb in train:
            loss = nn.functional.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            run.log({"train/loss": loss.item(), "epoch": epoch, "r0": step}, step=step)
            probe.count(0)
            if step == 20:
                probe.event("ready")
            step += 1
        model.eval()
        with torch.no_grad():
            correct = sum(int((model(xb).argmax(1) == yb).sum()) for xb, yb in val)
        run.summary["val/acc"] = correct / 128
        print(f"epoch {epoch}: val acc {correct / 128:.3f}", flush=True)
    torch.save(model.state_dict(), "model.pt")
    probe.event("train_end")
    print("training done", flush=True)
    # The script ends here; wandb's exit hook finishes the run.


if __name__ == "__main__":
    main()
