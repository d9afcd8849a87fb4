"""The benchmark suite: every measurement, side by side in one run, written as JSON, a
Markdown table and a PNG plot (``tox -e bench``).

    python benchmarks/run.py [--out benchmarks/results] [--quick]

Each measurement runs in fresh interpreters (``_common.run_child``), one after another, never
two at once. Absolute figures move with the machine's load; the ratios, taken minutes apart
in the same run, are what to compare. ``--quick`` cuts the sizes (a smoke run: the figures
are not worth quoting).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import tempfile
from typing import Any

from _common import HERE, run_child
from plot import plot
from table import markdown

TARGETS = {
    "log_us": 2.0,
    "ingest_4": 500_000,
    "ingest_1024": 200_000,
    "exit_s": 1.0,
    "import_s": 0.1,
    "import_mb": 15.0,
    "overhead_pct": 1.0,
}


def machine() -> dict[str, Any]:
    import psutil

    return {
        "date": datetime.date.today().isoformat(),
        "cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": os.getloadavg()[0],
    }


def suite(scratch: pathlib.Path, quick: bool) -> dict[str, Any]:
    null = {"WANDB_FUNNEL_SINK": "null"}
    n = 20_000 if quick else 200_000
    results: dict[str, Any] = {"machine": machine(), "targets": TARGETS}

    def child(name: str, script: str, *args: str, **env: str) -> dict[str, Any]:
        print(f"-- {name}", flush=True)
        figures = run_child(script, list(args), scratch / name, **env)
        print(f"   {json.dumps(figures)}", flush=True)
        return figures

    cost: dict[str, Any] = {}
    for fields in (3, 50):
        f = str(fields)
        cost[f"funnel/{f}"] = child(
            f"cost-funnel-{f}",
            "log_cost.py",
            "--candidate",
            "funnel",
            "--fields",
            f,
            "--calls",
            str(n),
            **null,
        )
        cost[f"queue/{f}"] = child(
            f"cost-queue-{f}",
            "log_cost.py",
            "--candidate",
            "queue",
            "--fields",
            f,
            "--calls",
            str(n),
        )
        cost[f"wandb/{f}"] = child(
            f"cost-wandb-{f}",
            "log_cost.py",
            "--candidate",
            "wandb",
            "--fields",
            f,
            "--calls",
            str(n // 20),
        )
        for ranks in ("2", "4"):
            cost[f"allgather{ranks}/{f}"] = child(
                f"cost-allgather{ranks}-{f}",
                "log_cost.py",
                "--candidate",
                "allgather",
                "--fields",
                f,
                "--ranks",
                ranks,
                "--calls",
                str(n // 100),
            )
    results["log_cost"] = cost

    ingest: dict[str, Any] = {}
    total = 40_000 if quick else 400_000  # records per configuration, however many producers
    for producers in ("1", "4", "16"):
        records = str(total // int(producers))
        ingest[f"funnel/{producers}"] = child(
            f"ingest-funnel-{producers}",
            "ingest.py",
            "--mode",
            "funnel",
            "--producers",
            producers,
            "--records",
            records,
            **null,
        )
        ingest[f"queue/{producers}"] = child(
            f"ingest-queue-{producers}",
            "ingest.py",
            "--mode",
            "queue",
            "--producers",
            producers,
            "--records",
            records,
        )
    for ranks, per in (("256", "64"), ("1024", "256")):
        steps = str(total // int(ranks))
        ingest[f"funnel/{ranks} ranks"] = child(
            f"ingest-ranks-{ranks}",
            "ingest.py",
            "--mode",
            "funnel",
            "--producers",
            "4",
            "--ranks-per-producer",
            per,
            "--records",
            steps,
            **null,
        )
    results["ingest"] = ingest

    steps = "300" if quick else "2000"
    results["end_to_end"] = {
        mode: child(
            f"e2e-{mode}", "end_to_end.py", "--mode", mode, "--ranks", "4", "--steps", steps
        )
        for mode in ("funnel", "per-rank")
    }
    results["memory"] = {
        part: child(f"memory-{part}", "memory.py", "--part", part)
        for part in ("worker", "stalled-rank")
    }
    train: dict[str, list[dict[str, Any]]] = {"none": [], "funnel": [], "allgather": []}
    for _ in range(1 if quick else 3):  # interleaved, so drifting load hits every mode alike
        for mode in train:
            train[mode].append(
                child(
                    f"train-{mode}",
                    "training.py",
                    "--mode",
                    mode,
                    "--steps",
                    "300" if quick else "1500",
                )
            )
    results["training"] = train
    results["rank0_only"] = child(
        "rank0-only",
        "rank0_only.py",
        "--steps",
        "300" if quick else "2000",
        "--repeats",
        "1" if quick else "3",
    )
    results["media"] = child("media", "media.py", "--images", "200" if quick else "2000")
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=str(HERE / "results"))
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wandb-funnel-bench-") as scratch:
        results = suite(pathlib.Path(scratch), args.quick)
    (out / "bench.json").write_text(json.dumps(results, indent=1))
    table = markdown(results)
    (out / "bench.md").write_text(table)
    plot(results, out / "bench.png")
    print(table)
    print(f"written: {out / 'bench.json'}, {out / 'bench.md'}, {out / 'bench.png'}")


if __name__ == "__main__":
    main()
