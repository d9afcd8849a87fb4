"""Read back the wandb run each measured job wrote (measure.py keeps every job's directory):
how many runs, their exit record, their history rows and the user's keys, per mode. Each
job's reading is kept in CACHE (JSON lines), so a later call reads only the new jobs.

    python docs/history/hang/readback.py CACHE.jsonl [RUNS_DIR] [--skip JOB ...]
"""

from __future__ import annotations

import collections
import json
import pathlib
import sys

from wandb_funnel.soak.runfile import find_runs


def read_job(job: pathlib.Path) -> dict:
    runs = find_runs(job)  # $job/wandb/offline-run-*/run-*.wandb
    return {
        "job": job.name,
        "mode": job.name.rsplit("-", 1)[0],
        "runs": len(runs),
        "exit_codes": [r.exit_code for r in runs],
        "rows": [len(r.history) for r in runs],
        "keys": sorted({k for r in runs for row in r.history for k in row
                        if not k.startswith(("_", "funnel/")) and k != "global_step"}),
    }


def main() -> None:
    args = sys.argv[1:]
    skip = set(args[args.index("--skip") + 1:]) if "--skip" in args else set()
    args = args[: args.index("--skip")] if "--skip" in args else args
    cache = pathlib.Path(args[0])
    root = pathlib.Path(args[1] if len(args) > 1 else "/tmp/hang/runs")
    done = {json.loads(line)["job"]: json.loads(line) for line in cache.open()} if cache.exists() else {}
    for job in sorted(root.iterdir()):
        if job.name not in done and job.name not in skip:
            done[job.name] = read_job(job)
            with cache.open("a") as f:
                f.write(json.dumps(done[job.name]) + "\n")
    per_mode: dict[str, list[dict]] = collections.defaultdict(list)
    for rec in done.values():
        per_mode[rec["mode"]].append(rec)
    print("| mode | jobs | jobs with one run | runs with exit code 0 | history rows per run | user keys |")
    print("|---|---|---|---|---|---|")
    for mode in ("plain", "run", "install"):
        recs = per_mode.get(mode, [])
        rows = collections.Counter(n for r in recs for n in r["rows"])
        keys = collections.Counter(", ".join(r["keys"]) for r in recs)
        print(f"| {mode} | {len(recs)} | {sum(r['runs'] == 1 for r in recs)} | "
              f"{sum(c == 0 for r in recs for c in r['exit_codes'])} | "
              f"{', '.join(f'{n} rows: {c}' for n, c in sorted(rows.items()))} | "
              f"{'; '.join(f'{k} ({c} jobs)' for k, c in keys.items())} |")


if __name__ == "__main__":
    main()
