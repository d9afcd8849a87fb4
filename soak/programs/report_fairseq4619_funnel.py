"""facebookresearch/fairseq#4619 through wandb-funnel: DDP training that never calls finish.

https://github.com/facebookresearch/fairseq/issues/4619 ("WandB hangs at the end of
multi-gpu DDP training")

The same fairseq stand-in as ``report_fairseq4619_plain.py``, with ``wandb`` replaced by
``wandb_funnel as wf`` and nothing else changed: ``WandBProgressBarWrapper`` calls
``wf.init(project=..., name=run_name)`` on the master rank only, logs ``train_inner`` stats
with ``wf.log(stats, step=num_updates)``, and nobody finishes the run. Under torchrun,
``wf.init`` on rank 0 hosts the funnel for a job of 2 ranks, but rank 1 never attaches
("rank-0-only code behaves exactly as before", says docs/guide/use.md): the logger must neither wait
for rank 1's rows nor hold the exit for it beyond the bounds it documents.

The job must exit soon after training (torchrun exit code 0), with every ``r0`` record in
the run and exit code 0, and nothing left behind.

Run under torchrun (gloo on CPU), as the harness does:
``python -m torch.distributed.run --standalone --nproc-per-node 2 report_fairseq4619_funnel.py``.
Slot = rank; only the master (rank 0) logs (``r0``).
"""

# mypy: disable-error-code="no-untyped-call"
# (torch's Tensor.backward and mp.spawn are untyped)
from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import wandb_funnel as wf
from wandb_funnel.soak import probe

logging.basicConfig(
    format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO
)
logger = logging.getLogger("fairseq_cli.train")


class WandBProgressBarWrapper:
    """fairseq.logging.progress_bar.WandBProgressBarWrapper: log to W&B on the master."""

    def __init__(self, wandb_project: str | None, run_name: str | None = None) -> None:
        self.enabled = wandb_project is not None
        if self.enabled:
            wf.init(project=wandb_project, name=run_name)

    def log(self, stats: dict[str, Any], tag: str | None = None, step: int | None = None) -> None:
        if self.enabled:
            prefix = "" if tag is None else tag + "/"
            record = {prefix + key: value for key, value in stats.items()}
            record["r0"] = step  # for the soak harness, which counts r<slot> cells
            wf.log(record, step=step)


def main(max_epoch: int, log_interval: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    probe.event("worker", slot=rank, rank=rank)
    is_master = rank == 0
    progress = WandBProgressBarWrapper(
        wandb_project="fairseq-backtranslation" if is_master else None,
        run_name=os.environ.get("WANDB_NAME", "transformer_wmt_en_de"),
    )
    torch.manual_seed(rank)
    model = DistributedDataParallel(
        nn.Sequential(nn.Embedding(64, 16), nn.Flatten(), nn.Linear(16 * 8, 64))
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-4)
    start = time.time()
    num_updates = 0
    for epoch in range(1, max_epoch + 1):
        for _ in range(25):  # the epoch's batches
            src = torch.randint(0, 64, (16, 8))
            tgt = torch.randint(0, 64, (16,))
            loss = nn.functional.cross_entropy(model(src), tgt)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            num_updates += 1
            if num_updates % log_interval == 0 and is_master:
                stats = {"loss": loss.item(), "lr": 5e-4, "epoch": epoch}
                progress.log(stats, tag="train_inner", step=num_updates)
                probe.count(0)
                if num_updates == 10:
                    probe.event("ready")
    if is_master:
        probe.event("train_end")
    logger.info("done training in %.1f seconds", time.time() - start)
    # fairseq's cli_main returns here: no finish(), no destroy_process_group().


if __name__ == "__main__":
    rng = probe.rng()  # seeded by the harness: the same in every rank
    main(max_epoch=rng.randint(8, 14), log_interval=1)
