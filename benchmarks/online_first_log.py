"""Time to the first logged step, online and healthy: plain wandb against the funnel, the
same user script (``benchmarks/online_job.py``) as it is and under ``wandb-funnel run --``,
alternating, against OpenWandb on 127.0.0.1 through the (healthy) fault proxy (issue 25).

    python benchmarks/online_first_log.py [--repeats 5] [--out FILE]

Per run: from the process's start to its first ``log()`` returning (``first_log_s``), and to
the first history row on the server (``first_row_on_server_s``, polled every 20 ms). Figures
are compared only within one invocation (the machine is shared): medians, side by side.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

from _common import HERE

REPO = HERE.parent
sys.path.insert(0, str(REPO))

from online_faults import VARIANTS, _kill_tree, _reports, write_results  # noqa: E402

from tests.online.fault_proxy import FaultProxy  # noqa: E402
from tests.online.openwandb import OpenWandb  # noqa: E402
from wandb_funnel.soak.jobenv import clean_environment  # noqa: E402


def one(server: OpenWandb, proxy: FaultProxy, variant: str) -> dict[str, Any]:
    project = f"first-log-{variant}-{uuid.uuid4().hex[:6]}"
    scratch = pathlib.Path(tempfile.mkdtemp(prefix=f"first-log-{variant}-"))
    env = clean_environment(
        scratch,
        scratch,
        drop=("WANDB_",),
        extra={**server.env(proxy.url), "WANDB_PROJECT": project, "JOB_ROWS": "5"},
    )
    started = time.time()
    proc = subprocess.Popen(
        VARIANTS[variant], cwd=scratch, env=env, stdout=subprocess.PIPE, text=True
    )
    first_row = None
    while proc.poll() is None and time.time() - started < 120:
        ids = server.run_ids(project)
        if ids and server.run(project, ids[0]).history:
            first_row = time.time() - started
            break
        time.sleep(0.02)
    stdout, _ = proc.communicate(timeout=120)
    _kill_tree(proc.pid)
    seen = _reports(stdout)
    return {
        "variant": variant,
        "exit": proc.returncode,
        "first_log_s": seen["first_log_at"] - started if "first_log_at" in seen else None,
        "first_row_on_server_s": first_row,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(HERE / "results" / "online_first_log.json"))
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    data = pathlib.Path(tempfile.mkdtemp(prefix="openwandb-first-log-"))
    with OpenWandb(data / "data") as server, FaultProxy(server.port) as proxy:
        for _ in range(args.repeats):
            for variant in VARIANTS:  # alternating: drift on the box hits both alike
                runs.append(one(server, proxy, variant))
                print(json.dumps(runs[-1]), flush=True)
    summary: dict[str, Any] = {}
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant and r["first_log_s"] is not None]
        rows = [r["first_row_on_server_s"] for r in mine if r["first_row_on_server_s"]]
        summary[variant] = {
            "first_log_s_median": statistics.median(r["first_log_s"] for r in mine),
            "first_row_on_server_s_median": statistics.median(rows) if rows else None,
            "runs": len(mine),
        }
    print("| | plain wandb | the funnel (`wandb-funnel run --`) |")
    print("|---|---|---|")
    for key, label in (
        ("first_log_s_median", "process start to the first `log()` returned (median)"),
        ("first_row_on_server_s_median", "process start to the first row on the server (median)"),
    ):
        cells = [f"{summary[v][key]:.2f} s" if summary[v][key] else "-" for v in VARIANTS]
        print(f"| {label} | {cells[0]} | {cells[1]} |")
    write_results(args.out, {"summary": summary, "runs": runs})


if __name__ == "__main__":
    main()
