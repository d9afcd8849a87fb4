"""Lightning's ``FunnelLogger``: every rank's ``self.log`` reaches the run, with no collective.

    python examples/lightning_funnel_logger.py

``Trainer(accelerator="cpu", devices=2, strategy="ddp")``: Lightning starts the second rank
itself. ``FunnelLogger`` takes ``WandbLogger``'s arguments; the difference is that
``WandbLogger`` logs from rank 0 only (a metric logged with ``sync_dist=False`` reaches the
run as rank 0's value, and ``sync_dist=True`` costs an all_reduce per metric), where
``FunnelLogger`` logs from every rank and the funnel reduces: ``train_loss`` is the mean of
the two ranks' losses, ``samples`` their sum (``reduce=``), and ``rank`` (0 and 1) reads 0.5
in every row. ``save_hyperparameters()`` lands in the run's config, as with ``WandbLogger``.

A tiny regression model built in code, on random data (no download).
"""

from __future__ import annotations

import argparse

import lightning as L  # noqa: N812  # Lightning's own convention
import torch
from torch import nn

from wandb_funnel.integrations.lightning import FunnelLogger


class Regression(L.LightningModule):
    def __init__(self, lr: float = 0.05, features: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(features, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.layer(x), y)
        # sync_dist=False (the default): each rank logs its own values; the funnel reduces.
        self.log("train_loss", loss)
        self.log("samples", float(len(x)))
        self.log("rank", float(self.global_rank))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])


def loader(features: int, batch_size: int) -> torch.utils.data.DataLoader[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(128, features, generator=generator)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    return torch.utils.data.DataLoader(data, batch_size=batch_size)  # DDP shards it per rank


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--project", default="wandb-funnel-lightning")
    args = parser.parse_args(argv)
    L.seed_everything(0)
    logger = FunnelLogger(
        project=args.project, name="lightning-every-rank", reduce={"samples": "sum"}
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp",
        max_epochs=args.epochs,
        logger=logger,
        log_every_n_steps=1,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    model = Regression()
    trainer.fit(model, loader(model.hparams["features"], args.batch_size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
