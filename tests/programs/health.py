"""One DDP rank of tests/processes/test_health.py (issue 27), under real torchrun (gloo, CPU).

    torchrun --standalone --nproc-per-node 4 health.py stall|nan|spread [--steps N]

Every rank logs a step, then ``all_reduce``s a tensor with the others (a DDP step):

- ``stall``: rank 3 sleeps before step 30 (for minutes) while ranks 0-2 wedge in the
  all_reduce of step 30; ``stall_timeout=10`` (with ``--options-from-env``, no keyword:
  the job's ``WANDB_FUNNEL_STALL_TIMEOUT`` says it); rank 0 REPORTs ``ready`` at step 5;
- ``nan``: rank 1 logs ``loss`` NaN at step 25;
- ``spread``: ``reduce={"step_time": "spread"}``; each rank logs the time its own work took
  (before the all_reduce, which would make every rank's step as slow as the slowest), and
  rank 2's work takes 0.2 s longer from step 10; rank 0 REPORTs ``ready`` at step 5.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from _prelude import report

import wandb_funnel as wf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=["stall", "nan", "spread"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--options-from-env", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    options: dict[str, Any] = {"project": "health", "reorder_window": 30}
    if args.scenario == "stall" and not args.options_from_env:
        options["stall_timeout"] = 10
    if args.scenario == "spread":
        options["reduce"] = {"step_time": "spread"}
    run = wf.init(**options)
    if rank == 0:
        report(run_id=run.id, pid=os.getpid())
    for step in range(args.steps):
        t0 = time.monotonic()
        if args.scenario == "stall" and rank == 3 and step == 30:
            time.sleep(600)  # stopped by the test long before
        work = 0.02
        if args.scenario == "spread" and rank == 2 and step >= 10:
            work += 0.2
        time.sleep(work)
        data = {"loss": 1.0 / (step + 1), "step_time": time.monotonic() - t0}
        if args.scenario == "nan" and rank == 1 and step == 25:
            data["loss"] = math.nan
        run.log(data, step=step)
        if rank == 0 and step == 5:
            report(ready=True)
        dist.all_reduce(torch.ones(1))
    run.finish()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
