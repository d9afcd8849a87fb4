"""``FunnelLogger``: Lightning's ``WandbLogger``, with every rank logging through the funnel.

    from wandb_funnel.integrations.lightning import FunnelLogger
    trainer = L.Trainer(logger=FunnelLogger(project="p", name="run"), strategy="ddp", ...)

Same constructor arguments as ``WandbLogger`` (funnel options such as ``reduce=`` may be added
among its ``**kwargs``). The difference: ``WandbLogger`` logs from rank 0 only, so a metric
logged with ``self.log(..., sync_dist=False)`` reaches the run as rank 0's value, and
``sync_dist=True`` costs an all_reduce per metric. Here ``log_metrics`` runs on every rank
and the funnel reduces across ranks (mean by default; ``trainer/global_step`` and ``epoch``
keep their value), without a collective. Hyperparameters (``save_hyperparameters()``) are
logged from rank 0 into the run's config, as ``WandbLogger`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.fabric.utilities.logger import _add_prefix
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from wandb_funnel._wandb_module.install import install, open_installed_run

__all__ = ["FunnelLogger"]

STEP_KEY = "trainer/global_step"
# Keys every rank logs with the same value: averaging would turn them into floats.
_SAME_ON_EVERY_RANK = {STEP_KEY: "first", "epoch": "first"}


class FunnelLogger(WandbLogger):
    """Lightning's ``WandbLogger`` whose ``log_metrics`` runs on every rank, reduced by the
    funnel into one run without a collective (the module's docstring says how)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Installed, so that `wandb.log` and `wandb.config` in the user's model code reach
        # this run too, as they reach WandbLogger's (and options exported by `wandb-funnel
        # run` apply).
        install()
        reduce = self._wandb_init.get("reduce")
        if isinstance(reduce, str):
            reduce = {"*": reduce}  # exact keys below still win over the glob
        if reduce is None or isinstance(reduce, Mapping):
            self._wandb_init["reduce"] = {**_SAME_ON_EVERY_RANK, **(reduce or {})}

    @property
    def experiment(self) -> Any:
        """The funnel's run, on every rank (``WandbLogger``'s exists on rank 0 only)."""
        if self._experiment is None:
            if self._offline:
                self._wandb_init.setdefault("mode", "offline")
            run: Any = open_installed_run(dict(self._wandb_init))
            if getattr(rank_zero_only, "rank", 0) == 0:
                run.define_metric(STEP_KEY)
                run.define_metric("*", step_metric=STEP_KEY, step_sync=True)
            self._experiment = run
        return self._experiment

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        """Every rank's metrics reach the run (``WandbLogger``'s is rank 0 only)."""
        row: dict[str, Any] = dict(_add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR))
        if step is not None:
            row[STEP_KEY] = step
        self.experiment.log(row)
