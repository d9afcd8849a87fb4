"""A short script's wall time, plain wandb against the funnel, side by side (issue 34, item 7).

    python benchmarks/startup.py [--repeat 5] [--before PATH]

Two scripts, each run as a user runs it (offline, a fresh ``WANDB_DIR`` each time), plain
(``python script.py``) and through the funnel (``wandb-funnel run -- python script.py``):

- ``three-logs``: ``wandb.init``, three ``log`` calls, ``finish``: the funnel's fixed cost.
- ``cross-validation``: wandb's sweeps cross-validation example, 5 folds: 5
  ``multiprocessing.Process`` children started before the parent's ``wandb.init``, each
  with a run of its own, one after the other. (``run.notes = ...`` is in a ``try``: a tree
  from before issue 34 crashed there, and its children then waited for ever.)

Reports the median wall time of each (process start to exit), and the funnel's against
plain's (``+s`` for ``three-logs``, a ratio for ``cross-validation``). ``--before PATH`` adds
a column for another source tree of wandb-funnel (a checkout's ``src``), run the same way in
the same session: the before and after figures of a change, measured side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

THREE_LOGS = """
import wandb
run = wandb.init(project="startup")
for i in range(3):
    run.log({"loss": 1.0 / (i + 1)})
run.finish()
"""

# wandb's examples/wandb-sweeps/sweeps-cross-validation, as published (5 folds), with the
# model taken out: each fold logs three values.
CROSS_VALIDATION = """
import multiprocessing as mp
import wandb

def train(sweep_q, worker_q):
    data = worker_q.get()
    run = wandb.init(group=data["sweep_id"], job_type=data["sweep_run_name"],
                     name=f"{data['sweep_run_name']}-{data['num']}", config=data["config"])
    for step in range(3):
        run.log({"val_accuracy": 0.5 + step / 10})
    run.finish()
    sweep_q.put({"val_accuracy": 0.7})

def main():
    folds = 5
    sweep_q = mp.Queue()
    workers = []
    for _ in range(folds):
        q = mp.Queue()
        p = mp.Process(target=train, kwargs={"sweep_q": sweep_q, "worker_q": q})
        p.start()
        workers.append((q, p))
    sweep_run = wandb.init(project="cross-validation")
    sweep_id = sweep_run.sweep_id or "unknown"
    try:
        sweep_run.notes = "sweep " + sweep_id
    except AttributeError:  # --before a tree whose Run has no setter (issue 34): it crashed
        pass
    name = sweep_run.name or sweep_run.id
    sweep_run.finish()
    metrics = []
    for num, (q, p) in enumerate(workers):
        q.put({"sweep_id": sweep_id, "num": num, "sweep_run_name": name,
               "config": dict(sweep_run.config)})
        metrics.append(sweep_q.get(timeout=120))
        p.join()
    sweep_run = wandb.init(id=sweep_run.id, resume="must")
    sweep_run.log({"val_accuracy": sum(m["val_accuracy"] for m in metrics) / len(metrics)})
    sweep_run.finish()

if __name__ == "__main__":
    main()
"""

SCRIPTS = {"three-logs": THREE_LOGS, "cross-validation": CROSS_VALIDATION}


def _once(argv: list[str], env: dict[str, str], workdir: pathlib.Path) -> float:
    workdir.mkdir(parents=True)
    start = time.perf_counter()
    proc = subprocess.run(
        argv, check=False, env=env, cwd=workdir, capture_output=True, text=True, timeout=300
    )
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each (median)")
    parser.add_argument("--before", help="another wandb-funnel source tree (its src/)")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "_WANDB"))}
    base.update(WANDB_MODE="offline", WANDB_SILENT="true")
    variants: dict[str, tuple[list[str], dict[str, str]]] = {
        "plain": ([], base),
        "funnel": ([sys.executable, "-m", "wandb_funnel", "run", "--"], base),
    }
    if args.before:
        tree = str(pathlib.Path(args.before).resolve())
        before_env = {**base, "PYTHONPATH": tree}
        variants["before"] = ([sys.executable, "-m", "wandb_funnel", "run", "--"], before_env)
    figures: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="wf-startup-") as tmp:
        root = pathlib.Path(tmp)
        for name, text in SCRIPTS.items():
            script = root / f"{name}.py"
            script.write_text(text)
            times: dict[str, list[float]] = {v: [] for v in variants}
            for i in range(args.repeat):
                for variant, (prefix, env) in variants.items():  # interleaved: same load
                    argv = [*prefix, sys.executable, str(script)]
                    times[variant].append(_once(argv, env, root / f"{name}-{variant}-{i}"))
            figures[name] = {v: statistics.median(t) for v, t in times.items()}
    print(f"{'script':18} " + " ".join(f"{v:>8}" for v in variants) + "   funnel vs plain")
    for name, row in figures.items():
        plain, funnel = row["plain"], row["funnel"]
        versus = f"+{funnel - plain:.2f} s" if name == "three-logs" else f"{funnel / plain:.2f}x"
        if "before" in row:
            was = row["before"]
            versus += (
                f" (before: +{was - plain:.2f} s)"
                if name == "three-logs"
                else f" (before: {was / plain:.2f}x)"
            )
        print(f"{name:18} " + " ".join(f"{row[v]:7.2f}s" for v in variants) + f"   {versus}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
