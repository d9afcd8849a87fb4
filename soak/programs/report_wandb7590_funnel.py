"""wandb/wandb#7590 through wandb-funnel: ``finish()`` called from inside a SIGTERM handler.

https://github.com/wandb/wandb/issues/7590 ("Support signal-safe wandb.finish()")

The same script as ``report_wandb7590_plain.py`` with ``wandb`` replaced by ``wandb_funnel as
wf``: a training loop with verbose logging every iteration and persistent ``DataLoader``
workers (forked after ``wf.init``), and a SIGTERM handler, registered after ``wf.init``
(so it replaces the funnel's own SIGTERM hook), that logs a line, saves a checkpoint, calls
``wf.finish(exit_code=0)`` and exits with ``128 + signum``. The handler may run anywhere in
the main thread: inside ``logger.info``, inside ``wf.log`` (holding the client's locks), inside
the DataLoader's ``next()``. ``finish()`` from there must close the funnel in bounded time,
keep every record logged before the signal, and write the exit code the handler chose.

The harness sends SIGTERM to this process (the owner) only, once it said ``ready``. The owner
must exit with 143; the run's exit record must say 0 (the handler's choice: at interpreter
exit the funnel would have used 143), with every ``r0`` record present.

Run: ``python report_wandb7590_funnel.py``. Slot 0 (the script) logs ``r0``.
"""

# mypy: disable-error-code="no-untyped-call"
# (torch's Tensor.backward and mp.spawn are untyped)
from __future__ import annotations

import logging
import signal
import sys
from types import FrameType

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import wandb_funnel as wf
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
    wf.finish(exit_code=0)
    print("W&B run finished; exiting for requeue", flush=True)
    sys.exit(128 + signum)


def main() -> None:
    rng = probe.rng()
    max_iters = rng.randint(500, 800)
    wf.init(project="mmdet-preemptible", config={"max_iters": max_iters})
    signal.signal(signal.SIGTERM, on_sigterm)  # by a hook once the run exists
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
            probe.attempt(0)  # a SIGTERM may land between log() and count()
            wf.log({"train/loss": loss.item(), "learning_rate": 0.02, "r0": it}, step=it)
            probe.count(0)
            if it == 20:
                probe.event("ready")
            it += 1
            if it >= max_iters:
                break
    probe.event("train_end")
    logger.info("Training finished")
    wf.finish()
    probe.event("program_end")  # a SIGTERM after this meets CPython's exit, not ours


if __name__ == "__main__":
    main()
