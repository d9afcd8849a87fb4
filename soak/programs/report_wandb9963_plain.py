"""wandb/wandb#9963, plain wandb: a SLURM job cancelled with ``scancel``.

https://github.com/wandb/wandb/issues/9963 ("wandb-core signal handling behavior")

What the user did: a training script (``python3 script.py`` in a SLURM job) with
``wandb.init(...)`` and clean-up logic that reacts to SIGINT/SIGTERM by stopping training and
calling ``run.finish()``. ``scancel <jobid>`` signals *every* process of the job, wandb-core
included (SLURM then SIGKILLs whatever is still alive after ``KillWait`` seconds).

What went wrong with plain wandb (0.19.9): wandb-core exits at once on the signal, without
finishing the run; when the script reaches ``run.finish()`` in its clean-up it gets a
``BrokenPipeError``, and the run stays "running" in the UI, then "crashed".

The program only trains; the harness injects the fault: SIGTERM to every process of the job
(owner, wandb-core, ...) once the program said ``ready``, then SIGKILL to every survivor
after a grace period.

Run: ``python report_wandb9963_plain.py``. Slot 0 (the script) logs ``r0``.
"""

# mypy: disable-error-code="no-untyped-call"
# (torch's Tensor.backward and mp.spawn are untyped)
from __future__ import annotations

import signal
import sys
import time
from types import FrameType

import torch
import wandb
from torch import nn

from wandb_funnel.soak import probe

stop_signal: list[int] = []


def request_stop(signum: int, frame: FrameType | None) -> None:
    """SLURM's signal: stop after the current step, save, finish the run, exit."""
    if not stop_signal:
        stop_signal.append(signum)


def main() -> int:
    rng = probe.rng()
    steps = rng.randint(400, 600)
    run = wandb.init(project="slurm-training", config={"lr": 1e-3, "steps": steps})
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
