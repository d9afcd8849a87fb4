"""The suite's PNG: the cost of one log() call, and logger ingest, per candidate."""

from __future__ import annotations

import pathlib
from typing import Any


def plot(results: dict[str, Any], path: pathlib.Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    cost = results["log_cost"]
    names = [k.split("/")[0] for k in cost if k.endswith("/3")]

    # What training pays per call: all_gather is a wait (wall time); a Queue's feeder thread
    # pickles after put() returns, so only its mean (drained at the end) counts that work.
    def paid(name: str) -> float:
        r = cost[f"{name}/3"]
        if name.startswith("allgather"):
            return float(r["wall_median_us"])
        return float(r["cpu_mean_us"] if name == "queue" else r["cpu_median_us"])

    values = [paid(n) for n in names]
    bars = left.barh(names, values, color=["tab:green"] + ["tab:gray"] * (len(names) - 1))
    left.set_xscale("log")
    left.set_xlabel("microseconds per log() of 3 scalars (log scale; Queue: mean incl. feeder)")
    left.set_title("What one log() costs the training process")
    left.bar_label(bars, labels=[f"{v:.1f}" for v in values], padding=3)
    left.invert_yaxis()

    ingest = results["ingest"]
    keys = [k for k in ingest if k.startswith("funnel/")]
    labels = [k.split("/")[1] for k in keys]
    funnel = [ingest[k]["records_per_s"] / 1000 for k in keys]
    queue = [
        ingest.get(k.replace("funnel/", "queue/"), {}).get("records_per_s", 0) / 1000 for k in keys
    ]
    x = range(len(keys))
    right.bar([i - 0.2 for i in x], funnel, width=0.4, label="wandb-funnel", color="tab:green")
    right.bar(
        [i + 0.2 for i in x], queue, width=0.4, label="multiprocessing.Queue", color="tab:gray"
    )
    right.set_xticks(
        list(x), [f"{lab}\nproducers" if "ranks" not in lab else lab for lab in labels]
    )
    right.set_ylabel("thousand records/s")
    right.set_title("Logger ingest (records ordered and merged into rows)")
    right.legend()
    m = results["machine"]
    fig.suptitle(f"wandb-funnel benchmarks, {m['date']}, {m['cpus']} CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
