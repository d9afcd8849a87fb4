"""1. What one ``log()`` costs the process that calls it, for each way of getting metrics out.

    python benchmarks/log_cost.py --candidate funnel|wandb|queue|allgather [--fields 3|50]
                                  [--calls N] [--ranks R]

- funnel: a spawn worker's ``wf.log`` (the logger writes to the null sink, so the figure is
  the worker's cost alone, not wandb's speed).
- wandb: ``wandb.log`` in the process (offline; wandb-core's own CPU is not counted).
- queue: a ``multiprocessing.Queue`` funnel: ``put`` plus the feeder thread that pickles.
- allgather: ``torch.distributed.all_gather`` of the loss (gloo, R ranks) and a rank-0
  ``wandb.log``; measured on rank 0, where the collective waits for the slowest rank.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
from typing import Any

from _common import cpu_per_call, record, report

RING = 1024  # records are built up front: the user's dict is not the logger's cost


def _records(fields: int) -> list[dict[str, Any]]:
    return [record(fields, i) for i in range(RING)]


def _funnel_worker(fields: int, calls: int, out: Any) -> None:
    import wandb_funnel as wf

    recs = _records(fields)
    run = wf.init()
    figures = cpu_per_call(
        lambda i: run.log(recs[i % RING], step=i), calls, block=256, drain=run.flush
    )
    run.finish()
    out.put(figures)


def funnel(fields: int, calls: int) -> dict[str, Any]:
    import wandb_funnel as wf

    ctx = mp.get_context("spawn")
    with wf.Funnel(project="bench", close_timeout=30) as f:
        out = ctx.SimpleQueue()
        worker = ctx.Process(target=_funnel_worker, args=(fields, calls, out))
        worker.start()
        figures: dict[str, Any] = out.get()
        worker.join()
    stats = f.stats or {}
    figures["dropped"] = stats.get("_funnel/dropped_records")
    figures["logged"] = stats.get("_funnel/records")
    return figures


def plain_wandb(fields: int, calls: int) -> dict[str, Any]:
    import wandb

    recs = _records(fields)
    run = wandb.init(project="bench", settings=wandb.Settings(console="off"))
    figures = cpu_per_call(lambda i: run.log(recs[i % RING], step=i), calls, block=32, warmup=200)
    run.finish()
    return figures


def _drain(queue: Any) -> None:
    rows: dict[int, dict[str, Any]] = {}
    while True:
        item = queue.get()
        if item is None:
            return
        _rank, step, data = item
        rows.setdefault(step, {}).update(data)
        if len(rows) > 4096:
            rows.clear()


def mp_queue(fields: int, calls: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    consumer = ctx.Process(target=_drain, args=(queue,))
    consumer.start()
    recs = _records(fields)

    def drain() -> None:
        queue.put(None)
        queue.close()
        queue.join_thread()  # the feeder thread has pickled and written everything

    figures = cpu_per_call(
        lambda i: queue.put((1, i, recs[i % RING])), calls, block=256, drain=drain
    )
    consumer.join()
    return figures


def _allgather_rank(rank: int, world: int, port: int, fields: int, calls: int, out: Any) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    recs = _records(fields)
    keys = list(recs[0])
    gathered = [torch.zeros(len(keys)) for _ in range(world)]
    run = None
    if rank == 0:
        import wandb

        run = wandb.init(project="bench", settings=wandb.Settings(console="off"))

    def step(i: int) -> None:
        values = torch.tensor([recs[i % RING][k] for k in keys])
        dist.all_gather(gathered, values)
        if run is not None:
            mean = torch.stack(gathered).mean(0).tolist()
            run.log(dict(zip(keys, mean, strict=False)), step=i)

    figures = cpu_per_call(step, calls, block=16, warmup=100)
    if run is not None:
        run.finish()
        out.put(figures)
    dist.barrier()
    dist.destroy_process_group()


def allgather(fields: int, calls: int, ranks: int) -> dict[str, Any]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    procs = [
        ctx.Process(target=_allgather_rank, args=(r, ranks, port, fields, calls, out))
        for r in range(ranks)
    ]
    for p in procs:
        p.start()
    figures: dict[str, Any] = out.get()
    for p in procs:
        p.join()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--candidate", required=True)
    parser.add_argument("--fields", type=int, default=3)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    if args.candidate == "funnel":
        figures = funnel(args.fields, args.calls)
    elif args.candidate == "wandb":
        figures = plain_wandb(args.fields, args.calls)
    elif args.candidate == "queue":
        figures = mp_queue(args.fields, args.calls)
    elif args.candidate == "allgather":
        figures = allgather(args.fields, args.calls, args.ranks)
    else:
        raise SystemExit(f"unknown candidate {args.candidate!r}")
    report(
        candidate=args.candidate, fields=args.fields, ranks=args.ranks, pid=os.getpid(), **figures
    )


if __name__ == "__main__":
    main()
