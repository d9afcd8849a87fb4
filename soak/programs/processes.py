"""Spawned ``mp.Process`` workers logging steadily for a few seconds: the program that the
harness disturbs (Ctrl-C, preemption, SIGKILL of a worker, of the logger, of wandb-core).

A Pool would not do here: one SIGKILLed Pool worker makes ``Pool.map`` wait forever, a
multiprocessing limit that has nothing to do with logging.
"""

from __future__ import annotations

import multiprocessing as mp
import sys

from _work import train

import wandb_funnel as wf
from wandb_funnel.soak import probe


def main() -> None:
    rng = probe.rng()
    workers = rng.randint(2, 3)
    # ``--steps N``: a longer run (a scenario that kills the logger three times needs one)
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 0
    steps = steps or rng.randint(800, 1500)
    ctx = mp.get_context("spawn")
    with wf.Funnel(project="soak", close_timeout=8):
        procs = [
            ctx.Process(target=train, args=(slot, steps, 0.003)) for slot in range(1, 1 + workers)
        ]
        for p in procs:
            p.start()  # worker 1 says "ready" once it has logged a few steps
        for p in procs:
            p.join()
        probe.event("train_end")
        probe.event("run_closing")  # leaving the block: a signal from here on finds it closing


if __name__ == "__main__":
    main()
