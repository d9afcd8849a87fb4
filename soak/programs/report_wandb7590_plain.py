"""wandb/wandb#7590, plain wandb: ``wandb.finish()`` called from inside a SIGTERM handler.

https://github.com/wandb/wandb/issues/7590 ("Support signal-safe wandb.finish()")

What the user did: a training loop (mmdetection-style: verbose logging every iteration,
PyTorch ``DataLoader`` workers in the background) with a SIGTERM handler that saves a
checkpoint and calls ``wandb.finish(exit_code=0, quiet=True)``, so that a run preempted or
requeued by SLURM ends "finished" with an exit code of the user's choosing. Here: the handler
logs a line, saves a checkpoint, calls ``wandb.finish(exit_code=0)`` (``quiet=`` is gone in
0.31), then exits with ``128 + signum``.

What went wrong with plain wandb (0.17): it worked most of the time, except (1) when SIGTERM
landed inside a print/logging call, the handler's own output raised "reentrant call"
``RuntimeError``; (2) with DataLoader workers also terminated, ``finish()`` raised from
wandb's exit handle.

The harness sends SIGTERM to this process (the owner) only, once it said ``ready``.

Run: ``python report_wandb7590_plain.py``. Slot 0 (the script) logs ``r0``.
"""

# mypy: disable-error-code="no-untyped-call"
# (torch's Tensor.backward and mp.spawn are untyped)
from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

import torch
import wandb
from torch import nn
from torch.utils.data import DataLoader, Dataset

from wandb_funnel.soak import probe

logging.basicConfig(
    stream=sys.stdout,
    format="%(asctime)s - mmdet - %(levelname)s - %(message)s",
    level=logging.INFO,
)
logger = logging.getLogger("mmdet")


class Images(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(index)
        return torch.randn(3, 8, 8, generator=g), torch.randint(0, 4, (), generator=g)


model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, 32), nn.ReLU(), nn.Linear(32, 4))


def on_sigterm(signum: int, frame: FrameType | None) -> None:
    logger.info("Received SIGTERM: saving a checkpoint and finishing the W&B run")
    torch.save(model.state_dict(), "latest.pth")
    wandb.finish(exit_code=0)
    print("W&B run finished; exiting for requeue", flush=True)
    sys.exit(128 + signum)


def main() -> None:
    rng = probe.rng()
    max_iters = rng.randint(500, 800)
    wandb.init(project="mmdet-preemptible", config={"max_iters": max_iters})
    signal.signal(signal.SIGTERM, on_sigterm)  # registered by a hook once the run exists
    loader = DataLoader(
        Images(), batch_size=16, shuffle=True, num_workers=2, persistent_workers=True
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    it = 0
    while it < max_iters:
        for images, labels in loader:
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            logger.info("Iter [%d/%d] lr: 2.000e-02, loss: %.4f", it + 1, max_iters, loss.item())
            wandb.log({"train/loss": loss.item(), "learning_rate": 0.02, "r0": it}, step=it)
            probe.count(0)
            if it == 20:
                probe.event("ready")
            it += 1
            if it >= max_iters:
                break
    probe.event("train_end")
    logger.info("Training finished")
    wandb.finish()
    probe.event("program_end")  # a SIGTERM after this meets CPython's exit, not ours


if __name__ == "__main__":
    main()
