"""What a W&B server that stalls, refuses or restarts costs a job: plain wandb against the
funnel, side by side, the same user script (``benchmarks/online_job.py``: 20 rows 0.2 s
apart, then ``finish``) run as it is and under ``wandb-funnel run --`` (issue 25).

    python benchmarks/online_faults.py [--faults NAME ...] [--cap SECONDS] [--out FILE]

One OpenWandb server on 127.0.0.1 (the test harness's, ``tests/online/openwandb.py``), our
fault proxy in front of it (``tests/online/fault_proxy.py``), a fresh proxy and directory per
case. Per case: the job's exit code (``killed`` past ``--cap``), its wall time, the rows on
the server when it ended, the rows in its local transaction log, what it said (its last
line that names the trouble), then the upload command run once the server answers again
(``wandb sync --include-online DIR``: the funnel prints it; plain wandb users would run the
same) and the rows on the server after it. Writes JSON (default
``benchmarks/results/online_faults.json``) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from _common import HERE

REPO = HERE.parent
sys.path.insert(0, str(REPO))

from tests.online.fault_proxy import FaultProxy  # noqa: E402
from tests.online.openwandb import OpenWandb  # noqa: E402
from wandb_funnel.soak.jobenv import clean_environment  # noqa: E402
from wandb_funnel.soak.runfile import read_run  # noqa: E402

ROWS = 20
JOB = str(HERE / "online_job.py")
VARIANTS: dict[str, list[str]] = {
    "plain": [sys.executable, JOB],
    "funnel": [sys.executable, "-m", "wandb_funnel", "run", "--", sys.executable, JOB],
}
# What a job says about the trouble: its lines that carry one of these.
TELLING = ("did not answer", "Safe on this disk", "CommError", "Error", "wandb sync", "timed out")


class Case:
    """One fault: ``before`` the job starts, ``during`` it (on a timer), ``hold`` (stall the
    server once every row is logged, before finish), ``base_url`` (point elsewhere)."""

    def __init__(
        self,
        name: str,
        what: str,
        before: Callable[[FaultProxy, OpenWandb], None] | None = None,
        during: Callable[[FaultProxy, OpenWandb], None] | None = None,
        at: float = 1.5,
        hold: bool = False,
        base_url: str | None = None,
    ) -> None:
        self.name, self.what = name, what
        self.before, self.during, self.at = before, during, at
        self.hold, self.base_url = hold, base_url


def _heal_later(seconds: float, proxy: FaultProxy) -> None:
    threading.Timer(seconds, proxy.healthy).start()


CASES = [
    Case("healthy", "nothing goes wrong"),
    Case(
        "stalled-at-end",
        "the server stops answering (SIGSTOP) after the last row, before finish",
        hold=True,
    ),
    Case(
        "nothing-listens",
        "nothing listens at WANDB_BASE_URL (connection refused)",
        base_url="http://127.0.0.1:9",
    ),
    Case(
        "restarted",
        "the server is killed mid-training and back 4 s later",
        during=lambda proxy, server: server.restart(down_for=4.0),
    ),
    Case(
        "black-hole-10s",
        "the filestream is a black hole for 10 s mid-training",
        during=lambda proxy, server: (proxy.black_hole(only="filestream"), _heal_later(10, proxy)),
    ),
    Case(
        "http-429",
        "the filestream answers 429 (Retry-After: 2) three times",
        before=lambda proxy, server: proxy.status(
            429, {"Retry-After": "2"}, only="filestream", times=3
        ),
    ),
    Case(
        "http-500",
        "the filestream answers 500 three times",
        before=lambda proxy, server: proxy.status(500, only="filestream", times=3),
    ),
    Case(
        "reset",
        "the filestream's connection is reset three times",
        before=lambda proxy, server: proxy.reset(only="filestream", times=3),
    ),
    Case(
        "slow-3s",
        "every filestream request is held 3 s",
        before=lambda proxy, server: proxy.delay(3.0, only="filestream"),
    ),
]


def _kill_tree(pid: int) -> None:
    """The job and every process it started (wandb-core runs in a session of its own)."""
    import psutil

    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in procs:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)


def _reports(stdout: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for line in stdout.splitlines():
        if line.startswith("REPORT "):
            out.update(json.loads(line[len("REPORT ") :]))
    return out


def _local_rows(wandb_dir: pathlib.Path, run_id: str) -> tuple[int | None, pathlib.Path | None]:
    logs = sorted((wandb_dir / "wandb").glob(f"*-{run_id}/run-{run_id}.wandb"))
    if not logs:
        return None, None
    rows = sum(len(read_run(log).history) for log in logs)
    return rows, logs[-1].parent


def run_case(server: OpenWandb, case: Case, variant: str, cap: float) -> dict[str, Any]:
    project = f"faults-{case.name}-{variant}-{uuid.uuid4().hex[:6]}"
    scratch = pathlib.Path(tempfile.mkdtemp(prefix=f"faults-{variant}-"))
    out: dict[str, Any] = {"case": case.name, "variant": variant}
    with FaultProxy(server.port) as proxy:
        if case.before:
            case.before(proxy, server)
        env = clean_environment(
            scratch,
            scratch,
            drop=("WANDB_",),
            extra={**server.env(case.base_url or proxy.url), "WANDB_PROJECT": project},
        )
        hold = scratch / "hold"
        if case.hold:
            env["JOB_HOLD"] = str(hold)
        t0 = time.monotonic()
        proc = subprocess.Popen(
            VARIANTS[variant],
            cwd=scratch,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        timer = None
        if case.during:
            timer = threading.Timer(case.at, case.during, args=(proxy, server))
            timer.start()
        paused = False
        if case.hold:
            while not pathlib.Path(f"{hold}.ready").exists() and proc.poll() is None:
                if time.monotonic() - t0 > cap:
                    break
                time.sleep(0.05)
            server.pause()
            paused = True
            hold.touch()
        try:
            stdout, stderr = proc.communicate(timeout=max(1.0, cap - (time.monotonic() - t0)))
            out["exit"] = proc.returncode
        except subprocess.TimeoutExpired:
            _kill_tree(proc.pid)
            stdout, stderr = proc.communicate(timeout=30)
            out["exit"] = f"killed at {cap:.0f} s"
        _kill_tree(proc.pid)  # whatever it left (a plain wandb-core whose job was killed)
        out["wall_s"] = round(time.monotonic() - t0, 1)
        if timer is not None:
            timer.join(60)
        if paused:
            server.resume()
        proxy.healthy()
        if not server.answers(timeout=10):
            server.restart()
        seen = _reports(stdout)
        run_id = seen.get("run_id")
        out["run_id"] = run_id
        out["init_s"] = seen.get("init_s")
        telling = [line.strip() for line in stderr.splitlines() if any(t in line for t in TELLING)]
        out["said"] = telling[-3:]
        if run_id is None:
            out["server_rows"] = out["local_rows"] = None
            return out
        out["server_rows"] = _server_rows(server, project, run_id)
        out["local_rows"], run_dir = _local_rows(scratch, run_id)
        if run_dir is not None and out["server_rows"] != ROWS:
            sync = [str(pathlib.Path(sys.executable).with_name("wandb")), "sync"]
            sync += ["--include-online", str(run_dir)]
            # Once the server answers again, at its own address (not a dead one the case used).
            sync_env = {**env, **server.env(proxy.url)}
            done = subprocess.run(
                sync,
                cwd=scratch,
                env=sync_env,
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
            out["sync_exit"] = done.returncode
            out["server_rows_after_sync"] = _server_rows(server, project, run_id)
    return out


def _server_rows(server: OpenWandb, project: str, run_id: str) -> int:
    try:
        return len(server.run(project, run_id).history)
    except LookupError:
        return 0


def markdown(results: list[dict[str, Any]]) -> str:
    by = {(r["case"], r["variant"]): r for r in results}

    def cell(r: dict[str, Any] | None) -> str:
        if r is None:
            return "-"
        if r.get("run_id") is None:
            return f"exit {r['exit']} in {r['wall_s']} s; no run"
        rows = r.get("server_rows")
        after = r.get("server_rows_after_sync")
        synced = f"; after `wandb sync`: {after}/{ROWS}" if after is not None else ""
        return f"exit {r['exit']} in {r['wall_s']} s; server {rows}/{ROWS}{synced}"

    lines = ["| fault | plain wandb | the funnel (`wandb-funnel run --`, same script) |"]
    lines.append("|---|---|---|")
    for case in CASES:
        if (case.name, "plain") in by or (case.name, "funnel") in by:
            plain, funnel = by.get((case.name, "plain")), by.get((case.name, "funnel"))
            lines.append(f"| {case.what} | {cell(plain)} | {cell(funnel)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", nargs="*", default=[c.name for c in CASES])
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS))
    parser.add_argument("--cap", type=float, default=150.0, help="seconds before a job is killed")
    parser.add_argument("--out", default=str(HERE / "results" / "online_faults.json"))
    args = parser.parse_args()
    unknown = set(args.faults) - {c.name for c in CASES}
    if unknown:
        parser.error(f"unknown faults: {sorted(unknown)}")
    results: list[dict[str, Any]] = []
    data = pathlib.Path(tempfile.mkdtemp(prefix="openwandb-faults-"))
    with OpenWandb(data / "data") as server:
        for case in CASES:
            if case.name not in args.faults:
                continue
            for variant in args.variants:
                result = run_case(server, case, variant, args.cap)
                results.append(result)
                print(json.dumps(result), flush=True)
    table = markdown(results)
    print(table)
    write_results(args.out, {"rows": ROWS, "results": results, "table": table})


def write_results(path: str, data: dict[str, Any]) -> None:
    """``data`` as JSON at ``path``, stamped with when it was measured."""
    when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(path).write_text(json.dumps({"when": when, **data}, indent=1))


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
