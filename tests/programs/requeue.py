"""A training that checkpoints and is restarted: tests/processes/test_requeue.py.

    torchrun --nproc-per-node 2 --max-restarts 1 requeue.py torchrun --ckpt DIR [--plain]
    python requeue.py slurm --ckpt DIR [--plain]        (SLURM_JOB_ID, SLURM_RESTART_COUNT set)

Each attempt resumes from the last checkpoint (every 5 steps) and logs ``loss`` and
``attempt`` (its restart count) at each step up to ``--steps``:

- ``torchrun``: two ranks in lockstep (a barrier a step); on the first attempt rank 1 fails
  at ``--fail-at``, torchrun restarts both.
- ``slurm``: one process; on the first attempt it REPORTs ``reached`` at ``--fail-at`` (and at
  each ``--hold ATTEMPT:STEP``) and waits for the test's signal (SIGTERM: a preemption;
  SIGKILL: a lost node); the test then runs it again with ``SLURM_RESTART_COUNT`` raised.

``--plain``: plain wandb, in rank 0 only (as users log from rank 0 today).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from _prelude import report


def restart_count(mode: str) -> int:
    name = "TORCHELASTIC_RESTART_COUNT" if mode == "torchrun" else "SLURM_RESTART_COUNT"
    return int(os.environ.get(name) or 0)


def load(ckpt: str) -> int:
    """The step to start from: the one after the last checkpoint."""
    try:
        with open(os.path.join(ckpt, "ckpt.json")) as f:
            return int(json.load(f)["step"]) + 1
    except FileNotFoundError:
        return 0


def save(ckpt: str, step: int) -> None:
    os.makedirs(ckpt, exist_ok=True)
    tmp = os.path.join(ckpt, "ckpt.json.tmp")
    with open(tmp, "w") as f:
        json.dump({"step": step}, f)
    os.replace(tmp, os.path.join(ckpt, "ckpt.json"))


def open_run(args: argparse.Namespace, rank: int) -> Any:
    config = {"lr": 0.1, "name": args.name}
    if args.plain:
        import wandb

        return wandb.init(project="requeue", name=args.name, config=config) if rank == 0 else None
    import wandb_funnel as wf

    return wf.init(project="requeue", name=args.name, config=config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["torchrun", "slurm"])
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fail-at", type=int, default=12)
    parser.add_argument("--name", default="requeue")
    parser.add_argument("--plain", action="store_true")
    parser.add_argument(
        "--hold",
        action="append",
        default=[],
        metavar="ATTEMPT:STEP",
        help="slurm: also REPORT reached and wait for a signal at this step of this attempt",
    )
    args = parser.parse_args()
    holds = {tuple(int(n) for n in h.split(":")) for h in args.hold}
    attempt = restart_count(args.mode)
    rank = 0
    barrier: Any = lambda: None  # noqa: E731
    if args.mode == "torchrun":
        from datetime import timedelta

        import torch.distributed as dist

        # torchrun's agent shares one store with the ranks across restarts, and the process
        # group's keys in it are not per attempt: a restarted rank can read a dead one's
        # address ("Gloo connectFullMesh failed ... Connection refused"; pytorch#135712,
        # #167288; likelier on a loaded box). Each attempt's keys under a prefix of their
        # own avoid it (as TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 would).
        store = dist.TCPStore(  # type: ignore[attr-defined]
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=60),
            wait_for_workers=False,
        )
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"attempt-{attempt}", store),  # type: ignore[attr-defined]
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
        )
        rank = dist.get_rank()
        barrier = dist.barrier
    run = open_run(args, rank)
    start = load(args.ckpt)
    logger_pid = os.environ.get("_WANDB_FUNNEL_LOGGER_PID")
    report(rank=rank, attempt=attempt, start=start, run_id=getattr(run, "id", None))
    for step in range(start, args.steps):
        if attempt == 0 and step == args.fail_at and args.mode == "torchrun" and rank == 1:
            sys.exit(3)  # a rank fails: torchrun restarts the job
        held = (attempt == 0 and step == args.fail_at) or (attempt, step) in holds
        if args.mode == "slurm" and held:
            report(reached=step, logger_pid=logger_pid)
            time.sleep(120)  # the test's signal comes here (a preemption, a lost node)
        if run is not None:
            run.log({"loss": 1.0 / (step + 1), "attempt": attempt, f"r{rank}": step}, step=step)
        barrier()
        if rank == 0 and step % 5 == 4:
            save(args.ckpt, step)
        barrier()
    if run is not None:
        run.finish()
    report(done=True, rank=rank, attempt=attempt)


if __name__ == "__main__":
    main()
