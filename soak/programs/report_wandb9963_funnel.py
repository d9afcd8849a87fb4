"""wandb/wandb#9963 through wandb-funnel: a SLURM job cancelled with ``scancel``.

https://github.com/wandb/wandb/issues/9963 ("wandb-core signal handling behavior")

The same script as ``report_wandb9963_plain.py`` with ``wandb.init`` replaced by ``wf.init``
(a private funnel: this process owns it; the logger process owns the wandb run): clean-up
logic that reacts to SIGINT/SIGTERM by stopping training, saving a checkpoint and calling
``run.finish(exit_code=128 + signum)``, then exiting with that code.

The harness injects ``scancel``: SIGTERM to every process of the job (the owner, the
funnel's logger and wandb-core), then SIGKILL to every survivor after a grace period. The
logger finishes on its own SIGTERM and the owner's ``finish()`` must not raise or hang when
the logger or wandb-core is already gone. wandb-core exits at once on SIGTERM, so the run can
keep only what wandb-core had written (``x_transaction_log_flush_interval`` = 1 s): no exit
record, and the records of about the last second may be missing.

Run: ``python report_wandb9963_funnel.py``. Slot 0 (the script) logs ``r0``.
"""

# mypy: disable-error-code="no-untyped-call"
# (torch's Tensor.backward and mp.spawn are untyped)
from __future__ import annotations

import signal
import sys
import time
from types import FrameType

import torch
from torch import nn

import wandb_funnel as wf
from wandb_funnel.soak import probe

stop_signal: list[int] = []


def request_stop(signum: int, frame: FrameType | None) -> None:
    """SLURM's signal: stop after the current step, save, finish the run, exit."""
    if not stop_signal:
        stop_signal.append(signum)


def main() -> int:
    rng = probe.rng()
    steps = rng.randint(400, 600)
    run = wf.init(project="slurm-training", config={"lr": 1e-3, "steps": steps})
    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    step = 0
    try:
        for step in range(steps):
            if stop_signal:
                break
            x = torch.randn(64, 32)
            loss = nn.functional.mse_loss(model(x), x.mean(dim=1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            probe.attempt(0)  # a SIGTERM may land between log() and count()
            run.log({"loss": loss.item(), "r0": step}, step=step)
            probe.count(0)
            if step == 20:
                probe.event("ready")
            time.sleep(rng.uniform(0.0, 0.02))
    finally:
        probe.event("train_end")
        torch.save(model.state_dict(), "checkpoint.pt")
        code = 128 + stop_signal[0] if stop_signal else 0
        print(f"stopping at step {step}; finishing the run with exit code {code}", flush=True)
        run.finish(exit_code=code)
    return 128 + stop_signal[0] if stop_signal else 0


if __name__ == "__main__":
    sys.exit(main())
