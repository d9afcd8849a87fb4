"""2. How many records per second one logger takes in, from P producer processes.

    python benchmarks/ingest.py --mode funnel|queue --producers P [--ranks-per-producer K]
                                [--records N]

- funnel: P spawn processes, each holding K ranks (K connections: 256 or 1,024 ranks are
  simulated by a few processes), log N records per rank as fast as they can, every rank at
  the same steps; the logger orders and merges them into rows and writes them to the null
  sink (``WANDB_FUNNEL_SINK=null``), so the figure is the funnel's capacity, not wandb's.
  Timed from the start signal to ``close()`` returning: every record taken in, ordered,
  merged, and the run finished.
- queue: the same producers ``put`` into one ``multiprocessing.Queue``, and the consumer
  (this process) merges records into rows by step.

Also reports the logger's peak RSS (sampled), and records dropped.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import threading
import time
from typing import Any

from _common import record, report, rss_mb


def _funnel_producer(ranks: list[int], records: int, start: Any, ready: Any) -> None:
    import wandb_funnel as wf
    from wandb_funnel._worker.run import AttachInfo, Run

    info = AttachInfo.from_env(__import__("os").environ)
    assert info is not None
    runs = [Run(info, requested_rank=r) for r in ranks] if len(ranks) > 1 else [wf.init()]
    for run in runs:
        run._attach(30.0)
    rec = record(3, 0)
    ready.put(len(runs))
    start.wait()
    for step in range(records):
        for run in runs:
            run.log(rec, step=step)
    # Ranks finish at once, as real ranks would: one after another, 256 goodbye round trips
    # would be timed as if they were ingest.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(64, len(runs))) as pool:
        list(pool.map(lambda run: run.finish(), runs))


class PeakRss(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop = pid, 0.0, threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.05):
            try:
                self.peak = max(self.peak, rss_mb(self.pid))
            except Exception:
                return


def funnel(producers: int, per_producer: int, records: int) -> dict[str, Any]:
    import wandb_funnel as wf

    ctx = mp.get_context("spawn")
    start, ready = ctx.Event(), ctx.SimpleQueue()
    f = wf.Funnel(project="bench", close_timeout=120, max_pending_rows=100_000).start()
    sampler = PeakRss(f.logger_pid or 0)
    sampler.start()
    procs = []
    for p in range(producers):
        ranks = list(range(1 + p * per_producer, 1 + (p + 1) * per_producer))
        procs.append(ctx.Process(target=_funnel_producer, args=(ranks, records, start, ready)))
    for proc in procs:
        proc.start()
    for _ in procs:
        ready.get()
    t0 = time.perf_counter()
    start.set()
    for proc in procs:
        proc.join()
    t_sent = time.perf_counter()
    f.close()
    elapsed = time.perf_counter() - t0
    sampler.stop.set()
    stats = f.stats or {}
    taken = stats.get("_funnel/records", 0)
    return {
        "records_per_s": taken / elapsed,
        "records": taken,
        "sent": producers * per_producer * records,
        "dropped": stats.get("_funnel/dropped_records"),
        "late": stats.get("_funnel/late_records"),
        "rows": stats.get("_funnel/rows"),
        "seconds": elapsed,
        "producers_seconds": t_sent - t0,
        "logger_peak_rss_mb": sampler.peak,
    }


def _queue_producer(rank: int, records: int, queue: Any, start: Any) -> None:
    rec = record(3, 0)
    start.wait()
    for step in range(records):
        queue.put((rank, step, rec))
    queue.put(None)
    queue.close()
    queue.join_thread()


def mp_queue(producers: int, records: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue, start = ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=_queue_producer, args=(r, records, queue, start))
        for r in range(producers)
    ]
    for proc in procs:
        proc.start()
    time.sleep(1.0)  # let them start: the funnel's producers are also attached before t0
    rows: dict[int, dict[str, Any]] = {}
    taken, done = 0, 0
    t0 = time.perf_counter()
    start.set()
    while done < producers:
        item = queue.get()
        if item is None:
            done += 1
            continue
        _rank, step, data = item
        row = rows.setdefault(step, {})
        row.update(data)
        taken += 1
    elapsed = time.perf_counter() - t0
    for proc in procs:
        proc.join()
    return {
        "records_per_s": taken / elapsed,
        "records": taken,
        "rows": len(rows),
        "seconds": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", required=True)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--ranks-per-producer", type=int, default=1)
    parser.add_argument("--records", type=int, default=100_000)
    args = parser.parse_args()
    if args.mode == "funnel":
        figures = funnel(args.producers, args.ranks_per_producer, args.records)
    elif args.mode == "queue":
        figures = mp_queue(args.producers, args.records)
    else:
        raise SystemExit(f"unknown mode {args.mode!r}")
    report(
        mode=args.mode,
        producers=args.producers,
        ranks=args.producers * args.ranks_per_producer,
        **figures,
    )


if __name__ == "__main__":
    main()
