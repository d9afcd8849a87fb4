"""A multiprocessing Pool whose workers log into one run, ending one of several ways.

    python pool.py --method spawn|fork --ending normal|terminate|worker-raise|owner-raise|no-close

- normal: the Pool finishes its map, the funnel closes (exit 0).
- terminate: the Pool's context manager terminates workers mid-logging (exit 0).
- worker-raise: one worker raises; the exception reaches the owner, uncaught (exit 1).
- owner-raise: the owner raises while its workers log (exit 1).
- no-close: ``wf.init()`` and never ``finish()``: interpreter exit closes the run (exit 0).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time

from _work import train_star

import wandb_funnel as wf
from wandb_funnel.soak import probe


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--method", default="spawn")
    parser.add_argument("--ending", default="normal")
    args = parser.parse_args()
    rng = probe.rng()
    workers = rng.randint(2, 4)
    # Terminated or failing owners need workers that are still logging when it happens.
    long = args.ending in ("terminate", "owner-raise")
    steps = rng.randint(1000, 2000) if long else rng.randint(50, 300)
    pause = rng.uniform(0, 0.004)
    raise_at = rng.randint(0, steps - 1) if args.ending == "worker-raise" else -1
    tasks = [(slot, steps, pause, raise_at if slot == 1 else -1) for slot in range(1, 1 + workers)]
    ctx = mp.get_context(args.method)

    if args.ending == "no-close":
        run = wf.init(project="soak", close_timeout=10)
        with ctx.Pool(workers) as pool:
            probe.event("ready")
            pool.map(train_star, tasks)
        run.log({"r0": 0}, step=steps)
        probe.count(0)
        probe.event("train_end")
        return  # no finish(): the atexit hook closes the run

    with wf.Funnel(project="soak", close_timeout=10):
        with ctx.Pool(workers) as pool:
            result = pool.map_async(train_star, tasks)
            probe.event("ready")
            try:
                if args.ending == "terminate":
                    time.sleep(rng.uniform(1.0, 3.0))  # leaving the block terminates the Pool
                elif args.ending == "owner-raise":
                    time.sleep(rng.uniform(1.0, 3.0))
                    raise RuntimeError("the owner failed mid-training")
                else:
                    result.get(timeout=300)
            finally:
                probe.event("train_end")


if __name__ == "__main__":
    main()
