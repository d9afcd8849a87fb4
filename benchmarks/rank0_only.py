"""Rank-0-only logging end to end, plain wandb against the funnel: the common case (HF,
Lightning, accelerate, timm, nanoGPT log from rank 0 only) must not pay for the funnel.

    python benchmarks/rank0_only.py --steps S [--repeats R]

Runs ``rank0_train.py`` under torchrun with 2 ranks, plain and with ``install()``, R times
each, interleaved (so drifting load hits both alike). Per mode, the medians of:
- ``job_s``: the whole ``torchrun`` command, start to exit;
- ``exit_s``: rank 0's last ``log`` returned to the command exited (what the funnel adds at
  the end: finishing the run through the logger instead of in rank 0).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from _common import HERE, report

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def one(steps: int, install: bool) -> tuple[float, float]:
    argv = [*TORCHRUN, str(HERE / "rank0_train.py"), "--steps", str(steps)]
    if install:
        argv.append("--install")
    start = time.time()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    end = time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"{argv} exited {proc.returncode}\n{proc.stderr[-3000:]}")
    trained = [
        float(line.split()[1]) for line in proc.stdout.splitlines() if line.startswith("TRAINED ")
    ]
    return end - start, end - trained[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[tuple[float, float]]] = {"plain": [], "funnel": []}
    for _ in range(args.repeats):
        for mode in times:
            times[mode].append(one(args.steps, install=mode == "funnel"))
    figures = {
        mode: {
            "job_s": statistics.median(t[0] for t in runs),
            "exit_s": statistics.median(t[1] for t in runs),
            "runs": len(runs),
        }
        for mode, runs in times.items()
    }
    figures["ratio_job"] = figures["funnel"]["job_s"] / figures["plain"]["job_s"]
    figures["steps"] = args.steps
    report(**figures)


if __name__ == "__main__":
    main()
