"""Training-loop stand-ins that the soak programs run in their workers.

A sibling module, not a script: the programs import it as ``from _work import train`` (the
script's directory is ``sys.path[0]`` under ``python`` and ``torchrun``, and spawn-started
children inherit ``sys.path``), so spawn workers unpickle these functions by reference.
Every record carries ``r{slot}``, the key the harness counts in the ``.wandb`` history, and
every log() that returns is counted through the probe.
"""

from __future__ import annotations

import os
import time

import wandb_funnel as wf
from wandb_funnel.soak import probe


def train(slot: int, steps: int, pause: float, raise_at: int = -1) -> int:
    """Log ``steps`` rows as worker ``slot``, sleeping about ``pause`` s between them."""
    probe.event("worker", slot=slot)
    rng = probe.rng()
    rng.seed(f"{os.environ.get(probe.SEED_ENV)}-{slot}")
    for step in range(steps):
        if step == raise_at:
            probe.event("train_end")
            raise RuntimeError(f"worker {slot} failed at step {step}")
        probe.attempt(slot)
        wf.log({f"r{slot}": step, "loss": 1.0 / (step + 1), "lr": 0.1}, step=step)
        probe.count(slot)
        if step == 10 and slot == 1:
            probe.event("ready")  # training is under way: the harness may strike now
        if pause:
            time.sleep(rng.uniform(0, 2 * pause))
    return steps


def train_star(args: tuple[int, int, float, int]) -> int:
    return train(*args)


def flat_out(slot: int, seconds: float) -> int:
    """Log as fast as possible for ``seconds`` (a sink can never keep up with this)."""
    probe.event("worker", slot=slot)
    end = time.monotonic() + seconds
    step = 0
    while time.monotonic() < end:
        probe.attempt(slot, 100)
        for _ in range(100):
            wf.log({f"r{slot}": step, "loss": 0.5, "lr": 0.1}, step=step)
            step += 1
        probe.count(slot, 100)
    probe.event("rate", slot=slot, per_s=step / seconds)
    return step
