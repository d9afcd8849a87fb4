"""What every benchmark shares: a private offline environment, CPU sampling, and running a
measurement in a fresh interpreter that prints one JSON line.

Figures are only ever compared as ratios taken in the same run: the machine is shared.
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

HERE = pathlib.Path(__file__).resolve().parent
RESULT_PREFIX = "BENCH "


def scratch_env(directory: pathlib.Path, **extra: str) -> dict[str, str]:
    """The environment of a benchmark child: offline wandb in a private directory (WANDB_DIR
    and TMPDIR), with ``benchmarks/`` importable; output stays buffered, as in a real job."""
    # Imported here: the children import this module too, and some measure what importing
    # wandb_funnel costs.
    from wandb_funnel.soak.jobenv import clean_environment

    return clean_environment(
        directory,
        directory,
        drop=("WANDB_",),
        unbuffered=False,
        extra={"PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""), **extra},
    )


def run_child(
    script: str, args: list[str], directory: pathlib.Path, timeout: float = 600, **extra_env: str
) -> dict[str, Any]:
    """Run ``benchmarks/<script>`` in a fresh interpreter; returns the dict it reported."""
    directory.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [sys.executable, str(HERE / script), *args],
        cwd=directory,
        env=scratch_env(directory, **extra_env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,  # a failing child is reported below, with its output
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])  # type: ignore[no-any-return]
    raise RuntimeError(
        f"{script} {' '.join(args)} reported nothing (exit {proc.returncode})\n"
        f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )


def report(**figures: Any) -> None:
    """A child's result: one line on stdout."""
    print(RESULT_PREFIX + json.dumps(figures), flush=True)


def cpu_per_call(
    call: Callable[[int], None],
    calls: int,
    block: int,
    warmup: int = 2000,
    drain: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Process CPU (every thread: a feeder or flusher thread counts) per call, sampled in
    blocks of ``block`` calls; median and p99 over blocks, in microseconds. Wall time per
    call is reported beside it. ``drain`` finishes work the calls left to a background thread
    (a Queue's feeder pickles after ``put`` returns): the mean includes it, the blocks may
    not, so compare means where a thread does the work later."""
    for i in range(warmup):
        call(i)
    loop = _loop_cost(block)  # what the measuring loop itself costs per call: subtracted
    samples, walls = [], []
    i = warmup
    cpu0, wall0 = time.process_time_ns(), time.perf_counter_ns()
    for _ in range(calls // block):
        c, w = time.process_time_ns(), time.perf_counter_ns()
        for _ in range(block):
            call(i)
            i += 1
        samples.append((time.process_time_ns() - c) / block / 1000 - loop)
        walls.append((time.perf_counter_ns() - w) / block / 1000 - loop)
    if drain is not None:
        drain()
    total_cpu = (time.process_time_ns() - cpu0) / 1000
    total_wall = (time.perf_counter_ns() - wall0) / 1000
    n = (calls // block) * block
    return {
        "cpu_median_us": statistics.median(samples),
        "cpu_p99_us": percentile(samples, 99),
        "cpu_mean_us": total_cpu / n - loop,
        "wall_median_us": statistics.median(walls),
        "wall_mean_us": total_wall / n - loop,
        "loop_us": loop,
        "calls": n,
    }


def _loop_cost(block: int, blocks: int = 200) -> float:
    """The per-call cost of the measuring loop with a call that does nothing (median)."""

    def nothing(i: int) -> None:
        pass

    samples = []
    for _ in range(blocks):
        c = time.process_time_ns()
        for i in range(block):
            nothing(i)
        samples.append((time.process_time_ns() - c) / block / 1000)
    return statistics.median(samples)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def record(fields: int, step: int) -> dict[str, float]:
    """The logged record: 3 scalars (loss, accuracy, learning rate) or ``fields`` of them."""
    if fields == 3:
        return {"loss": 1.0 / (step + 1), "acc": step * 1e-6, "lr": 3e-4}
    return {f"metric_{k}": step * 1e-3 + k for k in range(fields)}


def rss_mb(pid: int | None = None) -> float:
    import psutil

    return float(psutil.Process(pid).memory_info().rss) / 2**20
