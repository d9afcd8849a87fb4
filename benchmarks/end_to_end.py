"""3 and 4. N ranks x S steps into real offline wandb, from the first log to every process
exited; and the wandb calls it took.

    python benchmarks/end_to_end.py --mode funnel|per-rank --ranks N --steps S

- funnel: a spawn Pool of N workers logs S steps each through ``wf.log``; the logger merges
  the ranks of a step into one row, so wandb sees S ``log`` calls (``_funnel/rows``).
- per-rank: N processes, each with its own ``wandb.init`` run (the usual workaround): N x S
  calls and N runs.

Times: ``first_log_to_finished`` runs from the first record to the run finished (the
Funnel's ``close()`` returned, or the last per-rank ``finish()``); ``exit_latency`` runs from
the end of the training code (the last ``log`` returned everywhere) to every process of the
job gone (workers, the logger, wandb-core), measured by the parent of the job.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

import psutil
from _common import record, report

MARK = "WANDB_FUNNEL_BENCH_MARK"


def _funnel_job(ranks: int, steps: int) -> None:
    import multiprocessing as mp

    import wandb_funnel as wf

    with wf.Funnel(project="bench", reduce={"loss": "mean"}) as funnel:
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(ranks)
        with ctx.Pool(ranks, initializer=_keep, initargs=(barrier,)) as pool:
            marks = pool.starmap(_funnel_rank, [(steps,)] * ranks, chunksize=1)
        print("FIRST", min(m[0] for m in marks), flush=True)
        print("TRAINED", max(m[1] for m in marks), flush=True)
    print("FINISHED", time.time(), json.dumps(funnel.stats), flush=True)


_barrier: Any = None


def _keep(barrier: Any) -> None:
    global _barrier
    _barrier = barrier


def _funnel_rank(steps: int) -> tuple[float, float]:
    import wandb_funnel as wf

    run = wf.init()
    _barrier.wait()  # ranks start training together, as DDP ranks do after init
    first = time.time()
    for step in range(steps):
        run.log(record(3, step), step=step)
    return first, time.time()


def _per_rank_job(ranks: int, steps: int) -> None:
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(ranks)
    with ctx.Pool(ranks, initializer=_keep, initargs=(barrier,)) as pool:
        marks = pool.starmap(_per_rank_run, [(r, steps) for r in range(ranks)], chunksize=1)
    print("FIRST", min(m[0] for m in marks), flush=True)
    print("TRAINED", max(m[1] for m in marks), flush=True)
    print("FINISHED", max(m[2] for m in marks), json.dumps({"calls": ranks * steps}), flush=True)


def _per_rank_run(rank: int, steps: int) -> tuple[float, float, float]:
    import wandb

    run = wandb.init(project="bench", name=f"rank-{rank}", settings=wandb.Settings(console="off"))
    _barrier.wait()
    first = time.time()
    for step in range(steps):
        run.log(record(3, step), step=step)
    trained = time.time()
    run.finish()
    return first, trained, time.time()


def measure(mode: str, ranks: int, steps: int) -> dict[str, Any]:
    """Run the job as its own process tree and time it from outside."""
    mark = f"{os.getpid()}-{time.time()}"
    env = dict(os.environ, **{MARK: mark})
    proc = subprocess.Popen(
        [sys.executable, __file__, "--job", mode, "--ranks", str(ranks), "--steps", str(steps)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = proc.communicate(timeout=600)
    lines = {ln.split(" ", 1)[0]: ln.split(" ", 1)[1] for ln in out.splitlines() if " " in ln}
    gone = _all_gone(mark)
    first = float(lines["FIRST"])
    trained = float(lines["TRAINED"])
    finished_at, extra = lines["FINISHED"].split(" ", 1)
    stats = json.loads(extra)
    calls = stats.get("_funnel/rows", stats.get("calls"))
    return {
        "first_log_to_finished_s": float(finished_at) - first,
        "exit_latency_s": gone - trained,
        "wandb_log_calls": calls,
        "records": ranks * steps,
        "runs": 1 if mode == "funnel" else ranks,
        "exit_code": proc.returncode,
    }


def _all_gone(mark: str, limit: float = 60.0) -> float:
    """The wall time at which no process carrying ``mark`` was left (polled every 10 ms)."""
    deadline = time.time() + limit
    while time.time() < deadline:
        alive = False
        for p in psutil.process_iter(["pid"]):
            try:
                if p.environ().get(MARK) == mark and p.status() != psutil.STATUS_ZOMBIE:
                    alive = True
                    break
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if not alive:
            return time.time()
        time.sleep(0.01)
    raise RuntimeError(f"processes of the job still alive after {limit}s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="funnel")
    parser.add_argument("--job", default=None)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    if args.job == "funnel":
        _funnel_job(args.ranks, args.steps)
    elif args.job == "per-rank":
        _per_rank_job(args.ranks, args.steps)
    else:
        report(
            mode=args.mode,
            ranks=args.ranks,
            steps=args.steps,
            **measure(args.mode, args.ranks, args.steps),
        )


if __name__ == "__main__":
    sys.path.insert(0, str(pathlib.Path(__file__).parent))
    main()
