"""Read back the wandb run each measured job wrote (measure.py keeps every job's directory):
how many runs, their exit record, their history rows and the user's keys, per mode.

    python docs/hang/readback.py [RUNS_DIR]     (default /tmp/hang/runs)
"""

from __future__ import annotations

import collections
import pathlib
import sys

from wandb_funnel.soak.runfile import find_runs


def main() -> None:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/hang/runs")
    per_mode: dict[str, list[tuple]] = collections.defaultdict(list)
    for job in sorted(root.iterdir()):
        mode = job.name.rsplit("-", 1)[0]
        runs = find_runs(job)  # $job/wandb/offline-run-*
        for run in runs or [None]:
            if run is None:
                per_mode[mode].append((0, None, 0, ()))
                continue
            keys = tuple(sorted({k for row in run.history for k in row
                                 if not k.startswith(("_", "funnel/")) and k != "global_step"}))
            per_mode[mode].append((len(runs), run.exit_code, len(run.history), keys))
    print("| mode | jobs | one run each | exit code 0 | history rows per run | user keys |")
    print("|---|---|---|---|---|---|")
    for mode, rows in per_mode.items():
        counts = collections.Counter(r[2] for r in rows)
        keys = collections.Counter(r[3] for r in rows)
        print(f"| {mode} | {len(rows)} | {sum(r[0] == 1 for r in rows)} | {sum(r[1] == 0 for r in rows)} | "
              f"{dict(counts)} | {'; '.join(', '.join(k) for k in keys)} |")


if __name__ == "__main__":
    main()
