"""The ``wandb-funnel`` command. ``wandb-funnel soak --help`` runs the soak harness."""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import pathlib
import shutil
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait


def _soak(args: argparse.Namespace) -> int:
    from wandb_funnel.soak import report, scenarios
    from wandb_funnel.soak.harness import Iteration, run_iteration

    chosen = scenarios.select(args.scenario)
    missing = [s for s in chosen if any(importlib.util.find_spec(m) is None for m in s.needs)]
    for s in missing:
        print(f"not run: {s.name} needs {', '.join(s.needs)}", file=sys.stderr)
    chosen = [s for s in chosen if s not in missing]
    out = pathlib.Path(args.out)
    runs_dir = out / "iterations"
    seed = args.seed or datetime.datetime.now().strftime("%Y%m%d%H%M%S")
    started, t0 = datetime.datetime.now(datetime.timezone.utc), time.monotonic()
    stop_at = t0 + args.minutes * 60 if args.minutes else None
    counts = dict.fromkeys((s.name for s in chosen), 0)
    plain_counts = dict.fromkeys((s.name for s in chosen if s.plain), 0)
    done: list[Iteration] = []
    lock = threading.Lock()
    stopping = threading.Event()

    def stop(signum: int, frame: object) -> None:
        # First Ctrl-C or SIGTERM: no new iterations; the running ones finish and the table
        # is written. A second Ctrl-C interrupts as usual.
        if stopping.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stopping.set()
        print("stopping: finishing the running iterations, then writing the table",
              file=sys.stderr, flush=True)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)

    def next_job() -> tuple[scenarios.Scenario, int, bool] | None:
        with lock:
            if stopping.is_set():
                return None
            # The plain-wandb programs first: they are few, and some of them hang.
            for s in sorted((s for s in chosen if s.plain), key=lambda s: plain_counts[s.name]):
                if plain_counts[s.name] < args.plain:
                    plain_counts[s.name] += 1
                    return s, plain_counts[s.name], True
            if stop_at is not None and time.monotonic() >= stop_at:
                return None
            pending = [s for s in chosen if args.minutes or counts[s.name] < args.iterations]
            if not pending:
                return None
            s = min(pending, key=lambda s: counts[s.name])
            counts[s.name] += 1
            return s, counts[s.name], False

    def work(job: tuple[scenarios.Scenario, int, bool]) -> Iteration:
        scenario, index, plain = job
        it = run_iteration(scenario, index, runs_dir, f"{seed}-{scenario.name}-{index}", plain)
        status = "ok" if it.ok else "FAILED: " + "; ".join(it.problems)
        kind = " (plain wandb)" if plain else ""
        print(f"{scenario.name}{kind} #{index}: exit {it.owner_exit}, "
              f"{it.exit_s}s, sent {it.sent} logged {it.logged} dropped {it.dropped} "
              f"{status}", flush=True)
        if it.ok and not args.keep:
            shutil.rmtree(it.directory, ignore_errors=True)
        return it

    with ThreadPoolExecutor(args.jobs) as pool:
        running: set[Future[Iteration]] = set()
        while True:
            while len(running) < args.jobs and (job := next_job()) is not None:
                running.add(pool.submit(work, job))
            if not running:
                break
            finished, running = wait(running, return_when=FIRST_COMPLETED)
            done.extend(f.result() for f in finished)

    rows = report.summarize(sorted(done, key=lambda i: (i.scenario, i.plain, i.index)))
    header = {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "duration_min": round((time.monotonic() - t0) / 60, 1),
        "stopped_early": stopping.is_set(),
        "iterations": sum(1 for i in done if not i.plain),
        "plain_iterations": sum(1 for i in done if i.plain),
        "jobs": args.jobs,
        "seed": seed,
        "machine": report.machine(),
        "command": "wandb-funnel soak " + " ".join(sys.argv[2:]),
    }
    report.write(out, rows, header, done)
    print()
    print(report.text(rows))
    failed = sum(row["failed"] for row in rows)
    print(f"\n{header['iterations']} iterations, {failed} failed; "
          f"table in {out / 'soak.md'} and {out / 'soak.json'}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wandb-funnel")
    sub = parser.add_subparsers(dest="command", required=True)
    soak = sub.add_parser(
        "soak", help="run the fault matrix and report hangs, exit times and record accounting",
    )
    soak.add_argument("--iterations", type=int, default=3, help="per scenario (default 3)")
    soak.add_argument("--minutes", type=float, default=0,
                      help="run round-robin for this long instead of a fixed count")
    soak.add_argument("--scenario", action="append",
                      help="a scenario name or glob; repeat to pick several (default: all)")
    soak.add_argument("--plain", type=int, default=1,
                      help="runs of each public report's plain-wandb program (default 1)")
    soak.add_argument("--jobs", type=int, default=1, help="iterations run at once")
    soak.add_argument("--out", default="soak-results", help="directory for the table")
    soak.add_argument("--seed", default="", help="replay an earlier soak's randomness")
    soak.add_argument("--keep", action="store_true", help="keep passing iterations' files")
    soak.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = parser.parse_args(argv)
    if args.command == "soak":
        # A shell starting us in the background (nohup cmd &) ignores SIGINT, and an ignored
        # signal is inherited through exec: the programs would then shrug off the Ctrl-C
        # scenario. A handler of ours is reset to the default at exec instead.
        if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if args.list:
            from wandb_funnel.soak.scenarios import SCENARIOS

            for s in SCENARIOS:
                print(f"{s.name:24} {s.summary}")
            return 0
        if args.iterations < 1 or args.jobs < 1 or args.minutes < 0 or args.plain < 0:
            parser.error("--iterations and --jobs must be >= 1; --minutes, --plain >= 0")
        return _soak(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
