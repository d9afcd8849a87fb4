"""Requests to the W&B server, online: N ranks logging through the funnel's one client, against
one run per rank, against wandb's shared mode (issue 25 item 4).

    python benchmarks/online_requests.py [--ranks 4 16 64] [--keys 10] [--rate 5] [--seconds 60]
                                         [--modes funnel per-rank shared] [--out FILE]

Each case runs in a fresh interpreter against one OpenWandb server on 127.0.0.1 (the test
harness's, ``tests/online/openwandb.py``: installed into ``.venv-openwandb`` on first use),
through a fault proxy kept healthy (``tests/online/fault_proxy.py``), which counts every
request by kind (``graphql``, ``filestream``, ``upload``, ``other``) and every byte. N
spawned ranks each log K keys (``m0``..``m{K-1}``, the same names on every rank) at S steps
per second for D seconds, with ``step=`` the step, all starting together (a barrier):

- ``funnel``: ``wf.Funnel(mode="online")`` in the parent; each rank ``wf.init()`` and logs.
  The logger merges a step's records into one row and reduces the keys across ranks (mean:
  the default ``run_mode="auto"``): one run, one wandb-core, one filestream.
- ``per-rank``: each rank ``wandb.init(group=...)``: N runs, N wandb-cores, N filestreams.
- ``shared``: wandb's shared mode: rank 0 ``wandb.init(id=ID, mode="shared")`` with
  ``x_primary=True``, the others the same id, ``x_primary=False``,
  ``x_update_finish_state=False``, each its ``x_label``: one run, N wandb-cores.

Reported per case: requests and bytes per minute over the logging window (the first log to
the last, every rank: the steady state, wandb-core's initial fast transmits included), the
totals over the whole job, the time from the last log to every run finished and every
process gone (``finish_s``; ``finish_returned_s``: to the last ``finish()`` returned), the
start (``Funnel.start``, or the slowest rank's ``wandb.init``), and the history lines that
reached the server against those expected. A case that fails says so, with its error, and
the others go on. wandb-core's defaults throughout (a filestream transmit every 15 s per
writer once ramped up): nothing is tuned.

Writes JSON (``--out``, default ``benchmarks/results/online_requests.json``) and prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import pathlib
import platform
import sys
import tempfile
import time
import traceback
import uuid
from typing import Any

from _common import HERE, report, run_child

REPO = HERE.parent
MODES = ("funnel", "per-rank", "shared")


# ---- the ranks (spawned children of the case's process) --------------------------------------
def _pace(rank: int, keys: int, rate: float, seconds: float, log: Any) -> tuple[float, float]:
    """Log ``rate * seconds`` steps on a fixed schedule; (first log's start, last log's end)."""
    steps = max(1, round(rate * seconds))
    start = time.monotonic()
    first = last = start
    for step in range(steps):
        delay = start + step / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        t = time.monotonic()
        if step == 0:
            first = t
        log({f"m{k}": rank + step * 1e-3 + k for k in range(keys)}, step)
        last = time.monotonic()
    return first, last


def _rank_funnel(
    rank: int, keys: int, rate: float, seconds: float, barrier: Any, results: Any
) -> None:
    try:
        import wandb_funnel as wf

        t0 = time.monotonic()
        run = wf.init()
        init_s = time.monotonic() - t0
        barrier.wait(600)
        first, last = _pace(rank, keys, rate, seconds, lambda d, s: run.log(d, step=s))
        run.finish()
        results.put({"rank": rank, "init_s": init_s, "first": first, "last": last})
    except BaseException:
        results.put({"rank": rank, "error": traceback.format_exc()[-2000:]})
        barrier.abort()


def _rank_plain(
    rank: int,
    keys: int,
    rate: float,
    seconds: float,
    barrier: Any,
    results: Any,
    mode: str,
    run_id: str,
    group: str,
    primary_ready: Any,
) -> None:
    try:
        import wandb

        if mode == "shared":
            if rank != 0:
                primary_ready.wait(300)  # wandb's rule: the primary process first
            settings = wandb.Settings(
                mode="shared",
                x_label=f"rank{rank}",
                x_primary=rank == 0,
                x_update_finish_state=rank == 0,
            )
            t0 = time.monotonic()
            run = wandb.init(id=run_id, settings=settings)
        else:
            t0 = time.monotonic()
            run = wandb.init(group=group, name=f"rank{rank}", job_type="bench")
        init_s = time.monotonic() - t0
        if rank == 0:
            primary_ready.set()
        barrier.wait(600)
        first, last = _pace(rank, keys, rate, seconds, lambda d, s: run.log(d, step=s))
        run.finish()
        results.put(
            {
                "rank": rank,
                "init_s": init_s,
                "first": first,
                "last": last,
                "finished": time.monotonic(),
                "run_id": run.id,
            }
        )
    except BaseException:
        results.put({"rank": rank, "error": traceback.format_exc()[-2000:]})
        primary_ready.set()
        barrier.abort()


# ---- one case, in a fresh interpreter ----------------------------------------------------------
def case(mode: str, ranks: int, keys: int, rate: float, seconds: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(ranks + 1)
    results = ctx.Queue()
    out: dict[str, Any] = {"mode": mode, "ranks": ranks}
    t0 = time.monotonic()
    funnel = None
    if mode == "funnel":
        import wandb_funnel as wf

        funnel = wf.Funnel(mode="online", group="bench", job_type="bench")
        funnel.start()
        out["start_s"] = time.monotonic() - t0
        out["run_id"] = funnel.run_id
        procs = [
            ctx.Process(target=_rank_funnel, args=(r, keys, rate, seconds, barrier, results))
            for r in range(ranks)
        ]
    else:
        run_id = uuid.uuid4().hex[:8]
        ready = ctx.Event()
        group = f"bench-{uuid.uuid4().hex[:6]}"
        procs = [
            ctx.Process(
                target=_rank_plain,
                args=(r, keys, rate, seconds, barrier, results, mode, run_id, group, ready),
            )
            for r in range(ranks)
        ]
    for p in procs:
        p.start()
    try:
        barrier.wait(600)
    except Exception:  # a rank failed before the start (and aborted the barrier)
        pass
    got = [results.get(timeout=seconds + 900) for _ in procs]
    for p in procs:
        p.join(300)
    if funnel is not None:
        funnel.close()
        stats = funnel.stats or {}
        out["funnel_stats"] = {k: v for k, v in stats.items() if isinstance(v, int | float)}
    gone = time.monotonic()
    errors = [g["error"] for g in got if "error" in g]
    if errors:
        out["error"] = errors[0]
        out["failed_ranks"] = len(errors)
    ok = [g for g in got if "error" not in g]
    if ok:
        last = max(g["last"] for g in ok)
        out["first_log"] = min(g["first"] for g in ok)
        out["last_log"] = last
        out["finish_s"] = gone - last
        out["init_s_max"] = max(g["init_s"] for g in ok)
        if mode != "funnel":
            out["start_s"] = out["init_s_max"]
            # the last rank's finish() returned (finish_s adds the processes' exit)
            out["finish_returned_s"] = max(g["finished"] for g in ok) - last
            out["run_ids"] = sorted({g["run_id"] for g in ok})
    out["exit_codes"] = [p.exitcode for p in procs]
    out["job_s"] = gone - t0
    return out


# ---- the driver --------------------------------------------------------------------------------
def measure(
    server: Any, mode: str, ranks: int, keys: int, rate: float, seconds: float, scratch: Any
) -> dict[str, Any]:
    from tests.online.fault_proxy import FaultProxy

    project = f"bench-{mode}-{ranks}-{uuid.uuid4().hex[:6]}"
    with FaultProxy(server.port) as proxy:
        args = ["--case", mode, "--ranks", str(ranks), "--keys", str(keys)]
        args += ["--rate", str(rate), "--seconds", str(seconds)]
        env = {**server.env(proxy.url), "WANDB_PROJECT": project}
        figures: dict[str, Any]
        try:
            figures = run_child(
                "online_requests.py",
                args,
                scratch / f"{mode}-{ranks}",
                timeout=seconds + 1200,
                **env,
            )
        except Exception as exc:
            figures = {"mode": mode, "ranks": ranks, "error": str(exc)[-3000:]}
        records = proxy.records()
        totals = proxy.stats()
    figures["project"] = project
    figures["proxy"] = totals
    if "first_log" in figures:
        lo, hi = figures["first_log"], figures["last_log"]
        window = [r for r in records if lo <= r.started <= hi]
        minutes = max(hi - lo, 1e-9) / 60
        figures["window_s"] = hi - lo
        per_min: dict[str, float] = {
            kind: sum(1 for r in window if r.kind == kind) / minutes
            for kind in ("graphql", "filestream", "upload", "other")
        }
        per_min["all"] = len(window) / minutes
        figures["requests_per_min"] = per_min
        figures["bytes_up_per_min"] = sum(r.bytes_up for r in window) / minutes
        figures["bytes_down_per_min"] = sum(r.bytes_down for r in window) / minutes
    runs = server.runs(project)
    figures["runs_on_server"] = len(runs)
    figures["history_lines_on_server"] = sum(len(r.history) for r in runs)
    figures["states_on_server"] = sorted({r.state for r in runs})
    steps = max(1, round(rate * seconds))
    figures["history_lines_expected"] = {
        "funnel": steps,
        "per-rank": steps * ranks,
        "shared": steps * ranks,
    }[mode]
    return figures


def markdown(results: dict[str, Any]) -> str:
    header = [
        "ranks",
        "mode",
        "runs",
        "rows on server / expected",
        "graphql/min",
        "filestream/min",
        "upload+other/min",
        "all/min",
        "KB up/min",
        "KB down/min",
        "requests (total)",
        "MB up (total)",
        "start s",
        "finish s",
        "error",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for c in results["cases"]:
        pm = c.get("requests_per_min") or {}
        proxy = c.get("proxy") or {}

        def f(v: Any, digits: int = 1) -> str:
            return "-" if v is None else f"{v:.{digits}f}"

        error = (c.get("error") or "").strip().splitlines()
        row = [
            str(c["ranks"]),
            c["mode"],
            str(c.get("runs_on_server", "-")),
            f"{c.get('history_lines_on_server', '-')} / {c.get('history_lines_expected', '-')}",
            f(pm.get("graphql")),
            f(pm.get("filestream")),
            f(None if not pm else pm["upload"] + pm["other"]),
            f(pm.get("all")),
            f(None if "bytes_up_per_min" not in c else c["bytes_up_per_min"] / 1e3),
            f(None if "bytes_down_per_min" not in c else c["bytes_down_per_min"] / 1e3),
            str(proxy.get("requests", "-")),
            f(None if "bytes_up" not in proxy else proxy["bytes_up"] / 1e6, 2),
            f(c.get("start_s"), 2),
            f(c.get("finish_s"), 2),
            (error[-1][:80] if error else ""),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def driver(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO))
    from tests.online.openwandb import OpenWandb

    results: dict[str, Any] = {
        "machine": {
            "date": datetime.date.today().isoformat(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_at_start": os.getloadavg()[0],
        },
        "params": {
            "ranks": args.ranks,
            "keys": args.keys,
            "rate": args.rate,
            "seconds": args.seconds,
            "modes": args.modes,
        },
        "cases": [],
    }
    out = pathlib.Path(args.out)
    with tempfile.TemporaryDirectory(prefix="online-bench-") as tmp:
        scratch = pathlib.Path(tmp)
        with OpenWandb(scratch / "openwandb") as server:
            for ranks in args.ranks:
                for mode in args.modes:
                    print(f"-- {mode}, {ranks} ranks", flush=True)
                    figures = measure(
                        server, mode, ranks, args.keys, args.rate, args.seconds, scratch
                    )
                    brief = {k: figures.get(k) for k in ("requests_per_min", "finish_s", "error")}
                    print(f"   {json.dumps(brief)[:600]}", flush=True)
                    results["cases"].append(figures)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps(results, indent=1))  # as it goes
    table = markdown(results)
    print(table)
    print(f"written: {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--rate", type=float, default=5.0, help="steps per second per rank")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--out", default=str(HERE / "results" / "online_requests.json"))
    parser.add_argument("--case", choices=MODES, help=argparse.SUPPRESS)  # a child's case
    args = parser.parse_args()
    if args.case:
        report(**case(args.case, args.ranks[0], args.keys, args.rate, args.seconds))
    else:
        driver(args)


if __name__ == "__main__":
    main()
