"""5. What a worker pays to import wandb_funnel and attach, against bare Python and against
``import wandb``; and the logger's memory while one rank stalls.

    python benchmarks/memory.py --part worker|stalled-rank

- worker: a Funnel runs here; fresh interpreters measure RSS and wall time for ``import
  wandb_funnel`` plus ``wf.init()`` (attached: welcomed by the logger), and check that wandb
  was not imported; another measures ``import wandb``. Each figure is the median of 5.
- stalled-rank: 8 ranks log; rank 1 logs its first step, then stops (a hung dataloader)
  while the others log 20,000 steps. Rows wait for rank 1 until the reorder window or the
  pending-row limit lets them go, so the logger's RSS must stay flat rather than grow with
  the steps: reported as samples over time.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from _common import record, report, rss_mb

# Reads /proc itself: importing psutil first would pre-load modules the import under test needs.
_PROBE = """
import os, sys, time
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
base = rss()
t0 = time.perf_counter()
{body}
elapsed = time.perf_counter() - t0
grown = rss() - base
import json
print(json.dumps({{"seconds": elapsed, "rss_mb": grown / 2**20,
                  "base_rss_mb": base / 2**20, "wandb_imported": "wandb" in sys.modules}}))
"""

_ATTACH = """
import wandb_funnel as wf
run = wf.init()
assert run._stream is not None and run._stream._welcomed, "not welcomed"
"""


def _probe(body: str, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE.format(body=body)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _median_of(body: str, env: dict[str, str], n: int = 5) -> dict[str, Any]:
    runs = [_probe(body, env) for _ in range(n)]
    return {
        "seconds": statistics.median(r["seconds"] for r in runs),
        "rss_mb": statistics.median(r["rss_mb"] for r in runs),
        "base_rss_mb": statistics.median(r["base_rss_mb"] for r in runs),
        "wandb_imported": any(r["wandb_imported"] for r in runs),
    }


def worker() -> dict[str, Any]:
    import wandb_funnel as wf

    with wf.Funnel(project="bench"):
        env = dict(os.environ)  # the funnel's address and token, as a spawned worker sees them
        attach = _median_of(_ATTACH, env)
    bare_env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_FUNNEL")}
    return {
        "funnel_import_attach": attach,
        "wandb_import": _median_of("import wandb", bare_env),
        "bare": _median_of("pass", bare_env),
    }


def _rank(rank: int, steps: int, stall: bool, start: Any) -> None:
    import wandb_funnel as wf

    run = wf.init(rank=rank)
    start.wait()
    for step in range(steps):
        run.log(record(3, step), step=step)
        if stall:
            time.sleep(3600)  # stalled until the benchmark ends it
        elif step % 10 == 0:
            time.sleep(0.001)  # about training speed, so the run takes a few seconds


def stalled_rank() -> dict[str, Any]:
    import wandb_funnel as wf

    ctx = mp.get_context("spawn")
    start = ctx.Event()
    samples: list[tuple[float, float]] = []
    f = wf.Funnel(project="bench", close_timeout=30).start()
    procs = [ctx.Process(target=_rank, args=(r, 20_000, r == 1, start)) for r in range(1, 8)]
    for p in procs:
        p.start()
    time.sleep(2.0)
    t0 = time.perf_counter()
    start.set()
    while any(p.is_alive() for p in procs if p is not procs[0]):
        samples.append((time.perf_counter() - t0, rss_mb(f.logger_pid)))
        time.sleep(0.25)
    samples.append((time.perf_counter() - t0, rss_mb(f.logger_pid)))
    procs[0].kill()
    procs[0].join()
    f.close()
    stats = f.stats or {}
    quarter = max(1, len(samples) // 4)
    return {
        "logger_rss_mb_first_quarter": statistics.median(s[1] for s in samples[:quarter]),
        "logger_rss_mb_last_quarter": statistics.median(s[1] for s in samples[-quarter:]),
        "logger_rss_mb_peak": max(s[1] for s in samples),
        "rows": stats.get("_funnel/rows"),
        "records": stats.get("_funnel/records"),
        "seconds": samples[-1][0],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--part", required=True)
    args = parser.parse_args()
    figures = worker() if args.part == "worker" else stalled_rank()
    report(part=args.part, **figures)


if __name__ == "__main__":
    main()
