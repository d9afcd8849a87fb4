"""A spawn Pool in which every worker logs each step into one wandb run (offline by default).

    python examples/pool_spawn.py --workers 4 --steps 200

Each worker is its own rank (1..N, the owner is 0) and logs ``loss`` and ``throughput`` at
every step; ``loss`` is reduced across workers with the default mean, ``throughput`` with sum.
The run lands in ./wandb (or $WANDB_DIR) with one row per step, in step order.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import random

import wandb_funnel as wf


def train_worker(args: tuple[int, int]) -> int:
    worker, steps = args
    rng = random.Random(worker)
    with wf.init() as run:  # attaches to the funnel found in the environment
        for step in range(steps):
            loss = math.exp(-step / 50) + rng.random() * 0.01
            run.log(
                {"loss": loss, "throughput": 100.0, "worker_loss": {f"w{worker}": loss}}, step=step
            )
    return worker


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--project", default="wandb-funnel-demo")
    parser.add_argument("--start-method", default="spawn", choices=mp.get_all_start_methods())
    args = parser.parse_args(argv)

    with wf.Funnel(project=args.project, reduce={"throughput": "sum"}, config=vars(args)) as funnel:
        funnel.log({"lr": 0.1}, step=0)
        ctx = mp.get_context(args.start_method)
        with ctx.Pool(args.workers) as pool:
            done = pool.map(
                train_worker, [(w, args.steps) for w in range(args.workers)], chunksize=1
            )
    stats = funnel.stats or {}
    print(
        f"run {funnel.run_id}: {len(done)} workers x {args.steps} steps -> "
        f"{stats.get('_funnel/records')} records logged, "
        f"{stats.get('_funnel/dropped_records')} dropped, "
        f"{stats.get('_funnel/late_records')} late; "
        f"dir {os.environ.get('WANDB_DIR', '.')}/wandb"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
