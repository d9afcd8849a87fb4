"""Issue 23 item 5: how often does a 2-rank torchrun of timm_like_train.py hang at exit, with
plain wandb, under `wandb-funnel run --`, and with install() as the script's first line?

Runs one job at a time (modes interleaved: plain, run, install, plain, ...), each in a fresh
directory with WANDB_MODE=offline. Each job gets LIMIT seconds; if any process is still alive
then, it is a hang: every live process of the job gets `py-spy dump --native`, then the job's
process group and every descendant are SIGKILLed, and nothing may survive (checked). Each
run's record (exit code, seconds, hung, which ranks were alive, when each rank left main()
and when its process ended, the stacks) is appended as one JSON line to OUT.

    python docs/history/hang/measure.py OUT.jsonl [--n 30] [--limit 120] [--modes plain,run,install] [--extra '-j 4']
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import psutil

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = HERE / "timm_like_train.py"
WORK = pathlib.Path(os.environ.get("HANG_WORK", "/tmp/hang"))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]


def command(mode: str, data: pathlib.Path, extra: list[str]) -> list[str]:
    script = SCRIPT
    if mode == "install":  # install() as the first line of an otherwise unchanged script
        script = WORK / "timm_like_train_install.py"
        script.write_text("import wandb_funnel; wandb_funnel.install()\n" + SCRIPT.read_text())
    argv = [*TORCHRUN, str(script), str(data), "--log-wandb", *extra]
    if mode == "run":
        argv = [sys.executable, "-m", "wandb_funnel", "run", "--", *argv]
    return argv


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def in_dir(cwd: pathlib.Path) -> list[psutil.Process]:
    """Processes of this job that left its tree (a daemonised wandb-core, say): by their cwd."""
    out = []
    for p in psutil.process_iter(["cwd"]):
        try:
            if p.info["cwd"] and pathlib.Path(p.info["cwd"]).is_relative_to(cwd):
                out.append(p)
        except (psutil.Error, ValueError):
            pass
    return out


def describe(p: psutil.Process) -> dict:
    try:
        env = p.environ()
        return {"pid": p.pid, "rank": env.get("RANK"), "cmd": " ".join(p.cmdline())[:200]}
    except psutil.Error:
        return {"pid": p.pid, "rank": None, "cmd": "?"}


def one(mode: str, i: int, data: pathlib.Path, limit: float, extra: list[str]) -> dict:
    cwd = WORK / "runs" / f"{mode}-{i}"
    shutil.rmtree(cwd, ignore_errors=True)
    cwd.mkdir(parents=True)
    env = dict(os.environ, WANDB_MODE="offline", PYTHONUNBUFFERED="1")
    argv = command(mode, data, extra)
    t0 = time.time()
    with open(cwd / "stdout", "w") as out, open(cwd / "stderr", "w") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True)
    ranks: dict[str, psutil.Process] = {}  # RANK -> its process
    rank_end: dict[str, float] = {}
    while proc.poll() is None and time.time() - t0 < limit:
        for p in descendants(proc.pid):
            d = describe(p)
            if d["rank"] is not None and d["rank"] not in ranks and "timm_like_train" in d["cmd"]:
                ranks[d["rank"]] = p
        for r, p in ranks.items():
            if r not in rank_end and not p.is_running():
                rank_end[r] = time.time()
        time.sleep(0.1)
    for r, p in ranks.items():  # the job ended between two polls
        if r not in rank_end and not p.is_running():
            rank_end[r] = time.time()
    hung = proc.poll() is None
    stuck, stacks = [], {}
    if hung:
        live = {p.pid: p for p in [*descendants(proc.pid), *in_dir(cwd)]}
        live.setdefault(proc.pid, psutil.Process(proc.pid))
        for p in live.values():
            d = describe(p)
            stuck.append(d)
            dump = subprocess.run(["py-spy", "dump", "--native", "--pid", str(p.pid)], capture_output=True,
                                  text=True, timeout=60, check=False)
            stacks[str(p.pid)] = (dump.stdout + dump.stderr)[-8000:]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        for p in live.values():
            try:
                p.kill()
            except psutil.Error:
                pass
        proc.wait(30)
    seconds = time.time() - t0
    # nothing of the job may survive it
    time.sleep(0.5)
    survivors = [describe(p) for p in in_dir(cwd)]
    for p in in_dir(cwd):
        p.kill()
    stdout, stderr = (cwd / "stdout").read_text(errors="replace"), (cwd / "stderr").read_text(errors="replace")
    returned = {m[0]: float(m[1]) for m in re.findall(r"HANG-PROBE rank=(\d+) main-returned t=([\d.]+)", stdout)}
    record = {
        "mode": mode, "i": i, "limit": limit, "rc": proc.returncode, "seconds": round(seconds, 2), "hung": hung,
        "stuck": stuck, "stuck_ranks": sorted({d["rank"] for d in stuck if d["rank"] is not None}),
        "main_returned": {r: round(t - t0, 3) for r, t in returned.items()},
        "process_ended": {r: round(t - t0, 3) for r, t in rank_end.items()},
        "terminate_called": stderr.count("terminate called"),
        "torchrun_failures": re.findall(r"exitcode\s*:\s*(-?\d+)", stderr),
        "survivors": survivors, "stacks": stacks,
        "stderr_tail": stderr[-1500:] if (hung or proc.returncode) else "",
    }
    shutil.rmtree(cwd / "output", ignore_errors=True)  # checkpoints: the run dir keeps logs and wandb
    return record


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--n", type=int, default=30)
    ap.add_argument("--limit", type=float, default=120)
    ap.add_argument("--modes", default="plain,run,install")
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--extra", default="", help="more arguments for the script, one string")
    a = ap.parse_args()
    data = WORK / "data"
    if not data.exists():
        subprocess.run([sys.executable, str(SCRIPT), str(data), "--make-data"], check=True)
    for i in range(a.start, a.start + a.n):
        for mode in a.modes.split(","):
            rec = one(mode, i, data, a.limit, shlex.split(a.extra))
            with open(a.out, "a") as f:
                f.write(json.dumps(rec) + "\n")
            print(f"{mode:8} {i:3} rc={rec['rc']} {rec['seconds']:6.1f}s hung={rec['hung']} "
                  f"stuck={rec['stuck_ranks']} terminate={rec['terminate_called']} "
                  f"returned={rec['main_returned']} ended={rec['process_ended']}", flush=True)


if __name__ == "__main__":
    main()
